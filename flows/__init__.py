"""Prefect flows, one per file."""
