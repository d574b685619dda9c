"""The node's name, as the management API, the metrics, the firehose and
connection.start show it: RabbitMQ's `rabbit@<host>` is `shoal@<host>` here,
or what `--node-name` says (RabbitMQ's RABBITMQ_NODENAME: monitoring checks
that ask for /api/nodes/rabbit@<host> can be given that name).

The supervisor puts a configured name in the environment before it starts
its children, so every process of the broker answers alike without being
handed its configuration.
"""

from __future__ import annotations

import os
import socket

ENVIRONMENT = "SHOAL_NODE_NAME"


def node_name() -> str:
    return os.environ.get(ENVIRONMENT) or f"shoal@{socket.gethostname()}"


def adopt(configured: str) -> None:
    """The supervisor's configured name (""): for its children too."""
    if configured:
        os.environ[ENVIRONMENT] = configured
    else:
        os.environ.pop(ENVIRONMENT, None)
