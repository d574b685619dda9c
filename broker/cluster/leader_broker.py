"""The broker a cluster's leader runs: the ordinary process tree
(broker/supervisor), started by the node's agent (node.py) with its
settings as JSON and SHOAL_REPLICA_SOCKET in its environment."""

from __future__ import annotations

import logging
import sys

import msgspec

from shoal.broker.config import Config


def main(argv: list[str]) -> int:
    from shoal.broker.supervisor.supervisor import die_with_parent, run_supervisor

    die_with_parent()  # a kill -9 of the agent takes the supervisor too, and so its children
    config = msgspec.json.decode(argv[0].encode(), type=Config)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    return run_supervisor(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
