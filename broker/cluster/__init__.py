"""Replication and leader election across nodes (issue 29)."""
