#!/usr/bin/env python3
"""Run Eclipse Paho's Go MQTT client's functional tests against Shoal (issue 41).

    python interop/go_mqtt.py --deselect-file interop/deselect.txt \\
        --expect-file interop/expected.txt          # what CI runs
    python interop/go_mqtt.py --address 127.0.0.3   # any broker on ADDRESS:1883

The suite is Debian's: `golang-github-eclipse-paho.mqtt.golang-dev` (1.1.1) ships
the client's source with its tests; its `fvt_*_test.go` (the functional
verification tests: QoS 0/1/2 both ways, wills, clean sessions, keep-alive,
reconnects, the client's stores) talk to a broker at tcp://$TEST_FVT_ADDR:1883.
Debian's `golang-go` (1.19) builds them; the package's unit tests are left out
of the build, as one of them (`unit_router_test.go`, a variable declared and
not used) no longer compiles with it.

The port is fixed at 1883, so the broker listens on a loopback address of its
own (127.0.0.2 upwards, the first whose 1883 is free): a broker already on
127.0.0.1:1883 (a mosquitto started for comparison) is not in the way.

Exit status 0 only if the binary exited 0, no test failed, every selected test
reported an outcome, every deselect entry names a test, and at least the passes
that --expect-file records (suite name `paho.mqtt.golang`) were seen.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from go_client import GOCODE, go_environment, listed, tally
from loopback import free_loopback, shoal_on
from run import CACHE, RESULTS, exit_status, log, read_deselect, unmatched_deselects

SUITE = "paho.mqtt.golang"
PACKAGE = "github.com/eclipse/paho.mqtt.golang"
DEPENDENCIES = ("golang.org/x/net",)  # websocket and proxy, which the client imports
DEBIAN_PACKAGES = "golang-go golang-github-eclipse-paho.mqtt.golang-dev"
WORK = CACHE / "go-mqtt"
BINARY = WORK / "paho.mqtt.golang.test"
MQTT_PORT = 1883  # the suite's (fvt_test.go)


def build() -> Path:
    """The test binary from Debian's source, its unit tests left out, unless
    already built from the same source (its files' sizes as the stamp)."""
    src = GOCODE / PACKAGE
    if not (src / "fvt_client_test.go").is_file():
        raise SystemExit(f"needs Debian's {DEBIAN_PACKAGES} (apt-get install -y {DEBIAN_PACKAGES})")
    stamp_text = "\n".join(f"{p.name} {p.stat().st_size}" for p in sorted(src.glob("*.go")))
    stamp = WORK / "stamp"
    if BINARY.is_file() and stamp.is_file() and stamp.read_text() == stamp_text:
        return BINARY
    gopath = WORK / "gopath"  # go_environment's GOPATH is interop/.cache/go's: ours instead
    package = gopath / "src" / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        link = package / entry.name
        if entry.name.startswith("unit_") or link.is_symlink():
            continue
        link.symlink_to(entry)
    for dep in DEPENDENCIES:
        link = gopath / "src" / dep
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(GOCODE / dep)
    env = {**go_environment(), "GOPATH": str(gopath), "GOCACHE": str(WORK / "build-cache")}
    cmd = ["go", "test", "-c", "-o", str(BINARY), PACKAGE]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, env=env, cwd=WORK)
    stamp.write_text(stamp_text)
    return BINARY


def run_suite(binary: Path, address: str, selected: list[str], logfile: Path, timeout: int) -> dict:
    pattern = "^(" + "|".join(selected) + ")$"
    cmd = [str(binary), "-test.v", "-test.timeout", f"{timeout}s", "-test.run", pattern]
    started = time.monotonic()
    with open(logfile, "w") as fh:
        proc = subprocess.run(
            cmd,
            env={"TEST_FVT_ADDR": address, "PATH": "/usr/bin:/bin"},
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=timeout + 60,
            cwd=tempfile.gettempdir(),  # (its file store tests write under the working directory)
        )
    counts = tally(logfile.read_text(errors="replace"), selected)
    counts["rc"] = proc.returncode
    counts["wall"] = round(time.monotonic() - started)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", help="a running broker's address (its MQTT on 1883)")
    p.add_argument("--deselect-file", help="as interop/run.py's; entries 'paho.mqtt.golang:Test'")
    p.add_argument("--expect-file", help="as interop/run.py's; the line 'paho.mqtt.golang N 0'")
    p.add_argument("--timeout", type=int, default=300, help="the whole run's limit, s (300)")
    args = p.parse_args(argv)

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
    label = "url" if args.address else "shoal"
    logfile = RESULTS / f"{label}-{SUITE}.log"
    crashed = False
    if args.address:
        c = run_suite(binary, args.address, selected, logfile, args.timeout)
    else:
        address = free_loopback([MQTT_PORT])
        with shoal_on(address, MQTT_PORT, [], RESULTS / f"{label}-{SUITE}-broker.log") as broker:
            c = run_suite(binary, address, selected, logfile, args.timeout)
        crashed = broker.crashed
    print(
        f"\n{SUITE} against {args.address or 'Shoal (started here)'}: {c['PASS']} passed, "
        f"{c['FAIL']} failed, {c['SKIP']} skipped, {c['not run']} not run, "
        f"{len(deselect)} deselected, {c['wall']} s (rc {c['rc']}"
        f"{', a panic' if c['panic'] else ''}); output in {logfile}"
    )
    if c["running"]:
        print(f"{SUITE}: still running when the run ended: {', '.join(c['running'])}")
    bad = crashed or bool(unmatched) or c["rc"] != 0 or c["FAIL"] > 0 or c["not run"] > 0
    return exit_status(SUITE, c["PASS"], c["SKIP"], bad, args.expect_file)


if __name__ == "__main__":
    sys.exit(main())
