"""Broker settings: one typed struct, shared by the CLI and every process."""

from __future__ import annotations

import os

import msgspec


def default_workers() -> int:
    """One IO worker per CPU, at least 1; see docs/benchmarks.md for why."""
    return max(1, len(os.sched_getaffinity(0)))


# The SASL mechanisms Shoal knows (auth_mechanisms names some of them).
KNOWN_AUTH_MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")


def parse_auth_mechanisms(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`PLAIN,AMQPLAIN,EXTERNAL` (or a list of names) as auth_mechanisms;
    ValueError for an unknown name or none at all."""
    names = text.split(",") if isinstance(text, str) else list(text)
    mechanisms = tuple(dict.fromkeys(n.strip().upper() for n in names if n.strip()))
    unknown = [n for n in mechanisms if n not in KNOWN_AUTH_MECHANISMS]
    if unknown or not mechanisms:
        raise ValueError(
            f"auth mechanisms {', '.join(unknown) or '(none)'}: "
            f"choose from {', '.join(KNOWN_AUTH_MECHANISMS)}"
        )
    return mechanisms


class Config(msgspec.Struct, frozen=True):
    # Addresses to listen on; "::" is every address, IPv4 and IPv6 (one
    # dual-stack socket, as RabbitMQ listens): broker/listeners.py.
    bind: tuple[str, ...] = ("::",)
    port: int = 5672
    plain_listener: bool = True  # False: AMQPS only (--port still names the runtime dir)
    tls_port: int = 0  # the AMQPS listener (5671 by convention); 0: none
    # MQTT (docs/mqtt.md), on by default as RabbitMQ's plugins listen once
    # enabled; 0: none. MQTT over TLS listens only where a certificate is
    # (mqtts_listening), as AMQPS needs one.
    mqtt_port: int = 1883
    mqtts_port: int = 8883  # with the --tls-* certificates
    mqtt_ws_port: int = 15675  # MQTT over WebSocket, path /ws (RabbitMQ's web-mqtt)
    # QoS 1 and 2 deliveries in flight per subscription queue (RabbitMQ's
    # mqtt.prefetch, mosquitto's max_inflight_messages): enough to keep a
    # fast subscriber's link full; a 5.0 client bounds it with its receive maximum.
    mqtt_prefetch: int = 1000
    # 5.0's Receive Maximum in CONNACK: the QoS 2 PUBLISHes a client may have
    # unreleased (workers/mqtt_inbound.py); mosquitto's max_inflight_messages
    # is 20, an operator who wants its bound sets that.
    mqtt_receive_maximum: int = 4096
    # The longest keep alive a client may ask (mosquitto's max_keepalive),
    # so that a dead client is found within 1.5x it: a 5.0 client asking
    # more, or none (0), gets this one as CONNACK's Server Keep Alive; a
    # 3.1.1 client, which cannot be told, is refused (identifier rejected,
    # as mosquitto). 0: no maximum, every client's own stands (RabbitMQ).
    mqtt_max_keep_alive: int = 0
    # A slow publisher's connection moves to the IO worker of the one
    # consumer its topic reaches (workers/mqtt_move.py): one process's
    # wake-up a message instead of two, ~30 % less CPU in fan-in, for a
    # p50 latency some 0.05 ms higher (docs/mqtt.md); --no-mqtt-colocate
    # keeps every connection where the acceptor put it.
    mqtt_colocate: bool = True
    tls_cert: str = ""  # PEM: the server's certificate chain
    tls_key: str = ""  # PEM: its private key ("": in tls_cert)
    tls_ca: str = ""  # PEM: CAs that client certificates are verified against ("": none asked)
    tls_fail_if_no_peer_cert: bool = False  # refuse TLS clients without a certificate
    workers: int = 0  # 0: default_workers()
    max_workers: int = 0  # the runtime ceiling (broker/supervisor/scaling.py); 0: twice workers
    runtime_dir: str = ""  # "": $RUNTIME_DIRECTORY or /dev/shm/shoal-<port>
    data_dir: str = ""  # "": $STATE_DIRECTORY or $XDG_DATA_HOME/shoal/<port> (data_path)
    graceful_timeout: float = 10.0
    # RabbitMQ has none: a fleet of MQTT clients holds a queue per subscribing session.
    # Slots cost memory only once used (H_QUEUES_USED, shm/layout.py): ~1 KiB each.
    max_queues: int = 65536
    queue_capacity: int = 1 << 18
    arena_mb: int = 256
    catalog_mb: int = 16  # exchanges and bindings journal
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    # From accept to connection.open (TLS handshake included), s; a client
    # slower than that is dropped (RabbitMQ's handshake_timeout, 10 s).
    handshake_timeout: float = 10.0
    # Connections not yet past connection.open, per IO worker: more are
    # closed at once (a flood of idle sockets costs each worker little).
    max_handshaking: int = 1000
    # A consumer holding a delivery unacked longer is cancelled (ms; 0: no
    # limit; workers/timeouts.py). RabbitMQ's default, 30 min.
    consumer_timeout: int = 1_800_000
    # RabbitMQ's default since 3.8 (max_message_size, 128 MiB): clients' own
    # suites publish 23 and 32 MB bodies (Bunny's publishing edge cases).
    max_message_size: int = 128 << 20
    # Memory guard (shm/memory.py): publishers are blocked while an arena is
    # above the lower of its two high marks, released at `low` x that mark.
    memory_high_watermark: float = 0.4  # share of RAM for message bodies (all arenas)
    arena_high_watermark: float = 0.9  # share of each IO worker's arena
    memory_low_watermark: float = 0.8  # share of the high mark
    # Bytes the runtime directory's file system keeps free; -1: 50 MB (RabbitMQ's
    # default) or a tenth of that file system, whichever is less (a container's
    # /dev/shm may be 64 MiB in all).
    disk_free_limit: int = -1
    # Producer flow control for queues declared without x-capacity (0: none).
    default_capacity: int = 0
    default_flow_resume_capacity: int = 0  # 0: 80 % of the capacity
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    # Users who may log in from loopback addresses only (RabbitMQ's
    # loopback_users; [] lets guest in from anywhere).
    loopback_users: tuple[str, ...] = ("guest",)
    # The SASL mechanisms connection.start offers (RabbitMQ's auth_mechanisms,
    # whose default is PLAIN and AMQPLAIN): EXTERNAL, a verified TLS client
    # certificate's CN as the user, only where listed (RabbitMQ needs its
    # rabbitmq_auth_mechanism_ssl plugin for it), and then also for MQTT
    # clients that give no user name (RabbitMQ's mqtt.ssl_cert_login).
    auth_mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    log_level: str = "info"
    metrics_port: int = 15692  # Prometheus endpoint (broker/observe/metrics.py); 0: off
    metrics_bind: str = ""  # "": the same address as --bind
    management_port: int = 15672  # the HTTP management API (broker/management); 0: off
    management_bind: str = ""  # "": the same address as --bind
    # ms between the management API's samples for message rates (RabbitMQ's
    # collect_statistics_interval).
    collect_statistics_interval: int = 5000
    # Dynamic shovels (broker/shovel): a process that runs the shovel
    # parameters (RabbitMQ's rabbitmq_shovel plugin, here always built in).
    shovels: bool = True
    cluster_name: str = ""  # rabbitmq_identity_info's rabbitmq_cluster ("": the node name)
    node_name: str = ""  # RabbitMQ's RABBITMQ_NODENAME ("": shoal@<host>; broker/node_name.py)
    # A replicated cluster (broker/cluster, docs/cluster.md); no etcd: standalone.
    cluster_etcd: tuple[str, ...] = ()
    cluster_port: int = 5679  # the replication listener
    cluster_advertise: str = ""  # HOST:PORT of it for the others ("": <hostname>:port)
    cluster_lease_ttl: int = 5  # s: the leader's etcd lease
    cluster_min_isr: int = -1  # in-sync followers a confirm needs (-1: 1)
    cluster_max_lag: float = 2.0  # s without an ack before a follower leaves the ISR
    # A definitions file (RabbitMQ's format: users, vhosts, permissions,
    # policies, queues...) imported at start and, changed, at SIGHUP
    # (RabbitMQ's load_definitions); "": none.
    load_definitions: str = ""
    # The settings file (broker/settings.py, TOML; "": none), and the
    # settings the command line gave, which the file does not override.
    config: str = ""
    cli_flags: tuple[str, ...] = ()

    def mqtts_listening(self) -> bool:
        """MQTT over TLS is on by default, but only with a certificate to serve."""
        return bool(self.mqtts_port and self.tls_cert)

    def serves_tls(self) -> bool:
        """Whether some listener needs the server's TLS context."""
        return bool(self.tls_port or self.mqtts_listening())

    def worker_count(self) -> int:
        return self.workers or default_workers()

    def max_worker_count(self) -> int:
        """Worker slots in shared memory: every count reachable at runtime
        (shm/layout.py allows 4,094)."""
        return min(4094, max(self.max_workers or 2 * self.worker_count(), self.worker_count()))

    def runtime_path(self) -> str:
        if self.runtime_dir:
            return self.runtime_dir
        systemd_dir = os.environ.get("RUNTIME_DIRECTORY")
        if systemd_dir:
            return systemd_dir.split(":")[0]
        return self.default_runtime_path()

    def data_path(self) -> str:
        """Where what must outlive the broker is kept: --data-dir; else
        systemd's StateDirectory= ($STATE_DIRECTORY); else one directory per
        port under $XDG_DATA_HOME (~/.local/share), which `make run` finds
        again at its next start."""
        if self.data_dir:
            return self.data_dir
        systemd_dir = os.environ.get("STATE_DIRECTORY")
        if systemd_dir:
            return systemd_dir.split(":")[0]
        base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
        return os.path.join(base, "shoal", str(self.port))

    def default_runtime_path(self) -> str:
        """Without --runtime-dir or systemd's: a directory Shoal makes and
        removes, left behind only by a broker killed with SIGKILL."""
        return f"/dev/shm/shoal-{self.port}"
