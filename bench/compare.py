"""Compare Shoal with RabbitMQ on this machine and write docs/benchmarks.md.

Every scenario runs ``python -m shoal.perf ... --json`` against each broker.  Runs
alternate between the brokers (Shoal, RabbitMQ, Shoal, RabbitMQ, ...) so that
background noise on the machine hits both alike, and each table reports the median
over ``--rounds``.

    python bench/compare.py --start-shoal --start-rabbitmq --rounds 3
    python bench/compare.py --shoal-uri amqp://guest:guest@127.0.0.1:5672/ \\
        --rabbit-uri amqp://guest:guest@127.0.0.1:5673/

``--client-ceiling`` adds the load generator's own ceiling, measured against a null
broker that answers the handshake, then discards publishes or streams deliveries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shoal.broker.cli import local_command

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "docs" / "benchmarks.md"
SHOAL = "Shoal"
RABBIT = "RabbitMQ"
STARTUP_TIMEOUT_S = 20.0
RABBIT_STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
# perf bounds itself to duration + warmup + 30 s; a little on top catches a wedged run.
PERF_SLACK_S = 45.0


@dataclass(frozen=True)
class Scenario:
    title: str
    args: tuple[str, ...]


COMMON = ("--prefetch", "500", "--multi-ack", "100")
SCENARIOS = (
    Scenario("1 producer -> 1 consumer, 64 B, no confirms", ("--size", "64", *COMMON)),
    Scenario("1 producer -> 1 consumer, 4 KiB, no confirms", ("--size", "4096", *COMMON)),
    Scenario(
        "4 producers -> 4 consumers, 64 B, no confirms",
        ("--producers", "4", "--consumers", "4", "--size", "64", *COMMON),
    ),
    Scenario(
        "1 producer -> 1 consumer, 64 B, confirms (window 200)",
        ("--size", "64", "--confirm", "200", *COMMON),
    ),
    Scenario(
        "1 producer -> fanout exchange -> 10 queues, 1 consumer each, 64 B",
        ("--fanout", "10", "--consumers", "10", "--size", "64", *COMMON),
    ),
)


@dataclass
class Target:
    """A broker under test, and how it was started (for the report)."""

    name: str
    uri: str | None
    start_command: str | None = None
    unavailable: str | None = None
    version: str = ""
    runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


# --- helpers ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def amqp_ready(host: str, port: int) -> bool:
    """True once the port answers an AMQP protocol header with a method frame."""
    try:
        with socket.create_connection((host, port), timeout=2.0) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            first = sock.recv(7)
            return len(first) >= 1 and first[0] == 1  # Connection.Start
    except OSError:
        return False


def wait_until(condition: Any, timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def host_port(uri: str) -> tuple[str, int]:
    parts = urlsplit(uri)
    return parts.hostname or "127.0.0.1", parts.port or 5672


# --- Shoal ------------------------------------------------------------------------

SHM = "/dev/shm"


@contextlib.contextmanager
def started_shoal(workers: int, extra: Sequence[str]) -> Iterator[Target]:
    """Run ``python -m shoal.broker`` for the duration of the block; stop it after."""
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="shoal-bench-")  # the data directory: on disk
    # The runtime directory (the shared-memory segment) on tmpfs, as the
    # broker's default /dev/shm/shoal-<port>: under /tmp, a disk file system
    # here, the segment's first touches went through the page cache to disk
    # and stalled a fresh broker's first runs (bench/mqtt.py found it).
    runtime = tempfile.mkdtemp(prefix="shoal-bench-", dir=SHM if os.path.isdir(SHM) else None)
    cmd = local_command(port, workers, runtime, *extra, data_dir=os.path.join(scratch, "data"))
    log_path = Path(scratch) / "broker.log"
    shown = "python " + shlex.join(cmd[1:])
    target = Target(SHOAL, f"amqp://guest:guest@127.0.0.1:{port}/", shown)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            ready = wait_until(
                lambda: proc.poll() is not None or amqp_ready("127.0.0.1", port), STARTUP_TIMEOUT_S
            )
            if proc.poll() is not None or not ready:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                target.unavailable = "Shoal did not start: " + (" | ".join(tail) or "no output")
                target.uri = None
            yield target
        finally:
            stop_process_group(proc)
            shutil.rmtree(runtime, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    # The broker's own children share its session; make sure none outlives it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(5)


# --- RabbitMQ ---------------------------------------------------------------------


def rabbit_env(port: int, base: Path) -> dict[str, str]:
    """Environment for a private RabbitMQ node that clashes with no other node."""
    node = f"shoalbench{port}@localhost"
    plugins = base / "enabled_plugins"
    plugins.write_text("[].\n")
    return {
        **os.environ,
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
    }


def _epmd_running() -> bool:
    return subprocess.run(["epmd", "-names"], capture_output=True, timeout=10).returncode == 0


def start_rabbitmq_node(
    env: dict[str, str],
    ctl: list[str],
    port: int,
    prefix: Sequence[str] = (),
    server_env: dict[str, str] | None = None,
) -> None:
    """`rabbitmq-server -detached` (after `prefix`, in `server_env`: bench/mqtt.py
    starts it as the rabbitmq user), then wait for its AMQP port."""
    subprocess.run(
        [*prefix, "rabbitmq-server", "-detached"],
        env=server_env or env,
        check=True,
        timeout=60,
    )
    deadline = time.monotonic() + RABBIT_STARTUP_TIMEOUT_S
    while not amqp_ready("127.0.0.1", port):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no AMQP on port {port} after {RABBIT_STARTUP_TIMEOUT_S:.0f} s")
        # await_startup blocks until the node boots, or fails at once while the node
        # is not registered yet; either way the loop stays bounded by the deadline.
        wait = str(max(1, min(60, int(remaining))))
        subprocess.run(
            [*ctl, "await_startup", "--timeout", wait],
            env=env,
            capture_output=True,
            timeout=remaining + 10,
        )
        time.sleep(0.5)


@contextlib.contextmanager
def started_rabbitmq() -> Iterator[Target]:
    port = free_port()
    base = Path(tempfile.mkdtemp(prefix="shoal-bench-rabbit-"))
    env = rabbit_env(port, base)
    if os.geteuid() == 0:
        # Debian's wrapper drops to the rabbitmq user, which must own the node's files.
        for path in (base, base / "enabled_plugins"):
            with contextlib.suppress(LookupError, OSError):
                shutil.chown(path, "rabbitmq", "rabbitmq")
    epmd_before = shutil.which("epmd") is not None and _epmd_running()
    shown_env = " ".join(
        f"{k}={v}" for k, v in env.items() if k.startswith("RABBITMQ_") and k not in os.environ
    )
    target = Target(
        RABBIT, f"amqp://guest:guest@127.0.0.1:{port}/", f"{shown_env} rabbitmq-server -detached"
    )
    ctl = ["rabbitmqctl", "-n", env["RABBITMQ_NODENAME"]]
    try:
        try:
            start_rabbitmq_node(env, ctl, port)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            target.unavailable = f"RabbitMQ did not start: {exc}"
            target.uri = None
        yield target
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([*ctl, "stop"], env=env, capture_output=True, timeout=60)
        if not epmd_before and shutil.which("epmd"):
            # The node started epmd; leave the machine as we found it.
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["epmd", "-kill"], capture_output=True, timeout=10)
        shutil.rmtree(base, ignore_errors=True)


# --- null broker for the load generator's own ceiling -----------------------------


def _null_broker_main(port: int, size: int, ready: Any) -> None:
    import uvloop
    from pamqp import commands, frame, header

    deliver = frame.marshal(
        commands.Basic.Deliver("null", 1, False, "", "perf-xxxxxxxxxxxx"), 1
    ) + frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1)
    body_head = deliver + struct.pack(">BHI", 3, 1, size)
    body_tail = b"\x00" * max(0, size - 8) + b"\xce"

    class NullBroker(asyncio.Protocol):
        """Answers every synchronous method, then drops publishes or floods deliveries."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.buf = b""
            self.sink = False
            self.paused = False

        def data_received(self, data: bytes) -> None:
            if self.sink:
                return
            self.buf += data
            if self.buf.startswith(b"AMQP"):
                self.buf = self.buf[8:]
                start = commands.Connection.Start(server_properties={"product": "null"})
                self.transport.write(frame.marshal(start, 0))
            while self.buf and not self.sink:
                try:
                    used, channel, value = frame.unmarshal(self.buf)
                except Exception:  # an incomplete frame: wait for more bytes
                    return
                self.buf = self.buf[used:]
                self.reply(channel, value)

        def reply(self, channel: int, value: Any) -> None:
            replies = {
                commands.Connection.StartOk: commands.Connection.Tune(10, 131072, 0),
                commands.Connection.Open: commands.Connection.OpenOk(),
                commands.Channel.Open: commands.Channel.OpenOk(),
                commands.Queue.Declare: commands.Queue.DeclareOk("q", 0, 0),
                commands.Queue.Delete: commands.Queue.DeleteOk(0),
                commands.Basic.Qos: commands.Basic.QosOk(),
                commands.Confirm.Select: commands.Confirm.SelectOk(),
                commands.Connection.Close: commands.Connection.CloseOk(),
                commands.Basic.Consume: commands.Basic.ConsumeOk("null"),
            }
            answer = replies.get(type(value))
            if answer is not None:
                self.transport.write(frame.marshal(answer, channel))
            if isinstance(value, commands.Basic.Consume):
                self.sink = True
                asyncio.get_running_loop().call_soon(self.flood)
            elif isinstance(value, commands.Basic.Publish):
                self.sink = True

        def flood(self) -> None:
            while not self.paused and not self.transport.is_closing():
                stamp = struct.pack(">Q", time.monotonic_ns())
                self.transport.write((body_head + stamp + body_tail) * 250)

        def pause_writing(self) -> None:
            self.paused = True

        def resume_writing(self) -> None:
            self.paused = False
            asyncio.get_running_loop().call_soon(self.flood)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(NullBroker, "127.0.0.1", port)
        ready.set()
        await asyncio.sleep(3600)

    uvloop.run(serve())


@contextlib.contextmanager
def null_broker(size: int) -> Iterator[str]:
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    port = free_port()
    proc = ctx.Process(target=_null_broker_main, args=(port, size, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("null broker did not start")
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        proc.kill()
        proc.join(5)


# --- running perf -----------------------------------------------------------------


def perf_command(uri: str, args: Sequence[str], duration: float, warmup: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "shoal.perf",
        "--uri",
        uri,
        *args,
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--json",
    ]


def run_perf(cmd: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"errors": [f"perf timed out after {timeout:.0f} s"], "fatal": True}
    lines = proc.stdout.strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"errors": [f"perf exited {proc.returncode}: {detail}"], "fatal": True}
    return report


def run_rounds(targets: list[Target], scenarios: Sequence[int], opts: argparse.Namespace) -> None:
    live = [t for t in targets if t.uri]
    for round_no in range(opts.rounds):
        for index in scenarios:
            scenario = SCENARIOS[index]
            for target in live:
                assert target.uri is not None
                cmd = perf_command(target.uri, scenario.args, opts.duration, opts.warmup)
                report = run_perf(cmd, opts.duration + opts.warmup + PERF_SLACK_S)
                target.runs.setdefault(index, []).append(report)
                target.version = target.version or report.get("server", "")
                print(
                    f"round {round_no + 1} [{index + 1}] {target.name}: {summary_line(report)}",
                    flush=True,
                )
                # Let the broker settle (close connections, delete the queue) first.
                time.sleep(opts.pause)


def summary_line(report: dict[str, Any]) -> str:
    if report.get("fatal"):
        return "FAILED " + "; ".join(report.get("errors", []))
    latency = report.get("latency_ms") or {}
    p50, p99 = latency.get("p50", float("nan")), latency.get("p99", float("nan"))
    text = (
        f"published {report['published_rate']:.0f}/s consumed {report['consumed_rate']:.0f}/s "
        f"p50 {p50:.2f} ms p99 {p99:.2f} ms"
    )
    errors = report.get("errors") or []
    return text + (f" (errors: {'; '.join(errors)})" if errors else "")


# --- report -----------------------------------------------------------------------


def metric(reports: list[dict[str, Any]], key: str, sub: str | None = None) -> float | None:
    """Median of one metric over the successful rounds."""
    values = []
    for report in reports:
        if report.get("fatal"):
            continue
        value = report.get(key)
        if sub is not None:
            value = (value or {}).get(sub)
        if value is not None:
            values.append(float(value))
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


ROWS = (
    ("consumed msg/s", "consumed_rate", None, 0),
    ("published msg/s", "published_rate", None, 0),
    ("latency p50 (ms)", "latency_ms", "p50", 2),
    ("latency p99 (ms)", "latency_ms", "p99", 2),
    ("confirm latency p50 (ms)", "confirm_latency_ms", "p50", 2),
    ("confirm latency p99 (ms)", "confirm_latency_ms", "p99", 2),
    ("load generator CPU (% of one core)", "client_cpu_percent", None, 0),
)


def scenario_table(index: int, shoal: Target, rabbit: Target) -> list[str]:
    scenario = SCENARIOS[index]
    a, b = shoal.runs.get(index, []), rabbit.runs.get(index, [])
    rabbit_label = f"RabbitMQ {rabbit.version.removeprefix('RabbitMQ ')}".strip()
    lines = [
        f"### {index + 1}. {scenario.title}",
        "",
        f"`perf` options: `{shlex.join(scenario.args)}`",
        "",
        f"| | Shoal | {rabbit_label} | Shoal / RabbitMQ |",
        "|---|---:|---:|---:|",
    ]
    for label, key, sub, digits in ROWS:
        if key == "confirm_latency_ms" and "--confirm" not in scenario.args:
            continue
        va, vb = metric(a, key, sub), metric(b, key, sub)
        lines.append(f"| {label} | {fmt(va, digits)} | {fmt(vb, digits)} | {ratio(va, vb)} |")
    per_round = [
        ", ".join(fmt(r.get("consumed_rate")) if not r.get("fatal") else "failed" for r in runs)
        for runs in (a, b)
    ]
    lines.append(f"| consumed msg/s per round | {per_round[0]} | {per_round[1]} | |")
    errors = [
        f"{t.name}: {e}"
        for t in (shoal, rabbit)
        for r in t.runs.get(index, [])
        for e in r.get("errors", [])
    ]
    if errors:
        lines += ["", "Errors: " + "; ".join(sorted(set(errors)))]
    return [*lines, ""]


def machine_info() -> list[str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores (brokers and load generator share them)",
        f"- RAM: {mem_gib:.1f} GiB",
        f"- Kernel: Linux {platform.release()}",
        f"- Python: {platform.python_version()} ({platform.python_implementation()})",
        f"- Erlang/OTP (RabbitMQ): {erlang_version()}",
        f"- Shoal: {shoal_revision()}",
    ]


def erlang_version() -> str:
    versions = sorted(
        p.read_text().strip() for p in Path("/usr/lib/erlang/releases").glob("*/OTP_VERSION")
    )
    return versions[-1] if versions else "unknown"


def shoal_revision() -> str:
    """The commit measured, flagged when the working tree had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return f"commit {head}" + (" with uncommitted changes" if dirty else "")


def busy_warning(load: str) -> list[str]:
    """A warning when other work shared the machine: its numbers are noisy."""
    cores = os.cpu_count() or 1
    try:
        recent = float(load.split()[0])
    except (ValueError, IndexError):
        return []
    if recent <= cores / 2:
        return []
    return [
        f"**Note:** the machine was busy with other work (1-minute load average "
        f"{recent:.1f} on {cores} cores before the runs), so the numbers are lower and "
        "noisier than on an idle machine. Alternating the runs spreads that noise over "
        "both brokers; rerun on an idle machine for absolute figures.",
        "",
    ]


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "unknown"


def write_report(
    path: Path,
    targets: list[Target],
    scenarios: Sequence[int],
    opts: argparse.Namespace,
    argv: Sequence[str],
    ceiling: list[str],
    load: str,
) -> None:
    shoal = next(t for t in targets if t.name == SHOAL)
    rabbit = next(t for t in targets if t.name == RABBIT)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    example_args = SCENARIOS[scenarios[0]].args
    lines = [
        "# Benchmarks: Shoal vs RabbitMQ",
        "",
        f"Generated by `bench/compare.py` on {now}. Numbers are medians over {opts.rounds} "
        f"round(s) of {opts.duration:g} s each (after a {opts.warmup:g} s warmup); runs "
        "alternate between the brokers so background noise hits both.",
        "",
        "## Machine",
        "",
        *machine_info(),
        f"- Load average (1, 5, 15 min) just before the runs: {load}",
        "",
        *busy_warning(load),
        "## Method",
        "",
        "The load generator is the `perf` package (`shoal perf`): one OS process per producer and "
        "per consumer, each with a uvloop event loop and one connection. Producers publish "
        "as fast as the broker accepts (TCP backpressure, no rate cap) to a fresh "
        "non-durable queue; consumers use `basic.qos` prefetch 500 and ack with "
        "`multiple=true` every 100 deliveries. Latency is measured from the publish "
        "timestamp in each body to its delivery (messages written by one socket write share "
        "a timestamp). Published msg/s counts messages written to the socket, consumed "
        "msg/s counts deliveries; both only inside the measured window. With uncapped "
        "producers, latency is "
        "mostly time spent queued behind the backlog that builds when producers outrun "
        "consumers, so it grows with the run length; compare it between brokers, not "
        "with capped-rate figures.",
        "",
        "The load generator runs on the same cores as the broker, so its CPU use (last "
        "row of each table) is CPU the broker did not get.",
        "",
        "## Commands",
        "",
        "```",
        "python " + shlex.join(["bench/compare.py", *argv]),
    ]
    for target in targets:
        if target.start_command:
            lines.append(f"# {target.name}: {target.start_command}")
    for target in targets:
        uri = target.uri or "<unavailable>"
        lines.append(
            "python -m shoal.perf "
            + shlex.join(
                [
                    "--uri",
                    uri,
                    *example_args,
                    "--duration",
                    f"{opts.duration:g}",
                    "--warmup",
                    f"{opts.warmup:g}",
                    "--json",
                ]
            )
        )
    lines += [
        "```",
        "",
        "Each scenario passes its own options to `perf` (shown under its heading).",
        "",
        "## Results",
        "",
    ]
    for target in targets:
        if target.unavailable:
            lines += [f"{target.name} was not measured: {target.unavailable}", ""]
    for index in scenarios:
        lines += scenario_table(index, shoal, rabbit)
    lines += ceiling
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n" + kept_sections(path))


KEEP_MARKER = "<!-- Hand-written below this line: bench/compare.py keeps it. -->"


def kept_sections(path: Path) -> str:
    """The hand-written analysis after KEEP_MARKER in the previous report
    (profiles, the choice of --workers), carried over when regenerating."""
    try:
        old = path.read_text()
    except OSError:
        return ""
    at = old.find(KEEP_MARKER)
    return "" if at < 0 else "\n" + old[at:]


def measure_ceiling(opts: argparse.Namespace) -> list[str]:
    """Rates of one producer and one consumer process against the null broker."""
    lines = [
        "## Load generator ceiling",
        "",
        "One `perf` process against a null broker (in `bench/compare.py`) that "
        "answers the handshake and then discards publishes or streams deliveries as fast "
        "as it can, so these are the client's own limits on this machine:",
        "",
        "| role | 64 B msg/s | 4 KiB msg/s |",
        "|---|---:|---:|",
    ]
    for role, args in (("producer", ("--consumers", "0")), ("consumer", ("--producers", "0"))):
        rates = []
        for size in (64, 4096):
            with null_broker(size) as uri:
                cmd = perf_command(uri, (*args, "--size", str(size)), opts.ceiling_duration, 1)
                report = run_perf(cmd, opts.ceiling_duration + 1 + PERF_SLACK_S)
            key = "published_rate" if role == "producer" else "consumed_rate"
            rates.append(None if report.get("fatal") else report.get(key))
            print(f"ceiling {role} {size} B: {summary_line(report)}", flush=True)
        lines.append(f"| one {role} | {fmt(rates[0])} | {fmt(rates[1])} |")
    return [*lines, ""]


# --- command line -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Benchmark Shoal against RabbitMQ.")
    p.add_argument("--shoal-uri", help="use an already running Shoal")
    p.add_argument("--rabbit-uri", help="use an already running RabbitMQ")
    p.add_argument("--start-shoal", action="store_true", help="start `python -m shoal.broker`")
    p.add_argument("--start-rabbitmq", action="store_true", help="start a private RabbitMQ node")
    p.add_argument("--workers", type=int, default=2, help="Shoal IO workers (default 2)")
    p.add_argument("--shoal-args", default="", help="extra arguments for `python -m shoal.broker`")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per run")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds (median reported)")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    p.add_argument(
        "--scenarios", default="1,2,3,4,5", help="comma-separated scenario numbers (default all)"
    )
    p.add_argument("--client-ceiling", action="store_true", help="also measure the client")
    p.add_argument("--ceiling-duration", type=float, default=5.0)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="markdown report path")
    p.add_argument("--no-write", action="store_true", help="print results only")
    return p


def parse_scenarios(text: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        chosen = [int(part) - 1 for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error("--scenarios takes numbers like 1,3")
    if not chosen or any(not 0 <= i < len(SCENARIOS) for i in chosen):
        parser.error(f"--scenarios must be between 1 and {len(SCENARIOS)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    opts = parser.parse_args(args)
    scenarios = parse_scenarios(opts.scenarios, parser)
    if not (opts.shoal_uri or opts.start_shoal) and not (opts.rabbit_uri or opts.start_rabbitmq):
        parser.error("give --shoal-uri/--start-shoal and/or --rabbit-uri/--start-rabbitmq")
    load_before = load_average()
    with contextlib.ExitStack() as stack:
        targets = [
            select_target(stack, SHOAL, opts.shoal_uri, opts.start_shoal, opts),
            select_target(stack, RABBIT, opts.rabbit_uri, opts.start_rabbitmq, opts),
        ]
        for target in targets:
            if target.unavailable:
                print(f"{target.name}: {target.unavailable}", file=sys.stderr)
        run_rounds(targets, scenarios, opts)
    ceiling = measure_ceiling(opts) if opts.client_ceiling else []
    if not opts.no_write:
        write_report(opts.output, targets, scenarios, opts, args, ceiling, load_before)
        print(f"wrote {opts.output}")
    measured = any(
        r for t in targets for runs in t.runs.values() for r in runs if not r.get("fatal")
    )
    return 0 if measured else 1


def select_target(
    stack: contextlib.ExitStack, name: str, uri: str | None, start: bool, opts: argparse.Namespace
) -> Target:
    if uri:
        target = Target(name, uri)
        if not amqp_ready(*host_port(uri)):
            target.unavailable = f"nothing answers AMQP at {uri}"
            target.uri = None
        return target
    if not start:
        return Target(name, None, unavailable="not requested")
    if name == SHOAL:
        return stack.enter_context(started_shoal(opts.workers, shlex.split(opts.shoal_args)))
    return stack.enter_context(started_rabbitmq())


if __name__ == "__main__":
    sys.exit(main())
