"""What the statistics, the metrics endpoint and the publish-path checks
(capacity, length limits, memory guard) cost: 1 producer -> 1 consumer
throughput of this tree against a baseline commit, runs alternating.

    python bench/overhead.py --baseline 4b32ed5 --rounds 3 [--rabbitmq]
    python bench/overhead.py --baseline 4b32ed5 --producers 4 --consumers 4 --no-scrape

Variants, each a fresh 2-worker broker per run:

    baseline        the --baseline commit (built in a temporary git worktree),
                    --metrics-port 0
    this tree       --metrics-port 0
    this tree, scraped   the metrics endpoint on, /metrics and
                    /metrics/per-object scraped every --scrape-interval s
    RabbitMQ        (--rabbitmq) RabbitMQ 3.10 from Debian, same load

Prints a Markdown table of the medians (msg/s consumed) for docs/benchmarks.md.
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
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import amqp_ready, free_port, perf_command, started_rabbitmq  # noqa: E402
from shoal.broker.cli import local_command  # noqa: E402

PERF = ("--size", "64", "--prefetch", "500", "--multi-ack", "100")


def build_baseline(ref: str, where: Path) -> Path:
    """A worktree of `ref`, with this tree's built C extension when `ref`'s
    shm/_atomic.c is the same (building it there would need the setuptools
    of an isolated build, not the venv's), else built in place."""
    tree = where / "baseline"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    same = (tree / "shm" / "_atomic.c").read_bytes() == (ROOT / "shm" / "_atomic.c").read_bytes()
    built = sorted((ROOT / "shm").glob("_atomic*.so"))
    if same and built:
        shutil.copy(built[0], tree / "shm" / built[0].name)
    else:
        subprocess.run(
            [sys.executable, "-c", "from setuptools import setup; setup()", "build_ext", "-i"],
            cwd=tree,
            check=True,
            capture_output=True,
        )
    return tree


def namespaced(tree: Path) -> bool:
    """Whether `tree` installs its packages under shoal. (pyproject.toml)."""
    return '"shoal.broker" = "broker"' in (tree / "pyproject.toml").read_text()


def command(tree: Path, port: int, runtime: str, metrics_port: int) -> tuple[list[str], str]:
    """The broker's command line and PYTHONPATH for `tree`. This tree runs
    as the installed shoal.broker; a baseline from before the shoal
    namespace as `broker` from its worktree; a later baseline as shoal.broker
    through a link tree of its own folders, found before the installed one."""
    cmd = local_command(port, 2, runtime, "--metrics-port", str(metrics_port))
    if tree == ROOT:
        return cmd, str(tree)
    if "--data-dir" not in (tree / "broker" / "cli.py").read_text():
        at = cmd.index("--data-dir")  # a baseline from before the data directory
        del cmd[at : at + 2]
    if not namespaced(tree):
        cmd[cmd.index("shoal.broker")] = "broker"
        return cmd, str(tree)
    links = tree / ".build" / "overhead" / "shoal"
    links.mkdir(parents=True, exist_ok=True)
    for package in ("broker", "workers", "shm", "store", "perf"):
        if (tree / package).is_dir() and not (links / package).exists():
            (links / package).symlink_to(tree / package)
    return cmd, str(links.parent)


@contextlib.contextmanager
def shoal(tree: Path, metrics: bool) -> Iterator[tuple[str, int]]:
    port = free_port()
    metrics_port = free_port() if metrics else 0
    runtime = tempfile.mkdtemp(prefix="shoal-overhead-")
    cmd, pythonpath = command(tree, port, runtime, metrics_port)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(200):  # 20 s
            if amqp_ready("127.0.0.1", port):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"broker in {tree} exited with {proc.returncode}")
            threading.Event().wait(0.1)
        else:
            raise TimeoutError("broker not ready after 20 s")
        yield f"amqp://guest:guest@127.0.0.1:{port}/", metrics_port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def perf(uri: str, duration: float, scrape: int, interval: float, load: tuple[str, ...]) -> float:
    stop = threading.Event()

    def scraper() -> None:
        # The first scrape 5 s in (inside the measured window), then every interval.
        wait = min(interval, 5.0)
        while not stop.wait(wait):
            wait = interval
            for path in ("/metrics", "/metrics/per-object"):
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"http://127.0.0.1:{scrape}{path}", timeout=10).read()

    thread = threading.Thread(target=scraper, daemon=True)
    if scrape:
        thread.start()
    try:
        out = subprocess.run(
            perf_command(uri, PERF + load, duration, 2),
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            timeout=duration + 60,
        ).stdout
    finally:
        stop.set()
    return float(json.loads(out)["consumed_rate"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="git ref to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--scrape-interval", type=float, default=15.0)
    p.add_argument("--rabbitmq", action="store_true", help="also RabbitMQ 3.10 (Debian)")
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--no-scrape", action="store_true", help="leave out the scraped variant")
    opts = p.parse_args()
    load = ("--producers", str(opts.producers), "--consumers", str(opts.consumers))
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        baseline = build_baseline(opts.baseline, Path(tmp))
        variants = [
            (f"baseline {opts.baseline}, endpoint off", baseline, False),
            ("this tree, endpoint off", ROOT, False),
            (f"this tree, scraped every {opts.scrape_interval:g} s", ROOT, True),
        ]
        if opts.no_scrape:
            variants.pop()
        try:
            for round_ in range(opts.rounds):
                # Each round starts with another variant: no variant always
                # follows the same one (or runs first on a cold machine).
                shift = round_ % len(variants)
                for name, tree, metrics in variants[shift:] + variants[:shift]:
                    with shoal(tree, metrics) as (uri, scrape):
                        rate = perf(uri, opts.duration, scrape, opts.scrape_interval, load)
                    results.setdefault(name, []).append(rate)
                    print(f"{name}: {rate:,.0f} msg/s", file=sys.stderr)
            if opts.rabbitmq:
                with started_rabbitmq() as target:
                    if target.uri is None:
                        print(target.unavailable, file=sys.stderr)
                    else:
                        for _ in range(opts.rounds):
                            rate = perf(target.uri, opts.duration, 0, opts.scrape_interval, load)
                            results.setdefault("RabbitMQ 3.10", []).append(rate)
                            print(f"RabbitMQ: {rate:,.0f} msg/s", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
                capture_output=True,
            )
    base = statistics.median(results[variants[0][0]])
    print(
        f"{datetime.date.today()}, {platform.node()} ({os.cpu_count()} CPUs),"
        f" {opts.producers} -> {opts.consumers}, 64 B,"
        f" prefetch 500, multi-ack 100, {opts.duration:g} s after 2 s warm-up, medians of"
        f" {opts.rounds}:\n"
    )
    print("| variant | runs (msg/s) | median | vs baseline |\n|---|---|---|---|")
    for name, rates in results.items():
        median = statistics.median(rates)
        runs = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| {name} | {runs} | {median:,.0f} | {100 * (median / base - 1):+.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
