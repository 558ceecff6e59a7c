"""Prefect deployments of the specsweep flows (prefect.yaml, serve.py) and their pull step."""
