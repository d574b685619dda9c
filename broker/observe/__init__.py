"""Observability: the Prometheus endpoint (metrics, building its families in
scrape, families and exporter) and `shoal status`, all read from the
shared-memory segment."""
