"""specsweep: benchmark LLM serving configurations and find where speculative decoding stops paying.

The core package holds everything that does not need Prefect: hosts, server profiles and
presets, the server lifecycle, the load generator, metrics, storage and comparison.
Prefect tasks (``tasks/``) and flows (``flows/``) are thin layers over it.
"""

__version__ = "0.1.0"
