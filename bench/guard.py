"""The guard against drift: a pinned reference build against a candidate,
alternating, same load generator, each build installed in its own venv.

    python bench/guard.py                       # reference (bench/REFERENCE) vs HEAD
    python bench/guard.py --candidate tree      # vs the working tree, uncommitted changes included
    python bench/guard.py --candidate 1a2b3c4 --rounds 7 --rabbitmq
    python bench/guard.py --scenarios 1,3 --rounds 5 --json out.json

Each build is a `git worktree` of its commit with a venv of its own
(`.build/guard/`), installed with pip (not editable: each has its own compiled
C extensions), so neither build can see the other's code. Every run starts a
fresh broker of that build with `--workers 2` and its defaults otherwise
(metrics and, where the build has it, the management listener on: a new
user's broker). Runs alternate between the builds (and RabbitMQ with
`--rabbitmq`), the order turning every round, so background noise on the
machine hits all of them alike.

The load generator is this tree's `shoal.perf` (one OS process per producer
and per consumer, uvloop), for every build and for RabbitMQ.

Per scenario it prints the medians of consumed msg/s, the median of the
per-round ratios candidate / reference and their spread (min..max), and with
`--rabbitmq` candidate / RabbitMQ. A drop beyond the spread is a defect
(docs/benchmarks.md, "The guard").

The reference moves forward only to a commit measured at or above it in
every scenario: edit bench/REFERENCE, with the guard's table in the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import ui_watch  # noqa: E402
from bench.compare import (  # noqa: E402
    amqp_ready,
    free_port,
    perf_command,
    run_perf,
    started_rabbitmq,
    stop_process_group,
)

BUILDS = ROOT / ".build" / "guard"
REFERENCE_FILE = Path(__file__).resolve().parent / "REFERENCE"
COMMON = ("--prefetch", "500", "--multi-ack", "100")
STARTUP_TIMEOUT_S = 30.0
PERF_SLACK_S = 45.0


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    args: tuple[str, ...]
    # Needs the message store (durable queues, fsync before the confirm): a
    # reference without one is not comparable there.
    durable: bool = False


SCENARIOS = (
    Scenario("1to1", "1 -> 1, 64 B", ("--size", "64", *COMMON)),
    Scenario("4to4", "4 -> 4, 64 B, one queue", ("--producers", "4", "--consumers", "4",
                                                 "--size", "64", *COMMON)),
    Scenario("confirm", "1 -> 1, 64 B, confirms (window 200)",
             ("--size", "64", "--confirm", "200", *COMMON)),
    Scenario("4k", "1 -> 1, 4 KiB", ("--size", "4096", *COMMON)),
    Scenario("persist", "1 -> 1, 64 B, persistent + confirms (200)",
             ("--size", "64", "--persistent", "--confirm", "200", *COMMON), durable=True),
    Scenario("persist4", "4 -> 4, 64 B, persistent + confirms (200), one queue",
             ("--producers", "4", "--consumers", "4", "--size", "64", "--persistent",
              "--confirm", "200", *COMMON), durable=True),
    Scenario("fanout", "1 -> fanout exchange -> 10 queues, 64 B",
             ("--fanout", "10", "--consumers", "10", "--size", "64", *COMMON)),
)  # fmt: skip


@dataclass
class Build:
    """One commit (or the working tree), installed in a venv of its own."""

    label: str
    ref: str
    python: Path = Path()
    module: str = "shoal.broker"
    has_data_dir: bool = True
    has_management: bool = True
    mqtt_flags: list[str] = field(default_factory=list)  # its MQTT listener flags
    has_store: bool = True
    management_port: int = 0  # of the broker running now (0: none)
    commit: str = ""
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def reference_commit() -> str:
    """The first word of bench/REFERENCE's first non-comment line."""
    for line in REFERENCE_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return line.split()[0]
    raise SystemExit(f"{REFERENCE_FILE}: no commit named")


def source_tree(ref: str) -> tuple[Path, str]:
    """A checkout of `ref` (a commit-ish, or "tree": this working tree as it is)."""
    if ref == "tree":
        return ROOT, git("rev-parse", "--short", "HEAD") + "+tree"
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = BUILDS / f"src-{commit[:12]}"
    if not (tree / "pyproject.toml").exists():
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "prune")
        if tree.exists():
            shutil.rmtree(tree)
        git("worktree", "add", "--detach", str(tree), commit)
    return tree, commit[:12]


def install(build: Build) -> None:
    """The venv of `build.ref`: made and installed once per commit; the
    working tree ("tree") is reinstalled every time (it may have changed)."""
    tree, build.commit = source_tree(build.ref)
    venv = BUILDS / f"venv-{build.commit if build.ref != 'tree' else 'tree'}"
    stamp = venv / ".installed"
    if build.ref == "tree" or not stamp.exists():
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # Built in a copy: an in-tree build would leave build/ behind in `tree`.
        with tempfile.TemporaryDirectory(prefix="shoal-guard-src-") as copy:
            src = Path(copy) / "src"
            shutil.copytree(
                tree, src, ignore=shutil.ignore_patterns(".git", ".venv", ".build", "build")
            )
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                 "--force-reinstall", "--no-deps", str(src)],
                check=True,
            )  # fmt: skip
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
                check=True,
            )
        stamp.write_text(build.commit + "\n")
    build.python = venv / "bin" / "python"
    pyproject = (tree / "pyproject.toml").read_text()
    build.module = "shoal.broker" if '"shoal.broker" = "broker"' in pyproject else "broker"
    cli = tree / "broker" / "cli.py"
    cli_text = cli.read_text() if cli.exists() else ""
    build.has_data_dir = "--data-dir" in cli_text
    build.has_management = "--management-port" in cli_text
    # Builds whose MQTT listeners are on by default (1883 may be taken): off.
    build.mqtt_flags = [
        flag for flag in ("--mqtt-port", "--mqtts-port", "--mqtt-ws-port") if flag in cli_text
    ]
    build.has_store = (tree / "store").is_dir()


@contextlib.contextmanager
def started(build: Build, workers: int) -> Iterator[str]:
    """A fresh broker of `build`, stopped (its whole process group) after."""
    port = free_port()
    runtime = tempfile.mkdtemp(prefix="shoal-guard-")
    cmd = [str(build.python), "-m", build.module, "--bind", "127.0.0.1", "--port", str(port),
           "--workers", str(workers), "--runtime-dir", runtime,
           "--metrics-port", str(free_port())]  # fmt: skip
    if build.has_data_dir:
        cmd += ["--data-dir", os.path.join(runtime, "data")]
    build.management_port = free_port() if build.has_management else 0
    if build.has_management:
        cmd += ["--management-port", str(build.management_port)]
    for flag in build.mqtt_flags:
        cmd += [flag, "0"]
    proc = subprocess.Popen(
        cmd, cwd=runtime, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not amqp_ready("127.0.0.1", port):
            if proc.poll() is not None:
                raise RuntimeError(f"{build.label}: broker exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{build.label}: no AMQP after {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        stop_process_group(proc)
        shutil.rmtree(runtime, ignore_errors=True)


def one_run(uri: str, scenario: Scenario, opts: argparse.Namespace) -> dict[str, Any]:
    cmd = perf_command(uri, scenario.args, opts.duration, opts.warmup)
    return run_perf(cmd, opts.duration + opts.warmup + PERF_SLACK_S)


def consumed(report: dict[str, Any]) -> float | None:
    if report.get("fatal"):
        return None
    value = report.get("consumed_rate")
    return float(value) if value is not None else None


def confirm_p99(report: dict[str, Any]) -> float | None:
    latency = report.get("confirm_latency_ms") or {}
    value = latency.get("p99")
    return float(value) if value is not None and not report.get("fatal") else None


def median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def pair_ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[float]:
    """Round by round a / b (the runs of one round sat side by side)."""
    out = []
    for x, y in zip(a, b, strict=False):
        cx, cy = consumed(x), consumed(y)
        if cx and cy:
            out.append(cx / cy)
    return out


def fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def ratio_cell(ratios: list[float]) -> str:
    if not ratios:
        return "n/a"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})"


def report(
    builds: list[Build], rabbit: Build | None, scenarios: Sequence[Scenario], opts: Any
) -> tuple[str, dict[str, Any]]:
    ref, cand = builds
    lines = [
        f"Guard run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{platform.node()} ({os.cpu_count()} CPUs, load average before "
        f"{opts.load_before}); {opts.rounds} rounds of {opts.duration:g} s "
        f"(+{opts.warmup:g} s warmup), --workers {opts.workers}, consumed msg/s medians.",
        f"reference {ref.commit} ({ref.ref}), candidate {cand.commit}.",
        "",
    ]
    head = "| scenario | reference | candidate | candidate / reference (min..max) |"
    rule = "|---|---:|---:|---:|"
    if rabbit is not None:
        head += " RabbitMQ | candidate / RabbitMQ (min..max) | confirm p99 ms cand / RabbitMQ |"
        rule += "---:|---:|---:|"
    lines += [head, rule]
    data: dict[str, Any] = {"reference": ref.commit, "candidate": cand.commit, "scenarios": {}}
    for s in scenarios:
        r_runs, c_runs = ref.runs.get(s.key, []), cand.runs.get(s.key, [])
        ratios = pair_ratios(c_runs, r_runs)
        r_cell = fmt(median([consumed(x) for x in r_runs]))
        vs_ref = ratio_cell(ratios)
        if s.durable and not ref.has_store:
            vs_ref += " (reference keeps nothing on disk)"
        row = f"| {s.title} | {r_cell} | {fmt(median([consumed(x) for x in c_runs]))} | {vs_ref} |"
        entry: dict[str, Any] = {
            "reference": [consumed(x) for x in r_runs],
            "candidate": [consumed(x) for x in c_runs],
            "ratios": ratios,
        }
        if rabbit is not None:
            q_runs = rabbit.runs.get(s.key, [])
            vs_rabbit = pair_ratios(c_runs, q_runs)
            p99 = "n/a"
            if "--confirm" in s.args:
                p99 = (
                    f"{fmt(median([confirm_p99(x) for x in c_runs]), 2)} / "
                    f"{fmt(median([confirm_p99(x) for x in q_runs]), 2)}"
                )
            row += (
                f" {fmt(median([consumed(x) for x in q_runs]))} | {ratio_cell(vs_rabbit)} | {p99} |"
            )
            entry["rabbitmq"] = [consumed(x) for x in q_runs]
            entry["vs_rabbitmq"] = vs_rabbit
            entry["confirm_p99"] = {
                "candidate": [confirm_p99(x) for x in c_runs],
                "rabbitmq": [confirm_p99(x) for x in q_runs],
            }
        lines.append(row)
        data["scenarios"][s.key] = entry
    return "\n".join(lines), data


def parse_scenarios(text: str) -> list[Scenario]:
    if text == "all":
        return list(SCENARIOS)
    picked = []
    for part in text.split(","):
        part = part.strip()
        match = [s for i, s in enumerate(SCENARIOS) if part in (s.key, str(i + 1))]
        if not match:
            raise SystemExit(f"unknown scenario {part!r}: {[s.key for s in SCENARIOS]}")
        picked += match
    return picked


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reference", default=None, help="commit (default: bench/REFERENCE)")
    p.add_argument("--candidate", default="HEAD", help='commit, or "tree" (the working tree)')
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scenarios", default="all", help="keys or numbers, comma-separated")
    p.add_argument("--rabbitmq", action="store_true", help="RabbitMQ 3.10 in the same rounds")
    p.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    p.add_argument(
        "--ui",
        choices=("api", "browser"),
        default=None,
        help="the candidate's runs with its web UI open (Overview and Queues, refreshed "
        "every 5 s): 'api' sends the page's requests from here, as a browser on an "
        "operator's desk does; 'browser' runs headless Chromium on this machine "
        "(bench/ui_watch.py)",
    )
    opts = p.parse_args(argv)
    scenarios = parse_scenarios(opts.scenarios)
    builds = [
        Build("reference", opts.reference or reference_commit()),
        Build("candidate", opts.candidate),
    ]
    for build in builds:
        install(build)
        print(f"{build.label}: {build.commit} in {build.python.parent.parent}", flush=True)
    opts.load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with contextlib.ExitStack() as stack:
        watch = stack.enter_context(ui_watch.watcher(opts.ui)) if opts.ui else None
        rabbit: Build | None = None
        targets: list[Build] = list(builds)
        if opts.rabbitmq:
            node = stack.enter_context(started_rabbitmq())
            if node.uri is None:
                raise SystemExit(node.unavailable)
            rabbit = Build("RabbitMQ", "rabbitmq", commit="3.10")
            rabbit_uri = node.uri
            targets.append(rabbit)
        for round_no in range(opts.rounds):
            for s in scenarios:
                # Turn the order every round: nobody always runs first.
                shift = round_no % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    if target is rabbit:
                        result = one_run(rabbit_uri, s, opts)
                    else:
                        with started(target, opts.workers) as uri:
                            if watch is not None and target.label == "candidate":
                                with watch(target.management_port):
                                    result = one_run(uri, s, opts)
                            else:
                                result = one_run(uri, s, opts)
                    target.runs.setdefault(s.key, []).append(result)
                    rate = consumed(result)
                    err = "; ".join(result.get("errors") or [])
                    print(
                        f"round {round_no + 1} {s.key:9} {target.label:9} "
                        f"{fmt(rate):>9} msg/s {err}",
                        flush=True,
                    )
    text, data = report(builds, rabbit, scenarios, opts)
    print()
    print(text)
    if opts.json is not None:
        opts.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
