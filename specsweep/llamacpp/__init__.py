"""A real local target: llama.cpp serving tiny generated models on the CPU.

``models``: writes a llama-architecture target model and a draft model (GGUF) whose
greedy predictions mostly agree, so draft speculation behaves as it does on real models.
``launcher``: ``llama-server``'s flags over the ``xllamacpp`` wheel, for machines without
the binary. ``presets``: baseline and draft-speculation profiles.
"""

from specsweep.llamacpp.presets import baseline_profile, speculative_profile

__all__ = ["baseline_profile", "speculative_profile"]
