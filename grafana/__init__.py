"""Shoal's Grafana dashboards: build.py generates them, queries.py reads their PromQL."""
