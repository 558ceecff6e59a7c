"""The measuring instrument: workloads, a streaming load generator, per-request records.

Data flows one way: ``workload`` (prompts) → ``runner`` (one level of load, through
``client``, which streams one request) → ``records`` → ``specsweep.metrics`` (pure
functions) → ``specsweep.results.store`` (Parquet).
"""
