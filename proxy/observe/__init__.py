"""Observability: structured logging and Prometheus metrics (proxy layer)."""
