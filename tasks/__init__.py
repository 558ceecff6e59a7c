"""Prefect tasks: thin wrappers over the core that add retries, timeouts, logs and artifacts."""
