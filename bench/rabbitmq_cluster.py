"""A private RabbitMQ cluster on this machine, for side-by-side runs against
a Shoal cluster (bench/cluster.py --rabbitmq): `size` nodes started as
bench/compare.py starts one (private ports, directories and node names,
Debian's rabbitmq-server), the others joined to the first with
`rabbitmqctl join_cluster`. A quorum queue declared on it has a member on
every node (RabbitMQ's default initial group size is the cluster's size,
up to 5): the replicated queue RabbitMQ offers, as Raft over Erlang
distribution. Stopped and removed on exit; epmd is left as it was found.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from compare import _epmd_running, free_port, rabbit_env, start_rabbitmq_node


@contextlib.contextmanager
def rabbitmq_cluster(size: int = 3) -> Iterator[list[str]]:
    """The AMQP URIs of the cluster's nodes, the first the seed."""
    epmd_before = shutil.which("epmd") is not None and _epmd_running()
    nodes: list[tuple[dict[str, str], list[str], Path]] = []
    try:
        for i in range(size):
            port = free_port()
            base = Path(tempfile.mkdtemp(prefix="shoal-bench-rabbit-cluster-"))
            env = rabbit_env(port, base)
            if os.geteuid() == 0:  # Debian's wrapper drops to the rabbitmq user
                for path in (base, base / "enabled_plugins"):
                    with contextlib.suppress(LookupError, OSError):
                        shutil.chown(path, "rabbitmq", "rabbitmq")
            ctl = ["rabbitmqctl", "-n", env["RABBITMQ_NODENAME"]]
            nodes.append((env, ctl, base))
            start_rabbitmq_node(env, ctl, port)
            if i:
                seed = nodes[0][0]["RABBITMQ_NODENAME"]
                for step in (["stop_app"], ["join_cluster", seed], ["start_app"]):
                    subprocess.run(
                        [*ctl, *step], env=env, check=True, capture_output=True, timeout=120
                    )
        seed_env, seed_ctl, _ = nodes[0]
        status = subprocess.run(
            [*seed_ctl, "cluster_status", "--formatter", "json"],
            env=seed_env,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.stdout.count("shoalbench") >= size, status.stdout
        yield [f"amqp://guest:guest@127.0.0.1:{env['RABBITMQ_NODE_PORT']}/" for env, _, _ in nodes]
    finally:
        for env, ctl, base in reversed(nodes):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([*ctl, "stop"], env=env, capture_output=True, timeout=60)
            shutil.rmtree(base, ignore_errors=True)
        if not epmd_before and shutil.which("epmd"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["epmd", "-kill"], capture_output=True, timeout=10)
