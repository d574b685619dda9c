"""MQTT speed, measured (issue 41): Shoal beside mosquitto 2 and RabbitMQ 3.10's MQTT
plugin, under one load generator, in one run.

All three brokers start once, at the beginning, and run side by side for the whole
benchmark; they are stopped at the end whatever happens (Ctrl-C included). Round r
runs every scenario, and within a scenario the brokers in turning order (round 0:
Shoal, mosquitto, RabbitMQ; round 1: mosquitto, RabbitMQ, Shoal; ...), so that
background noise hits all of them alike. Before each run the script waits for every
broker to be idle (the previous run's 1,000 connections torn down).

Scenarios (MQTT 3.1.1, clean sessions, 64 B payloads that start with the publisher's
CLOCK_MONOTONIC timestamp, so latency is publish -> delivery):

- fan-in: 1,000 device connections, each publishing QoS 1 to `devices/<i>` at 5 msg/s
  (5,000 msg/s in all, spread evenly), at most 100 PUBACKs outstanding per device;
  one MQTT subscriber to `devices/#` at QoS 1 receives them all.
- fan-in-churn: the same, and every 0.5 s a client (a device reconnecting) connects
  with a clean session, subscribes to `churn/<n>` at QoS 1 and leaves: a change of
  the broker's queues and bindings twice a second.
- fan-out-qos0 / fan-out-qos1: one publisher, 1,000 subscribers of one topic. The
  publisher keeps at most 10 messages not yet delivered to every subscriber (10,000
  deliveries in flight) and, at QoS 1, at most 100 PUBACKs outstanding: the brokers'
  delivery rate at a bounded latency, not how much they can buffer.
- 1-1-qos0 / 1-1-qos1: one publisher, one subscriber, as fast as allowed: at most
  1,000 messages published and not yet received, and at QoS 1 at most 100 PUBACKs
  outstanding (the subscriber subscribes at QoS 1 and acks every delivery).

Per run: delivered msg/s (messages received in the measured window / its length),
latency p50/p99 of those, broker CPU seconds (its whole process tree, user + system,
psutil) per 100k delivered, and apart (user / system: the broker's own code against
the kernel's work for it), and the load generator's CPU (% of one core). The load
generator is one process per run: asyncio on uvloop, raw sockets, the MQTT packets
encoded and parsed here; it connects its clients at a bounded concurrency, retrying
what fails, and only then starts the clock (warm-up, then the measured window).

    python bench/mqtt.py                                    # 3 rounds of 10 s, all
    python bench/mqtt.py --rounds 1 --seconds 3 --json /tmp/mqtt.json
    python bench/mqtt.py --brokers shoal,mosquitto --scenarios fan-in,1-1-qos1

A full run (5 scenarios x 3 brokers x 3 rounds of 10 s) takes about 12 minutes.
The Markdown goes to stdout (and --out); progress to stderr; --json keeps every run.

Brokers, each on free ports and removed after:
- Shoal: `local_command` plus `--mqtt-port` and a runtime directory (its shared-memory
  segment) under /dev/shm, as its default is: under /tmp, on a disk, the first write
  to each queue's log is slow, and fan-out's first run after the start stalls seconds.
- mosquitto 2 from Debian (`apt-get install -y mosquitto`), with a config of its own:
  anonymous, no connection limit, TCP_NODELAY (the other two set it), persistence on
  as Debian's config has it (an in-memory store saved at exit or every 30 min: no
  per-message disk write, as none of the three does for clean sessions).
- RabbitMQ 3.10 from Debian with the rabbitmq_mqtt plugin (compare.py's private node
  plus `mqtt.listeners.tcp.default`), started as the rabbitmq user so that it keeps
  this process's open-files limit: Debian's wrapper, run as root, goes through
  `su`, whose pam_limits leaves 1,024, too few for 1,000 clients.
The script raises its own soft open-files limit to the hard one; the brokers inherit it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import multiprocessing
import os
import pwd
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from compare import (  # noqa: E402
    _epmd_running,
    busy_warning,
    free_port,
    host_port,
    load_average,
    machine_info,
    rabbit_env,
    shoal_revision,
    start_rabbitmq_node,
    started_shoal,
    wait_until,
)
from peers import (  # noqa: E402
    gone,
    kill_leftover_rabbit,
    parse_list,
    rabbit_root,
    raise_interrupt,
    server_version,
    shoal_root,
    tree_cpu,
    tree_cpu_times,
)

BROKERS = {"shoal": "Shoal", "mosquitto": "mosquitto", "rabbitmq": "RabbitMQ"}
MQTT_STARTUP_TIMEOUT_S = 60.0
# A broker counts as idle below this share of one core (sampled over IDLE_SAMPLE_S).
IDLE_CPU = 0.15
IDLE_SAMPLE_S = 0.5
# After the window: how long the generator waits for deliveries still on their way.
DRAIN_MAX_S = 5.0
DRAIN_QUIET_S = 0.5
# A publisher with messages outstanding and no progress this long writes them off.
STALL_S = 5.0
CONNECT_TIMEOUT_S = 15.0
CONNECT_TRIES = 8
USER = PASSWORD = "guest"


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str  # "fan-in", "fan-out" or "1-1"
    qos: int
    churn_s: float = 0.0  # fan-in: a client connects, subscribes and leaves this often


SCENARIOS = (
    Scenario(
        "fan-in",
        "1,000 devices x 5 msg/s QoS 1 -> 1 subscriber (devices/#, QoS 1)",
        "fan-in",
        1,
    ),
    Scenario(
        "fan-in-churn",
        "fan-in, and every 0.5 s a client connecting, subscribing (QoS 1) and leaving",
        "fan-in",
        1,
        0.5,
    ),
    Scenario("fan-out-qos0", "1 publisher -> 1,000 subscribers of one topic, QoS 0", "fan-out", 0),
    Scenario("fan-out-qos1", "1 publisher -> 1,000 subscribers of one topic, QoS 1", "fan-out", 1),
    Scenario("1-1-qos0", "1 publisher -> 1 subscriber, QoS 0, as fast as allowed", "1-1", 0),
    Scenario(
        "1-1-qos1",
        "1 publisher -> 1 subscriber, QoS 1 (100 PUBACKs outstanding), as fast as allowed",
        "1-1",
        1,
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}


# --- MQTT 3.1.1 packets (what a client sends; parsing is in Client) ----------------

PIDS = [i.to_bytes(2, "big") for i in range(65536)]
DISCONNECT = b"\xe0\x00"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mqtt_string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def encode_connect(client_id: str, user: str | None, password: str | None) -> bytes:
    """CONNECT, protocol level 4, clean session, keep-alive 0 (off: the runs are short
    and nothing sends PINGREQ)."""
    flags = 0x02
    payload = mqtt_string(client_id)
    if user is not None:
        flags |= 0x80
        payload += mqtt_string(user)
    if password is not None:
        flags |= 0x40
        payload += mqtt_string(password)
    return packet(0x10, mqtt_string("MQTT") + bytes([4, flags, 0, 0]) + payload)


def encode_subscribe(packet_id: int, topic: str, qos: int) -> bytes:
    return packet(0x82, PIDS[packet_id] + mqtt_string(topic) + bytes([qos]))


def publish_parts(topic: str, qos: int, size: int) -> tuple[bytes, bytes]:
    """A PUBLISH is head [+ packet id] + 8-byte timestamp + tail."""
    name = mqtt_string(topic)
    head = bytes([0x30 | qos << 1]) + varint(len(name) + (2 if qos else 0) + size) + name
    return head, b"\x00" * (size - 8)


def mqtt_ready(port: int, timeout: float = 2.0) -> bool:
    """True once the port answers a CONNECT with a CONNACK that accepts it."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(encode_connect(f"probe{os.getpid()}", USER, PASSWORD))
            data = b""
            while len(data) < 4:
                chunk = sock.recv(4 - len(data))
                if not chunk:
                    return False
                data += chunk
            ok = data[0] == 0x20 and data[3] == 0
            if ok:
                sock.sendall(DISCONNECT)
            return ok
    except OSError:
        return False


# --- the load generator (a process of its own per run) ----------------------------


class Sink:
    """Messages received: in all, and in the measured window with their latencies."""

    def __init__(self) -> None:
        self.total = 0
        self.window = 0
        self.t0 = self.t1 = 1 << 62  # ns, CLOCK_MONOTONIC; set at "go"
        self.latency = array("q")
        self.progress: Callable[[], None] | None = None

    def add(self, now: int, stamps: list[int]) -> None:
        self.total += len(stamps)
        if self.t0 <= now < self.t1:
            self.window += len(stamps)
            self.latency.extend([now - s for s in stamps])
        if self.progress is not None:
            self.progress()


class Client(asyncio.Protocol):
    """One MQTT connection: parses what comes, acks QoS 1 deliveries at once (one write
    per read), hands timestamps to its sink and packet ids of PUBACKs to on_acks."""

    def __init__(self, sink: Sink | None = None) -> None:
        self.sink = sink
        self.on_acks: Callable[[list[int], int], None] | None = None
        self.on_writable: Callable[[], None] | None = None
        self.transport: Any = None
        self.buf = b""
        self.waiter: asyncio.Future[int] | None = None
        self.paused = False
        self.lost = False
        self.lost_reason = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.lost_reason = repr(exc) if exc else "closed by the broker"
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(self.lost_reason))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.on_writable is not None:
            self.on_writable()

    def request(self, data: bytes) -> asyncio.Future[int]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        stamps: list[int] = []
        acks: list[bytes] = []
        pubacks: list[int] = []
        while n - pos >= 2:
            b0 = buf[pos]
            length = buf[pos + 1]
            i = pos + 2
            if length & 0x80:
                length &= 0x7F
                shift = 7
                while True:
                    if i >= n:
                        length = -1
                        break
                    b = buf[i]
                    i += 1
                    length |= (b & 0x7F) << shift
                    if not b & 0x80:
                        break
                    shift += 7
                if length < 0:
                    break
            end = i + length
            if end > n:
                break
            kind = b0 >> 4
            if kind == 3:  # PUBLISH
                p = i + 2 + (buf[i] << 8 | buf[i + 1])
                if b0 & 0x06:
                    acks.append(b"\x40\x02" + buf[p : p + 2])
                    p += 2
                stamps.append(int.from_bytes(buf[p : p + 8], "big"))
            elif kind == 4:  # PUBACK
                pubacks.append(buf[i] << 8 | buf[i + 1])
            elif kind == 2 or kind == 9:  # CONNACK: return code; SUBACK: granted QoS
                code = buf[i + 1] if kind == 2 else buf[i + 2]
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(code)
            pos = end
        self.buf = buf[pos:] if pos < n else b""
        if acks:
            self.transport.write(b"".join(acks))
        if stamps or pubacks:
            now = time.monotonic_ns()
            if stamps and self.sink is not None:
                self.sink.add(now, stamps)
            if pubacks and self.on_acks is not None:
                self.on_acks(pubacks, now)


class Publisher:
    """A closed-loop publisher: at most `lag` messages not yet delivered to all `fanout`
    subscribers, and at QoS 1 at most `inflight_max` PUBACKs outstanding; it stops at
    t1. Messages written in one go share one timestamp."""

    MAX_BATCH = 512

    def __init__(
        self,
        client: Client,
        topic: str,
        qos: int,
        size: int,
        sink: Sink,
        fanout: int,
        lag: int,
        inflight_max: int,
    ) -> None:
        self.client = client
        self.head, self.tail = publish_parts(topic, qos, size)
        self.qos = qos
        self.sink = sink
        self.fanout = fanout
        self.lag = lag
        self.inflight_max = inflight_max
        limit = min(lag, inflight_max) if qos else lag
        self.batch_min = max(1, limit // 16)
        self.sent = 0
        self.inflight = 0
        self.acked = 0
        self.written_off = 0  # deliveries given up on (a stall)
        self.stalls = 0
        self.pid = 0
        self.t1 = 1 << 62
        self.stopped = True
        self.ack_latency = array("q")
        self.sent_at: dict[int, int] = {}
        self.window = (1 << 62, 1 << 62)
        client.on_acks = self.acks
        client.on_writable = self.pump
        sink.progress = self.pump

    def start(self, t0: int, t1: int) -> None:
        self.window = (t0, t1)
        self.t1 = t1
        self.stopped = False
        self.pump()

    def capacity(self) -> int:
        outstanding = self.sent * self.fanout - self.sink.total - self.written_off
        cap = (self.lag * self.fanout - outstanding) // self.fanout
        if self.qos:
            cap = min(cap, self.inflight_max - self.inflight)
        return cap

    def pump(self) -> None:
        if self.stopped or self.client.paused or self.client.lost:
            return
        cap = self.capacity()
        if cap < self.batch_min:
            return
        now = time.monotonic_ns()
        if now >= self.t1:
            self.stopped = True
            return
        n = min(cap, self.MAX_BATCH)
        stamp = now.to_bytes(8, "big")
        if self.qos:
            head, tail, pid = self.head, self.tail, self.pid
            parts = []
            for _ in range(n):
                pid = pid % 65535 + 1
                parts.append(head + PIDS[pid] + stamp + tail)
            self.sent_at[pid] = now  # the batch's last: one ack latency sample per batch
            self.pid = pid
            self.inflight += n
            data = b"".join(parts)
        else:
            data = (self.head + stamp + self.tail) * n
        self.sent += n
        self.client.transport.write(data)

    def acks(self, pids: list[int], now: int) -> None:
        self.inflight -= len(pids)
        self.acked += len(pids)
        if self.sent_at:
            t0, t1 = self.window
            for pid in pids:
                at = self.sent_at.pop(pid, None)
                if at is not None and t0 <= now < t1:
                    self.ack_latency.append(now - at)
        self.pump()

    def watchdog(self, seen: tuple[int, int], idle_since: float) -> tuple[tuple[int, int], float]:
        """Called every 0.25 s: write off what has made no progress for STALL_S."""
        now = time.monotonic()
        state = (self.sink.total, self.acked)
        if state != seen:
            return state, now
        outstanding = self.sent * self.fanout - self.sink.total - self.written_off
        if not self.stopped and now - idle_since > STALL_S and (outstanding > 0 or self.inflight):
            self.stalls += 1
            self.written_off += max(0, outstanding)
            self.inflight = 0
            self.pump()
            return state, now
        self.pump()
        return state, idle_since


class Device:
    """A fan-in device: QoS 1 at a fixed rate, at most `inflight_max` PUBACKs out."""

    __slots__ = ("client", "head", "inflight", "next_at", "pid", "sent_at")

    def __init__(self, client: Client, head: bytes) -> None:
        self.client = client
        self.head = head
        self.pid = 0
        self.inflight = 0
        self.sent_at: dict[int, int] = {}
        self.next_at = 0.0


class Generator:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.port = spec["port"]
        self.loop = asyncio.get_running_loop()
        self.clients: list[Client] = []
        self.retries = 0
        self.retry_reasons: dict[str, int] = {}
        self.sink = Sink()
        self.publisher: Publisher | None = None
        self.devices: list[Device] = []
        self.device_sent = 0
        self.device_skipped = 0
        self.device_acked = 0
        self.device_ack_latency = array("q")
        self.window_ns = (1 << 62, 1 << 62)
        self.sent_at_t0 = self.sent_at_t1 = 0
        self.cpu_t0 = self.cpu_t1 = 0.0
        self.stopped = False
        self.tail = b"\x00" * (spec["size"] - 8)

    # -- connections
    async def connect(self, client_id: str, sink: Sink | None, sub: str | None, qos: int) -> Client:
        last = ""
        user = None if self.spec["anonymous"] else USER
        password = None if self.spec["anonymous"] else PASSWORD
        for attempt in range(CONNECT_TRIES):
            client = Client(sink)
            factory: Callable[[], Client] = functools.partial(lambda c: c, client)
            try:
                await asyncio.wait_for(
                    self.loop.create_connection(factory, "127.0.0.1", self.port),
                    CONNECT_TIMEOUT_S,
                )
                code = await asyncio.wait_for(
                    client.request(encode_connect(client_id, user, password)), CONNECT_TIMEOUT_S
                )
                if code != 0:
                    raise ConnectionError(f"CONNACK return code {code}")
                if sub is not None:
                    granted = await asyncio.wait_for(
                        client.request(encode_subscribe(1, sub, qos)), CONNECT_TIMEOUT_S
                    )
                    if granted == 0x80:
                        raise ConnectionError(f"SUBACK refused {sub!r}")
                self.clients.append(client)
                return client
            except (OSError, TimeoutError, ConnectionError) as exc:
                last = repr(exc) if not isinstance(exc, TimeoutError) else "timed out"
                self.retries += 1
                self.retry_reasons[last] = self.retry_reasons.get(last, 0) + 1
                if client.transport is not None:
                    client.transport.abort()
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        raise ConnectionError(f"{client_id}: {CONNECT_TRIES} tries failed, last: {last}")

    async def connect_many(
        self, count: int, name: Callable[[int], str], sink: Sink | None, sub: str | None, qos: int
    ) -> list[Client]:
        gate = asyncio.Semaphore(self.spec["connect_concurrency"])

        async def one(i: int) -> Client:
            async with gate:
                return await self.connect(name(i), sink, sub, qos)

        return list(await asyncio.gather(*(one(i) for i in range(count))))

    async def setup(self) -> None:
        spec = self.spec
        tag = spec["tag"]
        qos = spec["qos"]
        size = spec["size"]
        if spec["kind"] == "fan-in":
            await self.connect(f"{tag}s", self.sink, "devices/#", qos)
            heads = [publish_parts(f"devices/{i}", 1, size)[0] for i in range(spec["devices"])]
            clients = await self.connect_many(
                spec["devices"], lambda i: f"{tag}d{i}", None, None, 0
            )
            for client, head in zip(clients, heads, strict=True):
                device = Device(client, head)
                client.on_acks = lambda pids, now, d=device: self.device_acks(d, pids, now)
                self.devices.append(device)
            return
        topic = f"bench/{tag}"
        fanout = spec["subscribers"] if spec["kind"] == "fan-out" else 1
        await self.connect_many(fanout, lambda i: f"{tag}s{i}", self.sink, topic, qos)
        client = await self.connect(f"{tag}p", None, None, 0)
        lag = spec["fanout_window"] if spec["kind"] == "fan-out" else spec["window"]
        self.publisher = Publisher(
            client, topic, qos, size, self.sink, fanout, lag, spec["inflight"]
        )

    # -- fan-in devices
    def fire(self, device: Device) -> None:
        now = time.monotonic_ns()
        if now >= self.window_ns[1] or self.stopped:
            return
        if device.client.lost:
            return
        if device.inflight < self.spec["inflight"]:
            pid = device.pid % 65535 + 1
            device.pid = pid
            device.client.transport.write(
                device.head + PIDS[pid] + now.to_bytes(8, "big") + self.tail
            )
            device.inflight += 1
            device.sent_at[pid] = now
            self.device_sent += 1
        else:
            self.device_skipped += 1
        device.next_at += 1.0 / self.spec["device_rate"]
        self.loop.call_at(device.next_at, self.fire, device)

    def device_acks(self, device: Device, pids: list[int], now: int) -> None:
        device.inflight -= len(pids)
        self.device_acked += len(pids)
        t0, t1 = self.window_ns
        for pid in pids:
            at = device.sent_at.pop(pid, None)
            if at is not None and t0 <= now < t1:
                self.device_ack_latency.append(now - at)

    # -- the run
    def sent(self) -> int:
        return self.publisher.sent if self.publisher is not None else self.device_sent

    def mark(self, which: int) -> None:
        cpu = time.process_time()
        if which == 0:
            self.sent_at_t0, self.cpu_t0 = self.sent(), cpu
        else:
            self.sent_at_t1, self.cpu_t1 = self.sent(), cpu

    async def run(self, t0: float, t1: float) -> None:
        """Publish from now to t1 (CLOCK_MONOTONIC seconds); count [t0, t1)."""
        self.window_ns = (int(t0 * 1e9), int(t1 * 1e9))
        self.sink.t0, self.sink.t1 = self.window_ns
        now = time.monotonic()
        self.loop.call_later(t0 - now, self.mark, 0)
        self.loop.call_later(t1 - now, self.mark, 1)
        watch: asyncio.Task[None] | None = None
        if self.publisher is not None:
            self.publisher.start(*self.window_ns)
            watch = asyncio.ensure_future(self.watch(self.publisher))
        else:
            period = 1.0 / self.spec["device_rate"]
            base = self.loop.time()
            count = len(self.devices)
            for i, device in enumerate(self.devices):
                device.next_at = base + period * i / count
                self.loop.call_at(device.next_at, self.fire, device)
            if self.spec["churn_s"]:
                watch = asyncio.ensure_future(self.churn(self.spec["churn_s"]))
        await asyncio.sleep(max(0.0, t1 - time.monotonic()) + 0.01)
        self.stopped = True
        if self.publisher is not None:
            self.publisher.stopped = True
        if watch is not None:
            watch.cancel()
        await self.drain()

    async def churn(self, period: float) -> None:
        """Devices reconnecting: a clean session that subscribes to a topic
        of its own and leaves, every `period` s (each SUBSCRIBE and each
        end a change of the broker's queues and bindings)."""
        n = 0
        while not self.stopped:
            client = await self.connect(f"{self.spec['tag']}c{n}", None, f"churn/{n}", 1)
            client.transport.write(DISCONNECT)
            client.transport.close()
            self.clients.remove(client)
            n += 1
            await asyncio.sleep(period)

    async def watch(self, publisher: Publisher) -> None:
        seen, since = (-1, -1), time.monotonic()
        while True:
            await asyncio.sleep(0.25)
            seen, since = publisher.watchdog(seen, since)

    def expected(self) -> int:
        if self.publisher is not None:
            return self.publisher.sent * self.publisher.fanout
        return self.device_sent

    async def drain(self) -> None:
        """Wait for what is still on its way: all of it, or no progress for a while."""
        deadline = time.monotonic() + DRAIN_MAX_S
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline and self.sink.total < self.expected():
            await asyncio.sleep(0.05)
            if self.sink.total != last:
                last, since = self.sink.total, time.monotonic()
            elif time.monotonic() - since > DRAIN_QUIET_S:
                break

    def result(self) -> dict[str, Any]:
        seconds = (self.window_ns[1] - self.window_ns[0]) / 1e9
        published = self.sent_at_t1 - self.sent_at_t0
        out: dict[str, Any] = {
            "seconds": seconds,
            "published": published,
            "publish_rate": published / seconds,
            "delivered": self.sink.window,
            "delivered_rate": self.sink.window / seconds,
            "latency_ms": percentiles(self.sink.latency),
            "sent_total": self.sent(),
            "received_total": self.sink.total,
            "undelivered": self.expected() - self.sink.total,
            "generator_cpu_pct": 100.0 * (self.cpu_t1 - self.cpu_t0) / seconds,
            "connections": len(self.clients),
            "connect_retries": self.retries,
            "lost_connections": sum(1 for c in self.clients if c.lost),
        }
        if self.retry_reasons:
            out["retry_reasons"] = dict(
                sorted(self.retry_reasons.items(), key=lambda kv: -kv[1])[:5]
            )
        lost = [c.lost_reason for c in self.clients if c.lost]
        if lost:
            out["lost_reasons"] = sorted(set(lost))[:5]
        if self.publisher is not None:
            out["stalls"] = self.publisher.stalls
            out["written_off"] = self.publisher.written_off
            if self.publisher.qos:
                out["puback_latency_ms"] = percentiles(self.publisher.ack_latency)
                out["unacked"] = self.publisher.inflight
        else:
            out["skipped"] = self.device_skipped
            out["unacked"] = self.device_sent - self.device_acked
            out["puback_latency_ms"] = percentiles(self.device_ack_latency)
        return out

    async def close(self) -> None:
        for client in self.clients:
            if client.transport is not None and not client.lost:
                client.transport.write(DISCONNECT)
                client.transport.close()
        await asyncio.sleep(0.2)


def percentiles(samples: array) -> dict[str, float] | None:
    if not samples:
        return None
    ordered = sorted(samples)
    n = len(ordered)

    def at(q: float) -> float:
        return ordered[min(n - 1, int(q * (n - 1) + 0.5))] / 1e6

    return {
        "p50": at(0.5),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": ordered[-1] / 1e6,
        "count": n,
    }


async def generate(conn: Any, spec: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    gen = Generator(spec)
    started = time.monotonic()
    try:
        await gen.setup()
    except Exception as exc:
        conn.send(("error", f"setup failed after {time.monotonic() - started:.1f} s: {exc}"))
        await gen.close()
        return
    conn.send(("ready", {"connect_s": time.monotonic() - started, "retries": gen.retries}))
    message = await loop.run_in_executor(None, conn.recv)
    if message[0] == "go":
        try:
            await gen.run(message[1], message[2])
            conn.send(("result", gen.result()))
        except Exception as exc:
            conn.send(("error", f"run failed: {exc!r}"))
    await gen.close()


def generator_main(conn: Any, spec: dict[str, Any]) -> None:
    """A spawned process: Ctrl-C is for the parent, which stops this one."""
    import uvloop

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_nofile()
    uvloop.run(generate(conn, spec))


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# --- brokers ----------------------------------------------------------------------


@dataclass
class Broker:
    key: str
    port: int = 0  # MQTT
    root: psutil.Process | None = None
    version: str = ""
    start_command: str = ""
    unavailable: str | None = None
    log: Path | None = None
    log_offset: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return BROKERS[self.key]

    def cpu(self) -> float | None:
        return tree_cpu(self.root) if self.root is not None else None

    def cpu_times(self) -> tuple[float, float] | None:
        """(user, system) seconds of the broker's process tree."""
        return tree_cpu_times(self.root) if self.root is not None else None

    def alive(self) -> bool:
        return self.root is not None and not gone(self.root)

    def new_log_lines(
        self, pattern: tuple[str, ...], noise: tuple[str, ...], limit: int = 10
    ) -> list[str]:
        """Lines the broker logged since the last call that hold one of `pattern` and
        none of `noise`."""
        if self.log is None or not self.log.exists():
            return []
        with open(self.log, "rb") as fh:
            fh.seek(self.log_offset)
            text = fh.read().decode(errors="replace")
            self.log_offset = fh.tell()
        lines = [
            ln
            for ln in text.splitlines()
            if any(p in ln for p in pattern)
            and not any(n in ln for n in noise)
            and ln.split("> ", 1)[-1].strip()  # RabbitMQ's empty continuation lines
        ]
        return lines[:limit]


def mosquitto_version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True, timeout=10)
        for line in (out.stdout + out.stderr).splitlines():
            if line.startswith("mosquitto version"):
                return line.split("version", 1)[1].strip()
    return ""


@contextlib.contextmanager
def started_mosquitto() -> Iterator[Broker]:
    broker = Broker("mosquitto")
    if shutil.which("mosquitto") is None:
        broker.unavailable = "no mosquitto (apt-get install -y mosquitto)"
        yield broker
        return
    port = free_port()
    base = Path(tempfile.mkdtemp(prefix="shoal-bench-mosquitto-"))
    conf = base / "mosquitto.conf"
    broker.log = base / "mosquitto.log"
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "max_connections -1\n"
        "set_tcp_nodelay true\n"
        "persistence true\n"
        f"persistence_location {base}/\n"
        f"log_dest file {broker.log}\n"
        "log_type error\nlog_type warning\nlog_type notice\n"
        "connection_messages false\n"
    )
    if os.geteuid() == 0:
        # Started as root, mosquitto drops to its own user, which must write here.
        with contextlib.suppress(KeyError):
            pwd.getpwnam("mosquitto")
            for path in (base, conf):
                shutil.chown(path, "mosquitto", "mosquitto")
    cmd = ["mosquitto", "-c", str(conf)]
    broker.start_command = (
        shlex.join(cmd)
        + f"   # {conf}: "
        + "; ".join(line for line in conf.read_text().splitlines() if not line.startswith("log"))
    )
    broker.version = "mosquitto " + mosquitto_version()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        ready = wait_until(lambda: proc.poll() is not None or mqtt_ready(port), 20.0)
        if proc.poll() is not None or not ready:
            tail = broker.log.read_text(errors="replace").splitlines()[-5:]
            broker.unavailable = "mosquitto did not start: " + (" | ".join(tail) or "no output")
        else:
            broker.port = port
            broker.root = psutil.Process(proc.pid)
        yield broker
    finally:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(5)
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def started_shoal_mqtt(workers: int, extra: Sequence[str]) -> Iterator[Broker]:
    broker = Broker("shoal")
    port = free_port()
    # (compare.started_shoal puts the shared-memory segment on tmpfs, as the
    # broker's default: under /tmp, a disk, its first touches stalled runs)
    args = ["--mqtt-port", str(port), *extra]
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(started_shoal(workers, args))
        broker.start_command = target.start_command or ""
        if target.uri is None:
            broker.unavailable = target.unavailable or "Shoal did not start"
            yield broker
            return
        amqp_port = host_port(target.uri)[1]
        broker.root = shoal_root(amqp_port)
        with contextlib.suppress(ValueError, IndexError):
            # started_shoal's log: beside its data directory
            cmd = shlex.split(broker.start_command)
            broker.log = Path(cmd[cmd.index("--data-dir") + 1]).parent / "broker.log"
        if not wait_until(lambda: mqtt_ready(port), MQTT_STARTUP_TIMEOUT_S):
            broker.unavailable = f"Shoal answers AMQP on {amqp_port} but not MQTT on {port}"
        else:
            broker.port = port
            broker.version = server_version(target.uri) + f" ({shoal_revision()})"
        yield broker


def as_rabbitmq_user(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Debian's wrapper, run as root, starts the node through `su rabbitmq`, whose
    pam_limits sets the soft limit on open files back to 1,024: too few for 1,000
    MQTT clients (Ranch: "out of file descriptors", then RabbitMQ's file descriptor
    alarm). Run as the rabbitmq user, the wrapper starts the node directly, with
    this process's limit: compare.start_rabbitmq_node's `rabbitmq-server -detached`
    through setpriv, which changes the user and nothing else."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return env, []
    with contextlib.suppress(KeyError):
        home = pwd.getpwnam("rabbitmq").pw_dir
        prefix = ["setpriv", "--reuid=rabbitmq", "--regid=rabbitmq", "--init-groups", "--"]
        return {**env, "HOME": home}, prefix
    return env, []


def start_rabbitmq_mqtt_node(env: dict[str, str], ctl: list[str], port: int) -> None:
    """compare.start_rabbitmq_node, the node started as the rabbitmq user."""
    user_env, prefix = as_rabbitmq_user(env)
    start_rabbitmq_node(env, ctl, port, prefix, user_env)


@contextlib.contextmanager
def started_rabbitmq_mqtt() -> Iterator[Broker]:
    """compare.started_rabbitmq with the rabbitmq_mqtt plugin on a free port."""
    broker = Broker("rabbitmq")
    if shutil.which("rabbitmq-server") is None:
        broker.unavailable = "no rabbitmq-server (apt-get install -y rabbitmq-server)"
        yield broker
        return
    port = free_port()
    mqtt_port = free_port()
    base = Path(tempfile.mkdtemp(prefix="shoal-bench-rabbit-"))
    env = rabbit_env(port, base)
    (base / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
    conf = base / "rabbitmq.conf"
    conf.write_text(
        f"mqtt.listeners.tcp.default = 127.0.0.1:{mqtt_port}\n"
        "mqtt.allow_anonymous = true\n"
        f"mqtt.default_user = {USER}\n"
        f"mqtt.default_pass = {PASSWORD}\n"
    )
    env["RABBITMQ_CONFIG_FILE"] = str(conf)
    if os.geteuid() == 0:
        # Debian's wrapper drops to the rabbitmq user, which must own the node's files.
        for path in (base, base / "enabled_plugins", conf):
            with contextlib.suppress(LookupError, OSError):
                shutil.chown(path, "rabbitmq", "rabbitmq")
    epmd_before = shutil.which("epmd") is not None and _epmd_running()
    shown_env = " ".join(
        f"{k}={v}" for k, v in env.items() if k.startswith("RABBITMQ_") and k not in os.environ
    )
    broker.start_command = (
        f"{shown_env} rabbitmq-server -detached   # enabled_plugins: [rabbitmq_mqtt]; "
        + "; ".join(conf.read_text().splitlines())
    )
    ctl = ["rabbitmqctl", "-n", env["RABBITMQ_NODENAME"]]
    roots: list[psutil.Process] = []
    try:
        try:
            start_rabbitmq_mqtt_node(env, ctl, port)
            broker.root = rabbit_root(port)
            if broker.root is not None:
                roots.append(broker.root)
            if not wait_until(lambda: mqtt_ready(mqtt_port), MQTT_STARTUP_TIMEOUT_S):
                broker.unavailable = f"RabbitMQ answers AMQP on {port} but not MQTT on {mqtt_port}"
            else:
                broker.port = mqtt_port
                broker.version = server_version(f"amqp://guest:guest@127.0.0.1:{port}/")
            logs = sorted((base / "log").glob("*.log"))
            broker.log = logs[0] if logs else None
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            broker.unavailable = f"RabbitMQ did not start: {exc}"
        yield broker
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([*ctl, "stop"], env=env, capture_output=True, timeout=60)
        kill_leftover_rabbit(roots)
        if not epmd_before and shutil.which("epmd"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["epmd", "-kill"], capture_output=True, timeout=10)
        shutil.rmtree(base, ignore_errors=True)


def start_brokers(
    stack: contextlib.ExitStack, keys: Sequence[str], opts: argparse.Namespace
) -> list[Broker]:
    brokers = []
    for key in keys:
        if key == "shoal":
            extra = shlex.split(opts.shoal_args)
            broker = stack.enter_context(started_shoal_mqtt(opts.workers, extra))
        elif key == "mosquitto":
            broker = stack.enter_context(started_mosquitto())
        else:
            broker = stack.enter_context(started_rabbitmq_mqtt())
        if broker.unavailable is None and broker.root is None:
            broker.notes.append("its process was not found: no CPU figures")
        if broker.log is not None and broker.log.exists():
            broker.log_offset = broker.log.stat().st_size
        state = broker.unavailable or f"MQTT on 127.0.0.1:{broker.port}, {broker.version}"
        print(f"{broker.name}: {state}", file=sys.stderr, flush=True)
        brokers.append(broker)
    return brokers


def wait_idle(brokers: Sequence[Broker], timeout: float) -> float:
    """Wait until every broker's CPU is under IDLE_CPU of a core; the seconds waited."""
    started = time.monotonic()
    while True:
        before = [b.cpu() for b in brokers]
        time.sleep(IDLE_SAMPLE_S)
        after = [b.cpu() for b in brokers]
        busy = [
            (a - b) / IDLE_SAMPLE_S
            for a, b in zip(after, before, strict=True)
            if a is not None and b is not None
        ]
        if all(x < IDLE_CPU for x in busy) or time.monotonic() - started > timeout:
            return time.monotonic() - started


# --- one run ----------------------------------------------------------------------

LOG_PATTERNS = {
    "shoal": ("ERROR", "WARNING", "Traceback", "rror"),
    "mosquitto": ("rror", "arning", "Out of memory"),
    "rabbitmq": ("[error]", "[warning]", "crash"),
}
# Lines logged in every run, or by the start-up probes: not worth a record.
LOG_NOISE = {
    "shoal": (),
    "mosquitto": (),
    "rabbitmq": ("AMQP connection", "unexpectedly closed", "client call timeout"),
}


def sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def run_one(
    broker: Broker, scenario: Scenario, round_no: int, slot: int, opts: argparse.Namespace
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "round": round_no,
        "slot": slot,
        "scenario": scenario.name,
        "broker": broker.key,
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if broker.unavailable is not None:
        record["error"] = broker.unavailable
        return record
    if broker.root is not None and not broker.alive():
        broker.unavailable = "the broker's process exited"
        record["error"] = broker.unavailable
        return record
    spec = {
        "port": broker.port,
        "kind": scenario.kind,
        "qos": scenario.qos,
        "churn_s": (opts.churn_period or scenario.churn_s) if scenario.churn_s else 0.0,
        "tag": f"sb{round_no}{slot}{SCENARIOS.index(scenario)}x",
        "anonymous": False,
        "size": opts.size,
        "devices": opts.devices,
        "device_rate": opts.device_rate,
        "subscribers": opts.subscribers,
        "window": opts.window,
        "fanout_window": opts.fanout_window,
        "inflight": opts.inflight,
        "connect_concurrency": opts.connect_concurrency,
    }
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=generator_main, args=(child, spec), daemon=True)
    proc.start()
    child.close()
    finished = False
    try:
        if not parent.poll(opts.setup_timeout):
            record["error"] = f"clients not connected after {opts.setup_timeout:.0f} s"
            return record
        kind, info = parent.recv()
        if kind == "error":
            record["error"] = info
            return record
        record["connect_s"] = info["connect_s"]
        if scenario.kind != "1-1" and opts.idle_sample > 0:
            # What the connected clients cost the broker before any message flows.
            before = broker.cpu()
            time.sleep(opts.idle_sample)
            after = broker.cpu()
            if before is not None and after is not None:
                record["connected_idle_cpu_pct"] = 100.0 * (after - before) / opts.idle_sample
        t0 = time.monotonic() + 0.05 + opts.warmup
        t1 = t0 + opts.seconds
        parent.send(("go", t0, t1))
        sleep_until(t0)
        cpu0 = broker.cpu_times()
        sleep_until(t1)
        cpu1 = broker.cpu_times()
        if not parent.poll(DRAIN_MAX_S + 30):
            record["error"] = "the load generator did not report"
            return record
        kind, info = parent.recv()
        if kind == "error":
            record["error"] = info
            return record
        record.update(info)
        if cpu0 is not None and cpu1 is not None:
            user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            record["broker_cpu_s"] = user + system
            if record["delivered"]:
                per_100k = 1e5 / record["delivered"]
                record["cpu_s_per_100k"] = (user + system) * per_100k
                record["user_s_per_100k"] = user * per_100k
                record["system_s_per_100k"] = system * per_100k
        if not record["delivered"]:
            record["error"] = "nothing delivered in the window"
        finished = True
    except (EOFError, OSError) as exc:
        record["error"] = f"the load generator died: {exc!r} (exit code {proc.exitcode})"
    finally:
        proc.join(15 if finished else 0.5)  # it disconnects its clients, then exits
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        parent.close()
        lines = broker.new_log_lines(LOG_PATTERNS[broker.key], LOG_NOISE[broker.key])
        if lines:
            record["broker_log"] = lines
        if broker.root is not None and not broker.alive():
            broker.unavailable = "the broker's process exited"
            record.setdefault("error", broker.unavailable)
    return record


def summary_line(r: dict[str, Any]) -> str:
    head = f"round {r['round'] + 1} {r['scenario']} {BROKERS[r['broker']]}:"
    if r.get("error") and not r.get("delivered"):
        text = f"{head} FAILED {r['error']}"
        if r.get("broker_log"):
            text += "\n    broker log: " + "\n    ".join(x[:300] for x in r["broker_log"][:5])
        return text
    lat = r.get("latency_ms") or {}
    text = (
        f"{head} delivered {r['delivered_rate']:,.0f}/s (published {r['publish_rate']:,.0f}/s)"
        f", latency p50 {ms(lat.get('p50'))} p99 {ms(lat.get('p99'))}"
        f" p99.9 {ms(lat.get('p999'))} ms"
    )
    if r.get("cpu_s_per_100k") is not None:
        text += f", broker CPU {r['broker_cpu_s']:.2f} s = {r['cpu_s_per_100k']:.2f} s/100k"
        if r.get("user_s_per_100k") is not None:
            text += f" ({r['user_s_per_100k']:.2f} user, {r['system_s_per_100k']:.2f} system)"
    text += f", generator {r['generator_cpu_pct']:.0f} %, connect {r.get('connect_s', 0):.1f} s"
    if r.get("connect_retries"):
        text += f" ({r['connect_retries']} retries)"
    for key in ("undelivered", "stalls", "skipped", "lost_connections"):
        if r.get(key):
            text += f", {key} {r[key]:,}"
    if r.get("error"):
        text += f" ERROR {r['error']}"
        if r.get("broker_log"):
            text += "\n    broker log: " + "\n    ".join(x[:300] for x in r["broker_log"][:5])
    return text


def run_rounds(
    brokers: Sequence[Broker],
    scenarios: Sequence[Scenario],
    opts: argparse.Namespace,
    records: list[dict[str, Any]],
) -> None:
    for round_no in range(opts.rounds):
        for scenario in scenarios:
            order = [brokers[(round_no + i) % len(brokers)] for i in range(len(brokers))]
            for slot, broker in enumerate(order):
                waited = wait_idle(brokers, opts.settle)
                record = run_one(broker, scenario, round_no, slot, opts)
                record["idle_wait_s"] = waited
                records.append(record)
                print(summary_line(record), file=sys.stderr, flush=True)


# --- the report -------------------------------------------------------------------


def dig(record: dict[str, Any], *keys: str) -> float | None:
    value: Any = record
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) else None


def ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if value < 10 else f"{value:,.0f}"


def num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def cell(
    runs: Sequence[dict[str, Any]], keys: tuple[str, ...], fmt: Callable[[float | None], str]
) -> str:
    values = [v for r in runs if (v := dig(r, *keys)) is not None]
    if not values:
        return "failed" if runs else "-"
    text = fmt(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt(min(values))}-{fmt(max(values))})"
    failed = sum(1 for r in runs if r.get("error"))
    if failed:
        text += f" [{failed} failed]"
    return text


def table(
    title: str,
    scenarios: Sequence[Scenario],
    brokers: Sequence[Broker],
    records: Sequence[dict[str, Any]],
    render: Callable[[Sequence[dict[str, Any]]], str],
) -> list[str]:
    head = ["scenario", *(b.name for b in brokers)]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * len(brokers)]
    for scenario in scenarios:
        row = [scenario.name]
        for broker in brokers:
            runs = [
                r for r in records if r["scenario"] == scenario.name and r["broker"] == broker.key
            ]
            row.append(render(runs))
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def latency_cell(runs: Sequence[dict[str, Any]]) -> str:
    p50 = cell(runs, ("latency_ms", "p50"), ms)
    p99 = cell(runs, ("latency_ms", "p99"), ms)
    return p50 if p50 in ("failed", "-") else f"{p50} / {p99}"


def cpu_split_cell(runs: Sequence[dict[str, Any]]) -> str:
    """The medians of user and of system time (the two need not add up to the
    total's median): the broker's own code against the kernel's work for it."""
    users = [v for r in runs if (v := dig(r, "user_s_per_100k")) is not None]
    systems = [v for r in runs if (v := dig(r, "system_s_per_100k")) is not None]
    if not users or not systems:
        return "failed" if runs else "-"
    return f"{statistics.median(users):.2f} / {statistics.median(systems):.2f}"


def method_notes(opts: argparse.Namespace) -> list[str]:
    return [
        "Method: MQTT 3.1.1 clients, clean sessions, keep-alive off, user guest; "
        f"{opts.size} B payloads that start with the publisher's CLOCK_MONOTONIC "
        "timestamp (latency: publish to delivery, one clock). One load-generator "
        "process per run (asyncio on uvloop, raw sockets, its own MQTT codec) connects "
        f"its clients ({opts.connect_concurrency} at a time, retrying what fails), "
        "then publishes for a warm-up and the measured window; a run counts what its "
        "subscribers received in the window. Broker CPU is user + system time of the "
        "broker's whole process tree (psutil) over the window, divided by the messages "
        "delivered in it. Before each run the script waits for every broker to be idle.",
        "",
        f"`fan-in` offers a fixed load ({opts.devices:,} devices x {opts.device_rate:g} "
        f"msg/s, each with at most {opts.inflight} PUBACKs outstanding): its delivered rate "
        "is the offered one unless a broker falls behind, and its latency is the "
        "brokers' own. The other scenarios are closed loops that publish as fast as the "
        f"broker delivers: fan-out keeps at most {opts.fanout_window} messages not yet "
        f"delivered to every subscriber, 1-1 at most {opts.window:,} messages not yet "
        f"received, and at QoS 1 both keep at most {opts.inflight} PUBACKs outstanding. "
        "So there, latency is about what is in flight divided by the rate (Little's "
        "law): it ranks the brokers as their rates do.",
        "",
        "Defaults that bound QoS 1 deliveries: unacknowledged messages per QoS 1 "
        "subscription, Shoal 1,000 (`--mqtt-prefetch`), RabbitMQ's plugin 10 "
        "(`mqtt.prefetch`), mosquitto 20 (`max_inflight_messages`). mosquitto is "
        "single-threaded: one core is its ceiling. The load generator shares the "
        "machine's cores with the brokers (its CPU is in the last table).",
        "",
    ]


def render_report(
    brokers: Sequence[Broker],
    scenarios: Sequence[Scenario],
    records: Sequence[dict[str, Any]],
    opts: argparse.Namespace,
    argv: Sequence[str],
    load: str,
    interrupted: bool,
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## MQTT: {', '.join(b.name for b in brokers)} ({now})",
        "",
        f"Generated by `bench/mqtt.py`. Medians over {opts.rounds} round(s) of {opts.seconds:g} s "
        f"per run (after {opts.warmup:g} s of warm-up); min-max over the rounds in brackets. "
        f"Shoal runs with `--workers {opts.workers}`.",
        "",
        *machine_info(),
        f"- Load average (1, 5, 15 min) just before the runs: {load}",
        "",
        *busy_warning(load),
    ]
    if interrupted:
        lines += ["**Interrupted:** only the runs finished before the interrupt count.", ""]
    for broker in brokers:
        label = f"{broker.name} ({broker.version})" if broker.version else broker.name
        if broker.unavailable:
            lines.append(f"- {label}: not measured: {broker.unavailable}")
        else:
            lines.append(f"- {label}: `{broker.start_command}`")
        for note in broker.notes:
            lines.append(f"  - {note}")
    lines += ["", "```", "python " + shlex.join(["bench/mqtt.py", *argv]), "```", ""]
    lines += ["Scenarios:", ""]
    lines += [f"- `{s.name}`: {s.title}" for s in scenarios]
    lines += ["", *method_notes(opts)]
    lines += table(
        "Delivered msg/s",
        scenarios,
        brokers,
        records,
        lambda rs: cell(rs, ("delivered_rate",), num),
    )
    lines += table("Latency p50 / p99, ms", scenarios, brokers, records, latency_cell)
    lines += table(
        "Broker CPU seconds per 100k delivered",
        scenarios,
        brokers,
        records,
        lambda rs: cell(rs, ("cpu_s_per_100k",), lambda v: num(v, 2)),
    )
    lines += table(
        "Broker CPU seconds per 100k delivered: user / system",
        scenarios,
        brokers,
        records,
        cpu_split_cell,
    )
    lines += table(
        "Broker CPU with the clients connected and idle, % of one core",
        [s for s in scenarios if s.kind != "1-1"],
        brokers,
        records,
        lambda rs: cell(rs, ("connected_idle_cpu_pct",), num),
    )
    lines += table(
        "Load generator CPU, % of one core",
        scenarios,
        brokers,
        records,
        lambda rs: cell(rs, ("generator_cpu_pct",), num),
    )
    errors = sorted(
        {
            f"{BROKERS[r['broker']]} {r['scenario']}: {r['error']}"
            + (f" (log: {r['broker_log'][0][:200]})" if r.get("broker_log") else "")
            for r in records
            if r.get("error")
        }
    )
    if errors:
        lines += ["Failures:", "", *(f"- {e}" for e in errors), ""]
    return "\n".join(lines).rstrip() + "\n"


# --- command line -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Shoal, mosquitto and RabbitMQ under MQTT load.")
    names = ",".join(s.name for s in SCENARIOS)
    p.add_argument("--scenarios", default=names, help=f"comma list (default all: {names})")
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma list")
    p.add_argument("--rounds", type=int, default=3, help="rounds (medians reported)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before")
    p.add_argument("--workers", type=int, default=2, help="Shoal IO workers (default 2)")
    p.add_argument("--shoal-args", default="", help="extra arguments for `python -m shoal.broker`")
    p.add_argument("--size", type=int, default=64, help="payload bytes (at least 8)")
    p.add_argument("--devices", type=int, default=1000, help="fan-in publishers")
    p.add_argument("--device-rate", type=float, default=5.0, help="msg/s per fan-in device")
    p.add_argument(
        "--churn-period", type=float, help="fan-in-churn: s between its clients (default 0.5)"
    )
    p.add_argument("--subscribers", type=int, default=1000, help="fan-out subscribers")
    p.add_argument("--window", type=int, default=1000, help="1-1: messages not yet received")
    p.add_argument(
        "--fanout-window", type=int, default=10, help="fan-out: messages not yet fully delivered"
    )
    p.add_argument("--inflight", type=int, default=100, help="QoS 1: PUBACKs outstanding")
    p.add_argument("--connect-concurrency", type=int, default=32, help="connects at once")
    p.add_argument("--setup-timeout", type=float, default=180.0, help="s to connect the clients")
    p.add_argument(
        "--idle-sample",
        type=float,
        default=1.0,
        help="s of broker CPU sampled with 1,000 clients connected, before the run (0: none)",
    )
    p.add_argument("--settle", type=float, default=30.0, help="max s to wait for idle brokers")
    p.add_argument("--out", type=Path, help="write the Markdown here too")
    p.add_argument("--json", type=Path, help="write every raw run here")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    opts = parser.parse_args(args)
    scenarios = [BY_NAME[n] for n in parse_list(opts.scenarios, list(BY_NAME), "scenarios", parser)]
    keys = parse_list(opts.brokers, list(BROKERS), "brokers", parser)
    keys = [k for k in BROKERS if k in keys]
    if opts.rounds < 1 or opts.seconds <= 0 or opts.size < 8:
        parser.error("--rounds and --seconds must be positive, --size at least 8")
    raise_nofile()  # the brokers inherit it too
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)
    load = load_average()
    records: list[dict[str, Any]] = []
    brokers: list[Broker] = []
    interrupted = False
    try:
        with contextlib.ExitStack() as stack:
            brokers = start_brokers(stack, keys, opts)
            run_rounds(brokers, scenarios, opts, records)
            print("stopping the brokers", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: brokers stopped; reporting what was measured", file=sys.stderr)
    markdown = render_report(brokers, scenarios, records, opts, args, load, interrupted)
    if opts.json:
        meta = {
            "generated_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "argv": args,
            "shoal": shoal_revision(),
            "brokers": {
                b.key: {
                    "version": b.version,
                    "port": b.port,
                    "start_command": b.start_command,
                    "unavailable": b.unavailable,
                }
                for b in brokers
            },
            "machine": machine_info(),
            "load_before": load,
            "interrupted": interrupted,
        }
        opts.json.write_text(json.dumps({"meta": meta, "runs": records}, indent=1) + "\n")
        print(f"wrote {opts.json}", file=sys.stderr)
    if opts.out:
        opts.out.write_text(markdown)
        print(f"wrote {opts.out}", file=sys.stderr)
    print(markdown)
    ok = any(not r.get("error") for r in records)
    return 130 if interrupted else (0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
