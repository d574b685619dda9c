#!/usr/bin/env python3
"""Run aiomqtt's own test suite (the asyncio MQTT client, over paho-mqtt)
against Shoal (issue 41).

    python interop/aiomqtt_suite.py --deselect-file interop/deselect.txt \\
        --expect-file interop/expected.txt          # what CI runs

Steps: download aiomqtt 2.5.1's sdist from PyPI (interop/.cache/sdist), unpack
a fresh copy (interop/.cache/src), install the suite's test tools into a venv of
their own (interop/.cache/aiomqtt-venv, their dev group's pytest 7 and anyio 3),
start Shoal on a loopback address of its own (interop/loopback.py: the tests
dial 1883 and 8883 of one host name) with MQTT over TLS, point the suite at it,
run pytest, stop the broker, count.

What is changed in the unpacked copy: the host name the tests connect to
(`HOSTNAME = "test.mosquitto.org"` in tests/test_client.py, the only one), and
the CA file its TLS test verifies the server with (tests/mosquitto.org.crt:
test.mosquitto.org's CA there, the throwaway CA of this run's certificate here).

Exit status 0 only if no selected test failed or errored, every deselect entry
names a test, and at least the passes --expect-file records (suite name
`aiomqtt`) were seen.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import trustme
from loopback import free_loopback, shoal_on
from run import CACHE, RESULTS, exit_status, log, read_deselect, unmatched_deselects

SUITE = "aiomqtt"
SDIST = "aiomqtt-2.5.1"
REQUIREMENT = "aiomqtt==2.5.1"
# The suite's dev dependency group (pyproject.toml): pytest <8, anyio <4.
TEST_REQUIREMENTS = ["pytest==7.4.4", "anyio==3.7.1"]
VENV = CACHE / "aiomqtt-venv"
MQTT_PORT, MQTTS_PORT = 1883, 8883  # the suite's
HOSTNAME_LINE = 'HOSTNAME = "test.mosquitto.org"'
SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+)", re.M)


def download() -> Path:
    sdist = CACHE / "sdist" / f"{SDIST}.tar.gz"
    if not sdist.exists():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        cmd += ["--no-binary", "aiomqtt", "-d", str(sdist.parent), REQUIREMENT]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)
    return sdist


def unpack(sdist: Path, ca_pem: bytes, address: str) -> Path:
    src = CACHE / "src"
    dest = src / SDIST
    if dest.exists():
        shutil.rmtree(dest)
    src.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tf:
        tf.extractall(src, filter="data")
    tests = dest / "tests" / "test_client.py"
    text = tests.read_text()
    if text.count(HOSTNAME_LINE) != 1:
        raise SystemExit(f"{tests}: expected one line {HOSTNAME_LINE!r} to point at Shoal")
    tests.write_text(text.replace(HOSTNAME_LINE, f'HOSTNAME = "{address}"'))
    (dest / "tests" / "mosquitto.org.crt").write_bytes(ca_pem)
    return dest


def venv_python(sdist: Path) -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / ".interop-installed"
    want = hashlib.sha256("\n".join([REQUIREMENT, *TEST_REQUIREMENTS]).encode()).hexdigest()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if not stamp.exists() or stamp.read_text() != want:
        cmd = [str(python), "-m", "pip", "install", "-q", str(sdist), *TEST_REQUIREMENTS]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)
        stamp.write_text(want)
    return python


def run_pytest(python: Path, src: Path, deselect: list[str], logfile: Path) -> dict[str, int]:
    cmd = [str(python), "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests"]
    for test in deselect:
        cmd += ["--deselect", test]
    with open(logfile, "w") as fh:
        subprocess.run(cmd, cwd=src, stdout=fh, stderr=subprocess.STDOUT, timeout=600)
    outcomes = dict((name, kind) for kind, name in SUMMARY.findall(logfile.read_text()))
    counts = {k: 0 for k in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")}
    for kind in outcomes.values():
        counts[kind] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deselect-file", help="as interop/run.py's; entries 'aiomqtt:tests/...'")
    p.add_argument("--expect-file", help="as interop/run.py's; the line 'aiomqtt N 0'")
    args = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    sdist = download()
    python = venv_python(sdist)
    address = free_loopback([MQTT_PORT, MQTTS_PORT])
    ca = trustme.CA()
    certs = CACHE / "aiomqtt-certs"
    certs.mkdir(parents=True, exist_ok=True)
    server = certs / "server.pem"
    ca.issue_cert(address).private_key_and_cert_chain_pem.write_to_path(str(server))
    src = unpack(sdist, ca.cert_pem.bytes(), address)
    deselect = read_deselect(args.deselect_file, SUITE)
    collected = subprocess.run(
        [str(python), "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "tests"],
        cwd=src,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    unmatched = unmatched_deselects(deselect, collected, SUITE)
    logfile = RESULTS / f"shoal-{SUITE}.log"
    extra = ["--mqtts-port", str(MQTTS_PORT), "--tls-cert", str(server)]
    with shoal_on(address, MQTT_PORT, extra, RESULTS / f"shoal-{SUITE}-broker.log") as broker:
        c = run_pytest(python, src, deselect, logfile)
    print(
        f"\n{SUITE} against Shoal on {address}: {c['PASSED']} passed, {c['FAILED']} failed, "
        f"{c['ERROR']} errors, {c['SKIPPED']} skipped, {len(deselect)} deselected; "
        f"output in {logfile}"
    )
    bad = broker.crashed or bool(unmatched) or c["FAILED"] > 0 or c["ERROR"] > 0
    return exit_status(SUITE, c["PASSED"], c["SKIPPED"], bad, args.expect_file)


if __name__ == "__main__":
    sys.exit(main())
