"""The connector's one exception type. Spark shows a Python exception raised
in a data source as a PythonException carrying this message, so each message
names what failed (queue, vhost, URI without its password, offsets)."""

from __future__ import annotations


class ShoalSparkError(Exception):
    """A connector failure with a message meant for the Spark user."""


class DataLossError(ShoalSparkError):
    """Offsets the query needs are no longer in the stream (retention removed
    them); raised when failOnDataLoss is true (the default)."""
