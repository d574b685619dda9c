"""The `shoal` command: run the broker (default), `status`, `ctl`, `policy`, or `perf`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from shoal.broker import settings
from shoal.broker.config import Config, default_workers, parse_auth_mechanisms


def _version() -> str:
    """The installed distribution's version (a checkout's editable install too)."""
    from importlib import metadata

    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _broker_parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(prog="shoal", description="Shoal AMQP 0-9-1 broker")
    p.add_argument("--version", action="version", version=f"shoal {_version()}")
    p.add_argument(
        "--bind",
        action="append",
        default=None,
        help="address to listen on, repeatable (default :: , every IPv4 and IPv6 address)",
    )
    p.add_argument("--port", type=int, default=d.port, help="AMQP port (default %(default)s)")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help=f"IO worker processes (default: one per CPU, here {default_workers()})",
    )
    p.add_argument(
        "--max-workers",
        type=int,
        default=0,
        help="the most IO workers SIGTTIN or `shoal ctl set_worker_count` may reach at "
        "runtime (default: twice --workers); each may hold an arena of --arena-mb",
    )
    p.add_argument(
        "--runtime-dir",
        default="",
        help="directory for the shared-memory segment (default: $RUNTIME_DIRECTORY, "
        "else /dev/shm/shoal-<port>)",
    )
    p.add_argument(
        "--data-dir",
        default="",
        help="directory for what outlives the broker, locked by one broker at a time "
        "(default: $STATE_DIRECTORY, else $XDG_DATA_HOME/shoal/<port>, "
        "~/.local/share/shoal/<port> without XDG_DATA_HOME)",
    )
    p.add_argument(
        "--graceful-timeout",
        type=float,
        default=d.graceful_timeout,
        help="seconds SIGTERM waits for clients to close (default %(default)s)",
    )
    p.add_argument(
        "--consumer-timeout",
        type=int,
        default=d.consumer_timeout,
        help="ms a consumer may hold a delivery unacknowledged before it is cancelled and "
        "its deliveries requeued; queues and consumers may set x-consumer-timeout "
        "(0: no limit; default %(default)s, 30 min)",
    )
    p.add_argument("--max-queues", type=int, default=d.max_queues, help="default %(default)s")
    p.add_argument(
        "--queue-capacity",
        type=int,
        default=d.queue_capacity,
        help="entries one queue can hold, a power of two (default %(default)s)",
    )
    p.add_argument(
        "--arena-mb",
        type=int,
        default=d.arena_mb,
        help="shared memory for message bodies per IO worker, MiB (default %(default)s)",
    )
    p.add_argument(
        "--catalog-mb",
        type=int,
        default=d.catalog_mb,
        help="shared memory for exchange and binding definitions, MiB (default %(default)s)",
    )
    p.add_argument("--frame-max", type=int, default=d.frame_max, help="default %(default)s")
    p.add_argument(
        "--heartbeat", type=int, default=d.heartbeat, help="seconds (default %(default)s)"
    )
    p.add_argument(
        "--max-message-size",
        type=int,
        default=d.max_message_size,
        help="bytes (default %(default)s)",
    )
    p.add_argument(
        "--memory-high-watermark",
        type=float,
        default=d.memory_high_watermark,
        help="share of RAM message bodies may take before publishers are blocked, 0: no "
        "RAM limit (default %(default)s, as RabbitMQ's vm_memory_high_watermark)",
    )
    p.add_argument(
        "--arena-high-watermark",
        type=float,
        default=d.arena_high_watermark,
        help="share of an IO worker's arena (--arena-mb) at which publishers are blocked "
        "(default %(default)s)",
    )
    p.add_argument(
        "--memory-low-watermark",
        type=float,
        default=d.memory_low_watermark,
        help="publishers resume once every arena is at this share of its high watermark "
        "(default %(default)s)",
    )
    p.add_argument(
        "--disk-free-limit",
        type=int,
        default=d.disk_free_limit,
        help="bytes the data directory's and the runtime directory's file systems must keep "
        "free, else publishers are blocked (default: 50 MB as RabbitMQ's disk_free_limit, or "
        "a tenth of the smaller file system if less)",
    )
    p.add_argument(
        "--default-capacity",
        type=int,
        default=d.default_capacity,
        help="x-capacity, bytes, of queues declared without one (default %(default)s: none)",
    )
    p.add_argument(
        "--default-flow-resume-capacity",
        type=int,
        default=d.default_flow_resume_capacity,
        help="x-flow-resume-capacity, bytes, of queues declared without one (default: 80%% of "
        "the capacity)",
    )
    p.add_argument(
        "--handshake-timeout",
        type=float,
        default=d.handshake_timeout,
        help="s from accept to connection.open, TLS included (default %(default)s)",
    )
    p.add_argument(
        "--max-handshaking",
        type=int,
        default=d.max_handshaking,
        help="connections per IO worker still in their handshake; more are closed at once "
        "(default %(default)s)",
    )
    p.add_argument(
        "--no-plain-listener",
        dest="plain_listener",
        action="store_false",
        help="no plain AMQP listener: AMQPS (--tls-port) only",
    )
    p.add_argument(
        "--tls-port",
        type=int,
        default=d.tls_port,
        help="AMQPS port (5671 by convention; default: none)",
    )
    p.add_argument(
        "--mqtt-port",
        type=int,
        default=d.mqtt_port,
        help="MQTT 3.1.1 and 5.0 port (default %(default)s; 0: off)",
    )
    p.add_argument(
        "--mqtts-port",
        type=int,
        default=d.mqtts_port,
        help="MQTT over TLS port (default %(default)s, opened only with --tls-cert; 0: off)",
    )
    p.add_argument(
        "--mqtt-ws-port",
        type=int,
        default=d.mqtt_ws_port,
        help="MQTT over WebSocket port, path /ws, as RabbitMQ's web-mqtt "
        "(default %(default)s; 0: off)",
    )
    p.add_argument(
        "--mqtt-prefetch",
        type=int,
        default=d.mqtt_prefetch,
        help="QoS 1 and 2 deliveries in flight per MQTT subscription, 1 to 65535 "
        "(default %(default)s; a 5.0 client's receive maximum bounds it too)",
    )
    p.add_argument(
        "--mqtt-receive-maximum",
        type=int,
        default=d.mqtt_receive_maximum,
        help="QoS 2 PUBLISHes an MQTT client may have unreleased, 1 to 65535, "
        "the Receive Maximum of a 5.0 CONNACK (default %(default)s)",
    )
    p.add_argument(
        "--mqtt-max-keep-alive",
        type=int,
        default=d.mqtt_max_keep_alive,
        help="the longest keep alive in seconds an MQTT client may ask, 0 to 65535: "
        "a 5.0 client asking more or none gets it as Server Keep Alive, a 3.1.1 one "
        "is refused, as mosquitto's max_keepalive (default %(default)s: no maximum)",
    )
    p.add_argument(
        "--mqtt-colocate",
        action=argparse.BooleanOptionalAction,
        default=d.mqtt_colocate,
        help="move a slow MQTT publisher's connection to the IO worker of the one "
        "consumer its topic reaches: less CPU, a little more latency (default: on; "
        "docs/mqtt.md)",
    )
    p.add_argument("--tls-cert", default=d.tls_cert, help="PEM certificate chain of the server")
    p.add_argument("--tls-key", default=d.tls_key, help="PEM private key (default: in --tls-cert)")
    p.add_argument(
        "--tls-ca",
        default=d.tls_ca,
        help="PEM CA certificates: clients may present a certificate signed by one (SASL EXTERNAL)",
    )
    p.add_argument(
        "--tls-fail-if-no-peer-cert",
        action="store_true",
        help="refuse TLS clients that present no certificate",
    )
    p.add_argument(
        "--default-user",
        default=d.default_user,
        help="the administrator made at the first start of a data directory (default guest)",
    )
    p.add_argument("--default-pass", default=d.default_pass)
    p.add_argument(
        "--loopback-users",
        type=lambda text: tuple(u for u in text.split(",") if u),
        default=d.loopback_users,
        help="users who may log in from this machine only, comma-separated (RabbitMQ's "
        "loopback_users; default guest; '' lets them in from anywhere)",
    )
    p.add_argument(
        "--auth-mechanisms",
        type=parse_auth_mechanisms,
        default=d.auth_mechanisms,
        help="SASL mechanisms offered, comma-separated (RabbitMQ's auth_mechanisms; default "
        "PLAIN,AMQPLAIN; add EXTERNAL for logins by TLS client certificate, whose CN is the "
        "user, also for MQTT clients that give no user name)",
    )
    p.add_argument(
        "--log-level", default=d.log_level, choices=["debug", "info", "warning", "error"]
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=d.metrics_port,
        help="Prometheus endpoint, /metrics (default %(default)s; 0: off)",
    )
    p.add_argument("--metrics-bind", default=d.metrics_bind, help="default: --bind")
    p.add_argument(
        "--management-port",
        type=int,
        default=d.management_port,
        help="the HTTP management API, RabbitMQ's (default %(default)s; 0: off)",
    )
    p.add_argument("--management-bind", default=d.management_bind, help="default: --bind")
    p.add_argument(
        "--shovels",
        action=argparse.BooleanOptionalAction,
        default=d.shovels,
        help="run the dynamic shovels set as parameters (default: on)",
    )
    p.add_argument(
        "--collect-statistics-interval",
        type=int,
        default=d.collect_statistics_interval,
        metavar="MS",
        help="how often the management API samples message rates (default %(default)s ms)",
    )
    p.add_argument(
        "--node-name",
        default=d.node_name,
        help="the node's name in the management API, the metrics and the firehose, as "
        "RabbitMQ's RABBITMQ_NODENAME (default shoal@<hostname>)",
    )
    p.add_argument(
        "--cluster-name",
        default=d.cluster_name,
        help="rabbitmq_cluster label of the metrics (default shoal@<hostname>); with "
        "--cluster-etcd, also the cluster's name in etcd",
    )
    cluster = p.add_argument_group("cluster (docs/cluster.md; without --cluster-etcd: standalone)")
    cluster.add_argument(
        "--cluster-etcd",
        type=lambda s: tuple(u.strip() for u in s.split(",") if u.strip()),
        default=d.cluster_etcd,
        metavar="URL[,URL]",
        help="etcd client URLs: run as a node of a replicated cluster",
    )
    cluster.add_argument(
        "--cluster-port",
        type=int,
        default=d.cluster_port,
        help="the replication listener (default %(default)s)",
    )
    cluster.add_argument(
        "--cluster-advertise",
        default=d.cluster_advertise,
        metavar="HOST:PORT",
        help="where other nodes reach this one's replication listener "
        "(default <hostname>:--cluster-port); its host is also the AMQP address "
        "followers proxy clients to",
    )
    cluster.add_argument(
        "--cluster-lease-ttl",
        type=int,
        default=d.cluster_lease_ttl,
        metavar="S",
        help="the leader's etcd lease: how long a dead leader keeps the cluster "
        "waiting (default %(default)s s)",
    )
    cluster.add_argument(
        "--cluster-min-isr",
        type=int,
        default=d.cluster_min_isr,
        metavar="N",
        help="in-sync followers a confirm waits for at least (default 1)",
    )
    cluster.add_argument(
        "--cluster-max-lag",
        type=float,
        default=d.cluster_max_lag,
        metavar="S",
        help="a follower that has not acknowledged a write this long leaves the "
        "in-sync set (default %(default)s s)",
    )
    p.add_argument(
        "--load-definitions",
        default=d.load_definitions,
        metavar="FILE",
        help="a definitions file in RabbitMQ's format (users, vhosts, permissions, "
        "policies, queues...) imported at start and again at SIGHUP when it changed",
    )
    p.add_argument(
        "--config",
        default="",
        metavar="FILE",
        help='settings by flag name in TOML (log-level = "debug"); flags win over it; '
        "SIGHUP reads it again (docs/access.md)",
    )
    return p


def local_command(
    port: int,
    workers: int,
    runtime_dir: str,
    *extra: str,
    data_dir: str = "",
    bind: str | None = "127.0.0.1",
) -> list[str]:
    """The command line that starts a broker on 127.0.0.1 for tests,
    benchmarks and the interop runner (one place, so they agree). The data
    directory is `data_dir`, by default `data` inside the runtime directory:
    a harness that removes its temporary runtime directory removes both, and
    nothing is written under the user's home. `bind` None: the broker's
    default address (every IPv4 and IPv6 address). `extra` comes last, so
    that it overrides what is set here (argparse keeps the last value)."""
    return [
        sys.executable,
        "-m",
        "shoal.broker",
        *(("--bind", bind) if bind is not None else ()),
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--runtime-dir",
        runtime_dir,
        "--data-dir",
        data_dir or os.path.join(runtime_dir, "data"),
        # No metrics endpoint unless asked for: 15692 may be taken (by another
        # test's broker, or a RabbitMQ started for comparison).
        "--metrics-port",
        "0",
        "--management-port",
        "0",
        "--no-shovels",  # a test that wants them says --shovels
        # Nor MQTT listeners (on by default: 1883, 8883, 15675), which many
        # brokers started at once would fight over; a test passes its own.
        *("--mqtt-port", "0", "--mqtts-port", "0", "--mqtt-ws-port", "0"),
        *extra,
    ]


def config_from_args(argv: list[str]) -> Config:
    parser = _broker_parser()
    ns = parser.parse_args(argv)
    # Which settings the command line gave (they win over the file): the
    # same parse with no defaults at all.
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given = frozenset(vars(parser.parse_args(argv))) - {"config"}
    flags = {k: v for k, v in vars(ns).items() if k != "config"}
    if flags["bind"] is None:
        flags["bind"] = Config().bind
    try:
        return settings.resolve(flags, given, ns.config)
    except settings.SettingsError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "perf":
        from shoal.perf.cli import main as perf_main

        return perf_main(args[1:])
    if args and args[0] == "status":
        p = argparse.ArgumentParser(prog="shoal status")
        p.add_argument("--port", type=int, default=5672)
        p.add_argument("--runtime-dir", default="")
        p.add_argument("--json", action="store_true")
        p.add_argument(
            "--consumers",
            action="store_true",
            help="per queue, its consumers: scheduler state, priority, pointer, credit, unacked",
        )
        ns = p.parse_args(args[1:])
        from shoal.broker.operate import status

        cfg = Config(port=ns.port, runtime_dir=ns.runtime_dir)
        if ns.consumers:
            return status.consumers_main(cfg.runtime_path(), ns.json)
        return status.main(cfg.runtime_path(), ns.json)
    if args and args[0] == "ctl":
        from shoal.broker.operate import ctl

        return ctl.main(args[1:])
    if args and args[0] == "cluster-init":
        from shoal.broker.cluster import init

        return init.main(args[1:])
    if args and args[0] == "policy":
        from shoal.broker.operate import policy

        return policy.main(args[1:])
    if args and args[0] == "run":
        args = args[1:]
    config = config_from_args(args)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    from shoal.broker.supervisor.open_files import raise_open_files_limit

    raise_open_files_limit()  # (every process of the broker inherits it)
    if config.cluster_etcd:
        from shoal.broker.cluster.node import run_node

        return run_node(config)
    from shoal.broker.supervisor.supervisor import run_supervisor

    return run_supervisor(config)
