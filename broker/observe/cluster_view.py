"""A cluster node's view of its cluster, as its agent (broker/cluster/node.py)
writes it to its runtime directory: role, leader, the in-sync set and its
followers' lag. Read by `shoal status`, the metrics and the management
API's node; standalone there is none."""

from __future__ import annotations

import json
import os
from typing import Any

STATUS_FILE = "cluster.json"


def cluster_status(runtime_dir: str) -> dict[str, Any] | None:
    """What the node's agent last wrote; None standalone."""
    try:
        with open(os.path.join(runtime_dir, STATUS_FILE)) as f:
            answer: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return answer
