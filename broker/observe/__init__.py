"""Observability: the Prometheus endpoint (metrics) and `shoal status`,
both read from the shared-memory segment."""
