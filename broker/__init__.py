"""Shoal: an AMQP 0-9-1 broker. This package holds the CLI, the configuration,
the control messages between processes, and one sub-package per role."""

# The version clients and Prometheus see (connection.start, shoal_build_info);
# pyproject.toml carries the same.
VERSION = "0.1.0"
