"""Shoal beside its peers: LavinMQ 2.9.1 and RabbitMQ 3.10, under LavinMQ's own load
generator (`lavinmqperf throughput`) and Shoal's (`python -m shoal.perf`).

All three brokers start once, at the beginning, and run side by side for the whole
benchmark; they are stopped at the end whatever happens (Ctrl-C included). Round r
runs every scenario, and within a scenario the brokers in turning order (round 0:
Shoal, LavinMQ, RabbitMQ; round 1: LavinMQ, RabbitMQ, Shoal; ...), so background
noise on the machine hits all of them alike.

Per run it records the consume and publish rates, each broker's CPU (its whole
process tree, user + system, psutil) per million consumed messages, the load
generator's own CPU, latency where measured, and the backlog the run left in its
queue(s) (read with a passive queue.declare before the queue is deleted).

    python bench/peers.py                                   # 3 rounds of 8 s, everything
    python bench/peers.py --rounds 1 --duration 3 --json-out /tmp/peers.json
    python bench/peers.py --scenarios 1-1-noack,quiet --brokers shoal,lavinmq
    python bench/peers.py --out /tmp/peers.md               # the Markdown section to a file

A full run (10 scenarios x 3 brokers x 3 rounds of 8 s) takes about 20 minutes; the
brokers start in about 20 s (RabbitMQ is the slow one).

The output is a Markdown section to paste into docs/benchmarks.md (stdout, or
``--out``); progress goes to stderr. ``--json-out`` keeps every raw run.

LavinMQ comes from ../shared/tools/lavinmq (``--lavinmq-tools`` or ``$LAVINMQ_TOOLS``):
its run.sh unpacks the binaries into ``${LAVINMQ_HOME:-/tmp/lavinmq-bin}``, where
lavinmqperf is found too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pika
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from compare import (  # noqa: E402
    Target,
    amqp_ready,
    busy_warning,
    host_port,
    load_average,
    machine_info,
    perf_command,
    shoal_revision,
    started_rabbitmq,
    started_shoal,
    wait_until,
)

LAVINMQPERF = "lavinmqperf"
SHOAL_PERF = "shoal.perf"
DEFAULT_TOOLS = ROOT.parent / "shared" / "tools" / "lavinmq"
LAVINMQ_STARTUP_TIMEOUT_S = 30.0
# Slack on top of a generator's own run time before it counts as wedged.
RUN_SLACK_S = 60.0
# The quiet scenario: how long its 500 connections may take to open (lavinmqperf's -z
# timer starts before they connect, so -z is set this much longer and the script stops
# the run itself with SIGTERM once enough report lines have come), and how many of the
# first one-second report lines are left out of the CPU window.
QUIET_SETUP_S = 180
QUIET_SETTLE_LINES = 2
QUEUE_OP_TIMEOUT_S = 120.0
RATE_LINE = re.compile(r"Publish rate: (-?\d+) msgs/s Consume rate: (-?\d+) msgs/s")

BROKERS = {"shoal": "Shoal", "lavinmq": "LavinMQ", "rabbitmq": "RabbitMQ"}


# --- scenarios --------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    tool: str  # LAVINMQPERF or SHOAL_PERF
    args: tuple[str, ...]
    queues: tuple[str, ...] = ("perf-test",)
    # Stop on report lines, measure CPU over the steady window, report per 100k messages.
    quiet: bool = False
    latency: bool = False  # lavinmqperf -l even without --latency


ACK = ("-a", "250", "-P", "500")
SHOAL_COMMON = ("--size", "64", "--prefetch", "500", "--multi-ack", "100", "--queue", "shoal-perf")
QUIET_QUEUES = tuple(f"quiet-{i}" for i in range(1, 251))
SCENARIOS = (
    Scenario("1-1-noack", "1 publisher -> 1 consumer, 16 B, no ack", LAVINMQPERF, ()),
    Scenario(
        "4-4-noack",
        "4 publishers -> 4 consumers, 16 B, no ack",
        LAVINMQPERF,
        ("-x", "4", "-y", "4"),
    ),
    Scenario("1-1-ack", "1 -> 1, 16 B, ack every 250 (multiple), prefetch 500", LAVINMQPERF, ACK),
    Scenario(
        "1-1-ack100",
        "1 -> 1, 16 B, ack every 100 (multiple), prefetch 500",
        LAVINMQPERF,
        ("-a", "100", "-P", "500"),
    ),
    Scenario(
        "1-1-confirm",
        "1 -> 1, 16 B, confirms (200 outstanding), ack every 250, prefetch 500",
        LAVINMQPERF,
        ("-c", "200", *ACK),
    ),
    Scenario(
        "4-4-ack",
        "4 -> 4, 16 B, ack every 250 (multiple), prefetch 500",
        LAVINMQPERF,
        ("-x", "4", "-y", "4", *ACK),
    ),
    Scenario(
        "persistent",
        "1 -> 1, 16 B persistent to a durable queue, confirms (200), ack every 250, prefetch 500",
        LAVINMQPERF,
        ("-p", "-c", "200", *ACK),
    ),
    Scenario(
        "quiet",
        "500 connections, 250 queues, 250 publishers capped at 40 msg/s each, no ack",
        LAVINMQPERF,
        tuple(
            shlex.split(
                "-x 250 -y 250 -r 40 --queue-pattern quiet-% "
                "--queue-pattern-from 1 --queue-pattern-to 250"
            )
        ),
        queues=QUIET_QUEUES,
        quiet=True,
        latency=True,
    ),
    Scenario(
        "shoal-perf-1-1",
        "shoal.perf: 1 producer -> 1 consumer, 64 B, prefetch 500, multi-ack 100",
        SHOAL_PERF,
        SHOAL_COMMON,
        queues=("shoal-perf",),
    ),
    Scenario(
        "shoal-perf-4-4",
        "shoal.perf: 4 producers -> 4 consumers, 64 B, prefetch 500, multi-ack 100",
        SHOAL_PERF,
        ("--producers", "4", "--consumers", "4", *SHOAL_COMMON),
        queues=("shoal-perf",),
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}


# --- brokers ----------------------------------------------------------------------


@dataclass
class LavinTarget(Target):
    """compare.Target, plus what it takes to stop LavinMQ and clean up after it."""

    pid: int | None = None
    data_dir: Path | None = None


@dataclass
class Broker:
    """A started broker: its Target and the root of its process tree."""

    key: str
    target: Target
    root: psutil.Process | None = None
    version: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return BROKERS[self.key]

    def cpu(self) -> float | None:
        return tree_cpu(self.root) if self.root is not None else None


def tree_cpu(root: psutil.Process) -> float | None:
    """User + system CPU seconds of a process and all its descendants, the dead
    children each one has reaped included (children_user, children_system)."""
    times = tree_cpu_times(root)
    return None if times is None else times[0] + times[1]


def tree_cpu_times(root: psutil.Process) -> tuple[float, float] | None:
    """tree_cpu's seconds apart: (user, system). Where a broker's CPU goes
    beside another's (its own code, or the kernel's system calls) starts here."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    user = system = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            if proc is root:
                return None
            continue  # a child that exited meanwhile: its parent has reaped its time
        user += t.user + t.children_user
        system += t.system + t.children_system
    return user, system


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def lavinmq_port() -> int:
    """An AMQP port whose HTTP port (port + 10000) is free as well."""
    for _ in range(200):
        port = random.randint(20000, 55000)
        if port_free(port) and port_free(port + 10000):
            return port
    raise RuntimeError("no free port pair (port, port + 10000) for LavinMQ")


def lavinmq_home() -> Path:
    return Path(os.environ.get("LAVINMQ_HOME") or "/tmp/lavinmq-bin")


def data_dir_of(pid: int) -> Path | None:
    with contextlib.suppress(psutil.Error):
        for arg in psutil.Process(pid).cmdline():
            if arg.startswith("--data-dir="):
                return Path(arg.split("=", 1)[1])
    return None


def stop_lavinmq(pid: int) -> None:
    """SIGTERM, again after 5 s (its stop hangs at times), then SIGKILL."""

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        if gone(proc):
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
        wait_until(lambda: gone(proc), 5.0, 0.1)


@contextlib.contextmanager
def started_lavinmq(tools: Path) -> Iterator[LavinTarget]:
    """LavinMQ started by the tools' run.sh on free ports, with a fresh data directory;
    stopped and its data directory removed after."""
    port = lavinmq_port()
    run_sh = tools / "run.sh"
    target = LavinTarget("LavinMQ", f"amqp://guest:guest@127.0.0.1:{port}/", f"sh {run_sh} {port}")
    try:
        try:
            proc = subprocess.run(
                ["sh", str(run_sh), str(port)],
                capture_output=True,
                text=True,
                timeout=120,
                start_new_session=True,  # Ctrl-C in the terminal must not reach it
            )
            target.pid = int(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            target.unavailable = f"LavinMQ did not start: {exc}"
            target.uri = None
            yield target
            return
        target.data_dir = data_dir_of(target.pid)
        pid = target.pid

        def up_or_dead() -> bool:
            return not psutil.pid_exists(pid) or bool(amqp_ready("127.0.0.1", port))

        wait_until(up_or_dead, LAVINMQ_STARTUP_TIMEOUT_S)
        if not amqp_ready("127.0.0.1", port):
            log = (target.data_dir or Path("/nonexistent")) / "lavinmq.log"
            tail = (
                " | ".join(log.read_text(errors="replace").splitlines()[-5:])
                if log.exists()
                else ""
            )
            target.unavailable = "LavinMQ did not start: " + (tail or "no output")
            target.uri = None
        yield target
    finally:
        if target.pid is not None:
            stop_lavinmq(target.pid)
        if target.data_dir is not None and target.data_dir.name.startswith("lavinmq-data-"):
            shutil.rmtree(target.data_dir, ignore_errors=True)


def shoal_root(port: int) -> psutil.Process | None:
    """The broker process started_shoal started: our child, serving `port`."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(child.cmdline())
            if f"(port {port})" in cmd or ("shoal.broker" in cmd and f"--port {port}" in cmd):
                return child
    return None


def rabbit_root(port: int) -> psutil.Process | None:
    """The beam.smp of the private node started_rabbitmq started: its environment
    names the node shoalbench<port> (the command line does not)."""
    node = f"shoalbench{port}@"
    for proc in psutil.process_iter(["name"]):
        if not (proc.info.get("name") or "").startswith("beam"):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("RABBITMQ_NODENAME", "").startswith(node):
                return proc
    return None


def gone(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def kill_leftover_rabbit(roots: list[psutil.Process]) -> None:
    """A safety net after started_rabbitmq: `rabbitmqctl stop` returns before the node
    has exited; give it 20 s, then kill what is left of it."""
    for root in roots:
        if wait_until(lambda root=root: gone(root), 20.0, 0.2):
            continue
        with contextlib.suppress(psutil.Error):
            for proc in [*root.children(recursive=True), root]:
                with contextlib.suppress(psutil.Error):
                    proc.kill()


def server_version(uri: str) -> str:
    with contextlib.suppress(Exception):
        conn = pika.BlockingConnection(connection_parameters(uri))
        try:
            props = conn._impl.server_properties  # pika keeps Connection.Start's table here
            product = props.get("product", "")
            version = props.get("version", "")
            if isinstance(product, bytes):
                product = product.decode()
            if isinstance(version, bytes):
                version = version.decode()
            return f"{product} {version}".strip()
        finally:
            conn.close()
    return ""


def add_lavinmq_tools_argument(p: argparse.ArgumentParser) -> None:
    """--lavinmq-tools, for start_brokers' LavinMQ."""
    p.add_argument(
        "--lavinmq-tools",
        type=Path,
        default=Path(os.environ.get("LAVINMQ_TOOLS") or DEFAULT_TOOLS),
        help="folder with LavinMQ's run.sh and binaries ($LAVINMQ_TOOLS)",
    )


def start_brokers(
    stack: contextlib.ExitStack, keys: Sequence[str], opts: argparse.Namespace
) -> list[Broker]:
    brokers = []
    for key in keys:
        if key == "shoal":
            target = stack.enter_context(started_shoal(opts.workers, shlex.split(opts.shoal_args)))
            broker = Broker(key, target)
            if target.uri:
                broker.root = shoal_root(host_port(target.uri)[1])
        elif key == "lavinmq":
            target = stack.enter_context(started_lavinmq(opts.lavinmq_tools))
            broker = Broker(key, target)
            if target.uri and isinstance(target, LavinTarget) and target.pid is not None:
                with contextlib.suppress(psutil.Error):
                    broker.root = psutil.Process(target.pid)
        else:
            roots: list[psutil.Process] = []
            stack.callback(kill_leftover_rabbit, roots)  # runs after the node's own stop
            target = stack.enter_context(started_rabbitmq())
            broker = Broker(key, target)
            if target.uri:
                broker.root = rabbit_root(host_port(target.uri)[1])
                if broker.root is not None:
                    roots.append(broker.root)
        if target.uri:
            broker.version = server_version(target.uri)
            if broker.root is None:
                broker.notes.append("its process was not found: no CPU figures")
        print(
            f"{broker.name}: {target.uri or target.unavailable} {broker.version}",
            file=sys.stderr,
            flush=True,
        )
        brokers.append(broker)
    return brokers


# --- queues (pika) ----------------------------------------------------------------


def connection_parameters(uri: str) -> pika.ConnectionParameters:
    host, port = host_port(uri)
    return pika.ConnectionParameters(
        host,
        port,
        credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=0,
        socket_timeout=10,
        stack_timeout=30,
        blocked_connection_timeout=60,
    )


def with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """Run a blocking pika exchange in a thread: a wedged broker cannot hang the script."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer from the broker in {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def delete_queues(uri: str, queues: Sequence[str]) -> None:
    def work() -> None:
        conn = pika.BlockingConnection(connection_parameters(uri))
        try:
            ch = conn.channel()
            for queue in queues:
                try:
                    ch.queue_delete(queue)
                except pika.exceptions.ChannelClosedByBroker:  # not found, on some brokers
                    ch = conn.channel()
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    with_timeout(work, QUEUE_OP_TIMEOUT_S)


def queue_depths(uri: str, queues: Sequence[str]) -> tuple[int, int, int]:
    """Messages ready, consumers and missing queues, summed over the queues."""

    def work() -> tuple[int, int, int]:
        conn = pika.BlockingConnection(connection_parameters(uri))
        messages = consumers = missing = 0
        try:
            ch = conn.channel()
            for queue in queues:
                try:
                    ok = ch.queue_declare(queue, passive=True).method
                    messages += ok.message_count
                    consumers += ok.consumer_count
                except pika.exceptions.ChannelClosedByBroker:
                    missing += 1
                    ch = conn.channel()
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        return messages, consumers, missing

    result: tuple[int, int, int] = with_timeout(work, QUEUE_OP_TIMEOUT_S)
    return result


def read_backlog(uri: str, queues: Sequence[str]) -> dict[str, Any]:
    """The backlog left in the queues once the generator's consumers are gone (their
    unacked messages requeued): wait for no consumers, then for two equal reads."""
    deadline = time.monotonic() + 15.0
    messages, consumers, missing = queue_depths(uri, queues)
    while consumers and time.monotonic() < deadline:
        time.sleep(0.25)
        messages, consumers, missing = queue_depths(uri, queues)
    for _ in range(8):
        time.sleep(0.25)
        again, consumers, missing = queue_depths(uri, queues)
        if again == messages:
            break
        messages = again
    return {"backlog": messages, "consumers_left": consumers, "queues_missing": missing}


# --- running the generators -------------------------------------------------------


@dataclass
class Line:
    """One of lavinmqperf's one-second report lines, and the broker's CPU then."""

    at: float
    cpu: float | None
    publish: int
    consume: int


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def lavinmqperf_command(
    perf: Path, uri: str, scenario: Scenario, duration: int, latency: bool
) -> list[str]:
    seconds = duration + QUIET_SETTLE_LINES + QUIET_SETUP_S if scenario.quiet else duration
    extra = ["-l"] if latency or scenario.latency else []
    return [
        str(perf),
        "throughput",
        "--uri",
        uri,
        *scenario.args,
        *extra,
        "-z",
        str(seconds),
        "-j",
    ]


def run_lavinmqperf(
    cmd: list[str], broker: Broker, stop_after: int | None, timeout: float
) -> dict[str, Any]:
    """Run lavinmqperf, sampling the broker's CPU at each report line; with stop_after,
    send it SIGTERM (it prints its summary then) once that many lines have come."""
    lines: list[Line] = []
    other: list[str] = []
    summary: list[str] = []
    out: dict[str, Any] = {}
    gen_before = children_cpu()
    cpu_before = broker.cpu()
    wall_before = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                text = raw.strip()
                match = RATE_LINE.match(text)
                if match:
                    lines.append(Line(time.monotonic(), broker.cpu(), int(match[1]), int(match[2])))
                    if stop_after is not None and len(lines) == stop_after:
                        with contextlib.suppress(ProcessLookupError):
                            proc.send_signal(signal.SIGTERM)
                elif text.startswith("{"):
                    summary.append(text)
                elif text:
                    other.append(text)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            out["rc"] = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            out["timed_out"] = True
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        reader.join(10)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    out["wall_s"] = time.monotonic() - wall_before
    cpu_after = broker.cpu()
    out["generator_cpu_s"] = children_cpu() - gen_before
    out["broker_cpu_s"] = (
        cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    )
    out["report_lines"] = [[round(x.at - wall_before, 3), x.publish, x.consume] for x in lines]
    out["messages"] = other[-20:]
    if stderr.strip():
        out["stderr_tail"] = stderr.strip().splitlines()[-10:]
    report: dict[str, Any] | None = None
    with contextlib.suppress(IndexError, json.JSONDecodeError):
        report = json.loads(summary[-1])
    if out.get("timed_out"):
        out["error"] = f"lavinmqperf timed out after {timeout:.0f} s"
    elif report is None:
        detail = (stderr.strip().splitlines() or other or ["no output"])[-1]
        out["error"] = f"lavinmqperf exited {out.get('rc')} without a summary: {detail}"
    elif stop_after is not None and len(lines) < stop_after:
        out["error"] = (
            f"only {len(lines)} of {stop_after} report lines (connections too slow to open?)"
        )
    if report is not None:
        elapsed = float(report.get("elapsed_seconds", 0.0))
        out["elapsed_s"] = elapsed
        out["publish_rate"] = float(report.get("avg_pub_rate", 0))
        out["consume_rate"] = float(report.get("avg_consume_rate", 0))
        out["consumed"] = out["consume_rate"] * elapsed
        out["published"] = out["publish_rate"] * elapsed
        if "latency_median_ms" in report:
            # min is left out: with several publishers it comes out garbage (a torn
            # timestamp), the percentiles do not.
            out["latency_ms"] = {
                "p50": report["latency_median_ms"],
                "p75": report.get("latency_p75_ms"),
                "p95": report.get("latency_p95_ms"),
                "p99": report.get("latency_p99_ms"),
                "count": report.get("latency_count"),
            }
        out["lavinmqperf"] = report
    first = QUIET_SETTLE_LINES - 1 if stop_after is not None else 0
    out["window"] = steady_window(lines, first)
    return out


def steady_window(lines: Sequence[Line], first: int) -> dict[str, Any] | None:
    """Broker CPU and messages consumed from report line `first` to the last one:
    the steady state, connection setup and teardown outside it."""
    if len(lines) < first + 2:
        return None
    span = lines[first:]
    a, b = span[0], span[-1]
    if a.cpu is None or b.cpu is None:
        return None
    seconds = b.at - a.at
    # Each line's rate covers about the second before it.
    consumed = sum(cur.consume * (cur.at - prev.at) for prev, cur in itertools.pairwise(span))
    published = sum(cur.publish * (cur.at - prev.at) for prev, cur in itertools.pairwise(span))
    cpu = b.cpu - a.cpu
    return {
        "seconds": seconds,
        "broker_cpu_s": cpu,
        "consumed": consumed,
        "published": published,
        "cpu_s_per_100k": cpu / consumed * 1e5 if consumed else None,
        "cpu_s_per_million": cpu / consumed * 1e6 if consumed else None,
    }


def run_perf_group(cmd: list[str], timeout: float) -> dict[str, Any]:
    """compare.run_perf, with perf in a session of its own: its producer and consumer
    processes are killed with it on a timeout or an interrupt, never left behind."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return {"errors": [f"perf timed out after {timeout:.0f} s"], "fatal": True}
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    try:
        report: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        detail = (stderr.strip().splitlines() or ["no output"])[-1]
        return {"errors": [f"perf exited {proc.returncode}: {detail}"], "fatal": True}
    return report


def run_shoal_perf(
    uri: str, scenario: Scenario, broker: Broker, opts: argparse.Namespace
) -> dict[str, Any]:
    cmd = perf_command(uri, scenario.args, opts.duration, opts.warmup)
    out: dict[str, Any] = {"command": cmd}
    gen_before = children_cpu()
    cpu_before = broker.cpu()
    wall_before = time.monotonic()
    report = run_perf_group(cmd, opts.duration + opts.warmup + RUN_SLACK_S)
    out["wall_s"] = time.monotonic() - wall_before
    cpu_after = broker.cpu()
    out["generator_cpu_s"] = children_cpu() - gen_before
    out["broker_cpu_s"] = (
        cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    )
    out["shoal_perf"] = report
    if report.get("fatal"):
        out["error"] = "; ".join(report.get("errors", [])) or "perf failed"
        return out
    out["elapsed_s"] = float(opts.duration)
    out["publish_rate"] = float(report["published_rate"])
    out["consume_rate"] = float(report["consumed_rate"])
    out["consumed"] = float(report["consumed"])
    out["published"] = float(report["published"])
    # The broker's CPU spans the warmup as well: count the messages of both.
    out["cpu_window_consumed"] = out["consume_rate"] * (opts.duration + opts.warmup)
    latency = report.get("latency_ms") or None
    if latency:
        out["latency_ms"] = {k: latency.get(k) for k in ("p50", "p95", "p99")}
    if report.get("errors"):
        out["messages"] = report["errors"]
    return out


def run_one(
    broker: Broker,
    scenario: Scenario,
    round_no: int,
    slot: int,
    perf: Path,
    opts: argparse.Namespace,
) -> dict[str, Any]:
    """One generator run against one broker: clear the queues, run, read the backlog,
    delete the queues."""
    record: dict[str, Any] = {
        "round": round_no,
        "slot": slot,
        "scenario": scenario.name,
        "broker": broker.key,
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    uri = broker.target.uri
    if uri is None:
        record["error"] = broker.target.unavailable or "not started"
        return record
    if not amqp_ready(*host_port(uri)):
        record["error"] = "the broker no longer answers AMQP"
        return record
    try:
        delete_queues(uri, scenario.queues)
    except Exception as exc:
        record["error"] = f"could not delete the queues before the run: {exc!r}"
        return record
    if scenario.tool == LAVINMQPERF:
        cmd = lavinmqperf_command(perf, uri, scenario, opts.duration, opts.latency)
        record["command"] = cmd
        stop_after = opts.duration + QUIET_SETTLE_LINES if scenario.quiet else None
        budget = float(cmd_seconds(cmd)) + RUN_SLACK_S
        record.update(run_lavinmqperf(cmd, broker, stop_after, budget))
    else:
        record.update(run_shoal_perf(uri, scenario, broker, opts))
    cpu = record.get("broker_cpu_s")
    consumed = record.get("cpu_window_consumed", record.get("consumed"))
    if cpu is not None and consumed:
        record["cpu_s_per_million"] = cpu / consumed * 1e6
    try:
        record.update(read_backlog(uri, scenario.queues))
    except Exception as exc:
        record["backlog_error"] = repr(exc)
    try:
        delete_queues(uri, scenario.queues)
    except Exception as exc:
        record["delete_error"] = repr(exc)
    return record


def cmd_seconds(cmd: Sequence[str]) -> int:
    return int(cmd[cmd.index("-z") + 1])


def summary_line(record: dict[str, Any]) -> str:
    head = f"round {record['round'] + 1} {record['scenario']} {BROKERS[record['broker']]}:"
    if record.get("error"):
        return f"{head} FAILED {record['error']}"
    text = f"{head} consume {record['consume_rate']:,.0f}/s publish {record['publish_rate']:,.0f}/s"
    if record.get("cpu_s_per_million") is not None:
        text += (
            f", broker CPU {record['broker_cpu_s']:.2f} s = {record['cpu_s_per_million']:.2f} s/M"
        )
    window = record.get("window")
    if BY_NAME[record["scenario"]].quiet and window and window.get("cpu_s_per_100k"):
        text += f", steady {window['cpu_s_per_100k']:.2f} s/100k"
    if record.get("latency_ms"):
        text += f", p50 {record['latency_ms']['p50']:.1f} ms"
    text += f", backlog {record.get('backlog', '?')}"
    return text


def rotation(brokers: Sequence[Broker], round_no: int) -> list[Broker]:
    turn = round_no % len(brokers)
    return [*brokers[turn:], *brokers[:turn]]


def run_rounds(
    brokers: Sequence[Broker],
    scenarios: Sequence[Scenario],
    perf: Path,
    opts: argparse.Namespace,
    records: list[dict[str, Any]],
) -> None:
    for round_no in range(opts.rounds):
        for scenario in scenarios:
            for slot, broker in enumerate(rotation(brokers, round_no)):
                record = run_one(broker, scenario, round_no, slot, perf, opts)
                records.append(record)
                print(summary_line(record), file=sys.stderr, flush=True)
                time.sleep(opts.pause)  # let the broker close connections and settle


# --- report -----------------------------------------------------------------------


def values(runs: Sequence[dict[str, Any]], *path: str) -> list[float]:
    found = []
    for run in runs:
        if run.get("error"):
            continue
        value: Any = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float):
            found.append(float(value))
    return found


def median(runs: Sequence[dict[str, Any]], *path: str) -> float | None:
    found = values(runs, *path)
    return statistics.median(found) if found else None


def num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def ms(value: float | None) -> str:
    """Milliseconds: two decimals below 10 ms, one above."""
    return num(value, 2 if value is not None and value < 10 else 1)


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def version_label(broker: Broker) -> str:
    version = broker.version.split(" ", 1)[-1] if broker.version else ""
    return f"{broker.name} {version}".strip()


def scenario_table(
    scenario: Scenario, brokers: Sequence[Broker], records: Sequence[dict[str, Any]]
) -> list[str]:
    runs = {
        b.key: [r for r in records if r["scenario"] == scenario.name and r["broker"] == b.key]
        for b in brokers
    }
    quiet = scenario.quiet
    has_latency = any(values(rs, "latency_ms", "p50") for rs in runs.values())
    cpu_head = "broker CPU s / 100k msgs (steady)" if quiet else "broker CPU s / 1M msgs"
    head = ["broker", "consume msg/s (min-max)", "publish msg/s", "consume / publish", cpu_head]
    head.append("generator CPU (% of a core)")
    if has_latency:
        head.append("latency p50 / p99 ms")
    head.append("backlog at end")
    lines = [
        f"### {scenario.name}: {scenario.title}",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 1),
    ]
    for broker in brokers:
        rs = runs[broker.key]
        consume = values(rs, "consume_rate")
        cons = statistics.median(consume) if consume else None
        spread = f" ({num(min(consume))}-{num(max(consume))})" if len(consume) > 1 else ""
        pub = median(rs, "publish_rate")
        ratios = [
            r["consume_rate"] / r["publish_rate"]
            for r in rs
            if not r.get("error") and r.get("publish_rate")
        ]
        cp = statistics.median(ratios) if ratios else None
        cpu = median(rs, "window", "cpu_s_per_100k") if quiet else median(rs, "cpu_s_per_million")
        gen = [
            100.0 * r["generator_cpu_s"] / r["wall_s"]
            for r in rs
            if not r.get("error") and r.get("wall_s")
        ]
        row = [
            version_label(broker),
            num(cons) + spread,
            num(pub),
            num(cp, 2),
            num(cpu, 2),
            num(statistics.median(gen) if gen else None),
        ]
        if has_latency:
            p50, p99 = median(rs, "latency_ms", "p50"), median(rs, "latency_ms", "p99")
            row.append(f"{ms(p50)} / {ms(p99)}" if p50 is not None else "n/a")
        row.append(num(median(rs, "backlog")))
        failed = sum(1 for r in rs if r.get("error"))
        if failed:
            row[0] += f" ({failed} of {len(rs)} runs failed)"
        lines.append("| " + " | ".join(row) + " |")
    errors = sorted(
        {
            f"{BROKERS[r['broker']]}: {r['error']}"
            for rs in runs.values()
            for r in rs
            if r.get("error")
        }
    )
    if errors:
        lines += ["", "Failures: " + "; ".join(errors)]
    return [*lines, ""]


def summary_table(
    scenarios: Sequence[Scenario], brokers: Sequence[Broker], records: Sequence[dict[str, Any]]
) -> list[str]:
    keys = [b.key for b in brokers]
    head = ["scenario", *(b.name for b in brokers)]
    pairs = [k for k in ("lavinmq", "rabbitmq") if "shoal" in keys and k in keys]
    head += [f"Shoal / {BROKERS[k]}" for k in pairs]
    lines = [
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 1),
    ]
    for scenario in scenarios:
        med = {
            k: median(
                [r for r in records if r["scenario"] == scenario.name and r["broker"] == k],
                "consume_rate",
            )
            for k in keys
        }
        row = [scenario.name, *(num(med[k]) for k in keys)]
        row += [ratio(med["shoal"], med[k]) for k in pairs]
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def cpu_summary_table(
    scenarios: Sequence[Scenario], brokers: Sequence[Broker], records: Sequence[dict[str, Any]]
) -> list[str]:
    head = ["scenario", *(b.name for b in brokers)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for scenario in scenarios:
        row = [scenario.name + (" (per 100k, steady)" if scenario.quiet else "")]
        for broker in brokers:
            rs = [
                r for r in records if r["scenario"] == scenario.name and r["broker"] == broker.key
            ]
            value = (
                median(rs, "window", "cpu_s_per_100k")
                if scenario.quiet
                else median(rs, "cpu_s_per_million")
            )
            row.append(num(value, 2))
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def shown_command(scenario: Scenario, opts: argparse.Namespace) -> str:
    if scenario.tool == SHOAL_PERF:
        cmd = perf_command("$URI", scenario.args, opts.duration, opts.warmup)
        return "python " + shlex.join(cmd[1:]).replace("'$URI'", "$URI")
    cmd = lavinmqperf_command(Path(LAVINMQPERF), "$URI", scenario, opts.duration, opts.latency)
    text = shlex.join(cmd).replace("'$URI'", "$URI")
    if scenario.quiet:
        text += f"   # stopped with SIGTERM after {opts.duration + QUIET_SETTLE_LINES} report lines"
    return text


def method_notes(opts: argparse.Namespace) -> list[str]:
    return [
        "All three brokers run side by side for the whole benchmark; each round runs every "
        "scenario, and each scenario the brokers in an order that turns every round "
        "(Shoal, LavinMQ, RabbitMQ; then LavinMQ, RabbitMQ, Shoal; ...). Before each run "
        "the scenario's queues are deleted; after it, once the generator's consumers are "
        "gone, the messages left in them are read (passive `queue.declare`, summed over "
        "the quiet scenario's 250 queues: *backlog at end*), then they are deleted.",
        "",
        "`lavinmqperf` (LavinMQ 2.9.1's generator: one process, Crystal, a fiber per "
        "client) declares its queues durable (every named queue, `-p` or not), publishes "
        "16 B bodies as fast as it can unless `-r` caps each publisher, and with `-a N` "
        "acks every N-th delivery per consumer with `multiple=true` (`-P` is the "
        "`basic.qos` prefetch). `-c N` keeps at most N publishes unconfirmed (a window, "
        "not a batch). Its rates are averages over `elapsed_seconds`, from the moment all "
        "clients are connected to the stop. `1-1-ack100` is `1-1-ack` with an ack every "
        "100 deliveries, the batch `shoal.perf` uses. `shoal.perf` scenarios are "
        "`bench/compare.py`'s, 64 B, with a named queue so the backlog can be read.",
        "",
        "Broker CPU is user + system time of the broker's whole process tree (psutil: the "
        "Shoal supervisor and its workers; LavinMQ's one process; RabbitMQ's beam.smp and "
        "its children), sampled right before and right after each generator run, divided "
        "by the messages consumed (consume rate x elapsed; for `shoal.perf` x (duration + "
        f"{opts.warmup:g} s warmup), since its CPU window spans the warmup). It includes "
        "connection setup and teardown, negligible but for the quiet scenario. There, 500 "
        "connections take seconds to open and lavinmqperf's `-z` timer starts before "
        "they do, so the script starts it with a long `-z`, samples the broker's CPU at "
        "each one-second report line (they start once every client is connected), stops "
        f"it with SIGTERM after {opts.duration} + {QUIET_SETTLE_LINES} lines and divides "
        f"the CPU from line {QUIET_SETTLE_LINES} to the last by the messages consumed "
        "between them (the lines' rates x their intervals): *CPU per 100k messages, "
        "steady*. Generator CPU is the generator's own (getrusage of the reaped child, "
        "its subprocesses included) over the run's wall time; it shares the two cores.",
        "",
        "In the quiet scenario, lavinmqperf's `--queue-pattern` gives consumer i queue "
        "i mod 250 (one consumer per queue), but every publisher rotates through all "
        "250 queues, message by message: each queue gets 40 msg/s in all, from all "
        "publishers, not one publisher's 40 msg/s. It always measures latency (`-l`: "
        "timestamp in the body; min/median/p75/p95/p99 in its JSON) since at a capped "
        "rate latency means something; `-l` costs lavinmqperf up to about 12 % of its uncapped "
        "throughput, so the other scenarios run without it unless `--latency` is given.",
        "",
    ]


def render(
    brokers: Sequence[Broker],
    scenarios: Sequence[Scenario],
    records: Sequence[dict[str, Any]],
    opts: argparse.Namespace,
    argv: Sequence[str],
    load: str,
    perf: Path,
    interrupted: bool = False,
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{version_label(b)}" for b in brokers)
    lines = [
        f"## Shoal, LavinMQ and RabbitMQ under lavinmqperf ({now})",
        "",
        f"Generated by `bench/peers.py`: {versions}. Medians over {opts.rounds} round(s) "
        f"of {opts.duration} s per run; min-max over the rounds in brackets. Shoal runs with "
        f"`--workers {opts.workers}`.",
        "",
        *machine_info(),
        f"- Load average (1, 5, 15 min) just before the runs: {load}",
        "",
        *busy_warning(load),
    ]
    if interrupted:
        lines += ["**Interrupted:** only the runs finished before the interrupt are counted.", ""]
    for broker in brokers:
        if broker.target.unavailable:
            lines += [f"{broker.name} was not measured: {broker.target.unavailable}", ""]
        for note in broker.notes:
            lines += [f"{broker.name}: {note}.", ""]
    lines += ["### Method", "", *method_notes(opts), "### Commands", "", "```"]
    lines.append("python " + shlex.join(["bench/peers.py", *argv]))
    for broker in brokers:
        if broker.target.start_command:
            lines.append(f"# {broker.name} ({broker.target.uri}): {broker.target.start_command}")
    lines.append(f"# lavinmqperf: {perf}; $URI is each broker's, as above")
    lines += [shown_command(s, opts) for s in scenarios]
    lines += ["```", "", "### Consume rate, msg/s (median)", ""]
    lines += summary_table(scenarios, brokers, records)
    lines += ["### Broker CPU seconds per million messages consumed (median)", ""]
    lines += cpu_summary_table(scenarios, brokers, records)
    for scenario in scenarios:
        lines += scenario_table(scenario, brokers, records)
    return "\n".join(lines).rstrip() + "\n"


# --- command line -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Shoal, LavinMQ and RabbitMQ side by side under lavinmqperf and shoal.perf."
    )
    names = ",".join(s.name for s in SCENARIOS)
    p.add_argument("--scenarios", default=names, help=f"comma list (default all: {names})")
    p.add_argument("--brokers", default="shoal,lavinmq,rabbitmq", help="comma list")
    p.add_argument("--rounds", type=int, default=3, help="rounds (medians reported)")
    p.add_argument("--duration", type=int, default=8, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="shoal.perf's unmeasured seconds")
    p.add_argument("--workers", type=int, default=2, help="Shoal IO workers (default 2)")
    p.add_argument("--shoal-args", default="", help="extra arguments for `python -m shoal.broker`")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    p.add_argument("--latency", action="store_true", help="lavinmqperf -l in every scenario")
    add_lavinmq_tools_argument(p)
    p.add_argument("--out", type=Path, help="write the Markdown section here too")
    p.add_argument("--json-out", type=Path, help="write every raw run here")
    return p


def parse_list(
    text: str, allowed: Sequence[str], what: str, p: argparse.ArgumentParser
) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [c for c in chosen if c not in allowed]
    if not chosen or unknown:
        p.error(
            f"--{what}: unknown {', '.join(unknown) or '(none)'}; choose from {', '.join(allowed)}"
        )
    return chosen


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT, SIGTERM or SIGHUP interrupts the runs; later ones are ignored,
    so that they cannot cut the brokers' stop and clean-up short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ignore_during_cleanup)
    raise KeyboardInterrupt(f"signal {signum}")


def ignore_during_cleanup(signum: int, frame: FrameType | None) -> None:
    print("stopping the brokers and cleaning up; please wait", file=sys.stderr, flush=True)


def lavinmqperf_binary(tools: Path) -> Path:
    """lavinmqperf, unpacked by run.sh (or here, should run.sh not have run)."""
    perf = lavinmq_home() / "lavinmqperf"
    if not os.access(perf, os.X_OK):
        perf.parent.mkdir(parents=True, exist_ok=True)
        partial = perf.with_name(f".lavinmqperf.{os.getpid()}")
        with open(partial, "wb") as out:
            subprocess.run(
                ["xz", "-dc", str(tools / "lavinmqperf.xz")], stdout=out, check=True, timeout=60
            )
        partial.chmod(0o755)
        partial.replace(perf)
    return perf


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    opts = parser.parse_args(args)
    scenarios = [BY_NAME[n] for n in parse_list(opts.scenarios, list(BY_NAME), "scenarios", parser)]
    keys = parse_list(opts.brokers, list(BROKERS), "brokers", parser)
    keys = [k for k in BROKERS if k in keys]  # always Shoal, LavinMQ, RabbitMQ in round 0
    if opts.rounds < 1 or opts.duration < 1:
        parser.error("--rounds and --duration must be at least 1")
    uses_lavinmq = any(s.tool == LAVINMQPERF for s in scenarios) or "lavinmq" in keys
    if uses_lavinmq and not (opts.lavinmq_tools / "run.sh").exists():
        parser.error(f"no LavinMQ tools at {opts.lavinmq_tools} (--lavinmq-tools)")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)
    load = load_average()
    records: list[dict[str, Any]] = []
    brokers: list[Broker] = []
    interrupted = False
    perf = lavinmqperf_binary(opts.lavinmq_tools)
    try:
        with contextlib.ExitStack() as stack:
            brokers = start_brokers(stack, keys, opts)
            run_rounds(brokers, scenarios, perf, opts, records)
            print("stopping the brokers", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: brokers stopped; reporting what was measured", file=sys.stderr)
    markdown = render(brokers, scenarios, records, opts, args, load, perf, interrupted)
    if opts.json_out:
        meta = {
            "generated_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "argv": args,
            "shoal": shoal_revision(),
            "brokers": {
                b.key: {
                    "version": b.version,
                    "uri": b.target.uri,
                    "start_command": b.target.start_command,
                    "unavailable": b.target.unavailable,
                }
                for b in brokers
            },
            "machine": machine_info(),
            "load_before": load,
            "interrupted": interrupted,
        }
        opts.json_out.write_text(json.dumps({"meta": meta, "runs": records}, indent=1) + "\n")
        print(f"wrote {opts.json_out}", file=sys.stderr)
    if opts.out:
        opts.out.write_text(markdown)
        print(f"wrote {opts.out}", file=sys.stderr)
    print(markdown)
    ok = any(not r.get("error") for r in records)
    return 130 if interrupted else (0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
