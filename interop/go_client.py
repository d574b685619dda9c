#!/usr/bin/env python3
"""Run amqp091-go's test suite (RabbitMQ's Go client) against Shoal (or any AMQP URL).

    python interop/go_client.py --deselect-file interop/deselect.txt \\
        --expect-file interop/expected.txt          # what CI runs
    python interop/go_client.py --url amqp://guest:guest@127.0.0.1:5672/ --label rabbitmq

The suite is Debian's: `golang-github-rabbitmq-amqp091-go-dev` (1.5.0) ships
the client's source with its tests, integration_test.go (the tests that talk
to a broker at $AMQP_URL, build tag `integration`) among them, and depends on
`golang-uber-goleak-dev`, whose check at the end of the run fails it if a
test left a connection's goroutines behind. Debian's `golang-go` (1.19)
builds it. Nothing comes from outside Debian: CI installs the two packages.

Steps: build the test binary once in a GOPATH of links under
interop/.cache/go (GO111MODULE off: Debian's source tree is the module
cache), list its tests, start Shoal on a free port (unless --url), run every
listed test but the deselected ones with -test.v, stop the broker, count.

Exit status 0 only if the binary exited 0 (a panic or goleak's finding
fails it), no test failed, every selected test reported an outcome, every
deselect entry names a listed test, and at least the passes that
--expect-file records (suite name `amqp091-go`) were seen.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# interop/run.py: the broker it starts, the deselect and expect files' formats.
from run import CACHE, RESULTS, Shoal, exit_status, log, read_deselect, unmatched_deselects

SUITE = "amqp091-go"
GOCODE = Path("/usr/share/gocode/src")
PACKAGE = "github.com/rabbitmq/amqp091-go"
DEPENDENCIES = (PACKAGE, "go.uber.org/goleak")
DEBIAN_PACKAGES = "golang-go golang-github-rabbitmq-amqp091-go-dev"
WORK = CACHE / "go"
BINARY = WORK / "amqp091-go.test"
OUTCOME = re.compile(r"^--- (PASS|FAIL|SKIP): (\S+)")
RUNNING = re.compile(r"^=== RUN   (Test[^\s/]+)$", re.MULTILINE)  # top-level tests


def go_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOPATH=str(WORK / "gopath"),
        GOCACHE=str(WORK / "build-cache"),
        GO111MODULE="off",  # GOPATH mode: the packages' source under /usr/share/gocode
        GOFLAGS="",
        GOPROXY="off",  # never the network
    )
    return env


def build() -> Path:
    """The test binary, built from Debian's source unless already built
    from the same source (its go.mod and test files' sizes as the stamp)."""
    src = GOCODE / PACKAGE
    if shutil.which("go") is None or not (src / "integration_test.go").is_file():
        raise SystemExit(f"needs Debian's {DEBIAN_PACKAGES} (apt-get install -y {DEBIAN_PACKAGES})")
    stamp_text = "\n".join(f"{p.name} {p.stat().st_size}" for p in sorted(src.glob("*.go")))
    stamp = WORK / "stamp"
    if BINARY.is_file() and stamp.is_file() and stamp.read_text() == stamp_text:
        return BINARY
    for dep in DEPENDENCIES:
        link = WORK / "gopath" / "src" / dep
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(GOCODE / dep)
    cmd = ["go", "test", "-tags", "integration", "-c", "-o", str(BINARY), PACKAGE]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, env=go_environment(), cwd=WORK)
    stamp.write_text(stamp_text)
    return BINARY


def listed(binary: Path) -> list[str]:
    out = subprocess.run(
        [str(binary), "-test.list", ".*"], check=True, capture_output=True, text=True
    ).stdout
    return [name for name in out.split() if name.startswith(("Test", "Example"))]


def run_suite(
    binary: Path, url: str, selected: list[str], logfile: Path, timeout: int
) -> dict[str, Any]:
    pattern = "^(" + "|".join(re.escape(name) for name in selected) + ")$"
    cmd = [str(binary), "-test.v", "-test.timeout", f"{timeout}s", "-test.run", pattern]
    started = time.monotonic()
    with open(logfile, "w") as fh:
        proc = subprocess.run(
            cmd,
            env={**os.environ, "AMQP_URL": url},
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=timeout + 60,
            cwd=GOCODE / PACKAGE,
        )
    counts = tally(logfile.read_text(errors="replace"), selected)
    counts["rc"] = proc.returncode
    counts["wall"] = round(time.monotonic() - started)
    return counts


def tally(text: str, selected: list[str]) -> dict[str, Any]:
    """Outcomes from a -test.v run's output: top-level tests only (subtests
    are indented), the selected tests that never reported (a panic ends the
    run), the tests started but never ended (where a hang stopped it), and
    whether it panicked or goleak found goroutines left behind."""
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        m = OUTCOME.match(line)
        if m:
            outcomes[m.group(2)] = m.group(1)
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("PASS", "FAIL", "SKIP")}
    tests = [name for name in selected if name.startswith("Test")]  # examples may print no ---
    counts["not run"] = sum(1 for name in tests if name not in outcomes)
    counts["panic"] = int("\npanic: " in text)
    started = RUNNING.findall(text)
    counts["running"] = [name for name in started if name not in outcomes][:3]
    counts["goleak"] = int("goleak: Errors" in text)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="AMQP URL of a running broker; skip starting Shoal")
    p.add_argument("--label", help="results file prefix (default: shoal, or 'url' with --url)")
    p.add_argument("--deselect-file", help="as interop/run.py's; entries 'amqp091-go:TestName'")
    p.add_argument("--expect-file", help="as interop/run.py's; the line 'amqp091-go PASSED 0'")
    p.add_argument("--timeout", type=int, default=300, help="the whole run's limit, s (300)")
    args = p.parse_args(argv)
    label = args.label or ("url" if args.url else "shoal")

    def _on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: the broker gets stopped

    signal.signal(signal.SIGTERM, _on_sigterm)
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    binary = build()
    names = listed(binary)
    deselect = read_deselect(args.deselect_file, SUITE)
    unmatched = unmatched_deselects(deselect, names, SUITE)
    selected = [name for name in names if name not in deselect]
    logfile = RESULTS / f"{label}-{SUITE}.log"
    if args.url:
        c = run_suite(binary, args.url, selected, logfile, args.timeout)
        crashed = False
    else:
        broker_log = RESULTS / f"{label}-{SUITE}-broker.log"
        with Shoal(broker_log, []) as broker:
            url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
            c = run_suite(binary, url, selected, logfile, args.timeout)
        crashed = broker.crashed
    print(
        f"\n{SUITE} against {args.url or 'Shoal (started here)'}: {c['PASS']} passed, "
        f"{c['FAIL']} failed, {c['SKIP']} skipped, {c['not run']} not run, "
        f"{len(deselect)} deselected, {c['wall']} s (rc {c['rc']}"
        f"{', a panic' if c['panic'] else ''}{', goleak found goroutines' if c['goleak'] else ''})"
        f"; output in {logfile}"
    )
    if c["running"]:
        print(f"{SUITE}: still running when the run ended: {', '.join(c['running'])}")
    bad = crashed or bool(unmatched) or c["rc"] != 0 or c["FAIL"] > 0 or c["not run"] > 0
    return exit_status(SUITE, c["PASS"], c["SKIP"], bad, args.expect_file)


if __name__ == "__main__":
    sys.exit(main())
