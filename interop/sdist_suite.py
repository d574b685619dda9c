"""A client library's own pytest suite from its sdist on PyPI, run against a
Shoal on a loopback address of its own with MQTT over TLS (interop/aiomqtt_suite.py,
interop/gmqtt_suite.py): download (interop/.cache/sdist), a venv of its own with
the suite's test tools (interop/.cache/<name>-venv), a fresh unpacked copy
(interop/.cache/src) that the runner points at the broker, collection (to check
the deselect entries), a pytest run, its counts and the exit status."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trustme
from loopback import free_loopback, shoal_on
from run import CACHE, RESULTS, exit_status, log, read_deselect, unmatched_deselects

SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+)", re.M)
OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
PYTEST_TIMEOUT_S = 600
MQTT_PORT, MQTTS_PORT = 1883, 8883  # (the suites dial these)

# (the sdist, the throwaway CA, the broker's address, a directory for files) ->
# (the unpacked copy pointed at the broker, the environment its tests run in)
Prepare = Callable[[Path, trustme.CA, str, Path], tuple[Path, dict[str, str]]]


@dataclass
class SdistSuite:
    name: str  # the suite's name in interop/deselect.txt and interop/expected.txt
    sdist: str  # the unpacked directory's name, e.g. "aiomqtt-2.5.1"
    requirement: str  # e.g. "aiomqtt==2.5.1"
    test_requirements: list[str] = field(default_factory=list)
    # pytest's options for both collection and run (its configuration file, say)
    pytest_options: list[str] = field(default_factory=list)

    @property
    def venv(self) -> Path:
        return CACHE / f"{self.name}-venv"

    def download(self) -> Path:
        sdist = CACHE / "sdist" / f"{self.sdist}.tar.gz"
        if not sdist.exists():
            sdist.parent.mkdir(parents=True, exist_ok=True)
            package = self.requirement.split("==")[0]
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            cmd += ["--no-binary", package, "-d", str(sdist.parent), self.requirement]
            log(" ".join(cmd))
            subprocess.run(cmd, check=True)
        return sdist

    def python(self, sdist: Path) -> Path:
        """The suite's interpreter, the client and its test tools installed."""
        python = self.venv / "bin" / "python"
        stamp = self.venv / ".interop-installed"
        want = hashlib.sha256("\n".join([self.requirement, *self.test_requirements]).encode())
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        if not stamp.exists() or stamp.read_text() != want.hexdigest():
            cmd = [str(python), "-m", "pip", "install", "-q", str(sdist), *self.test_requirements]
            log(" ".join(cmd))
            subprocess.run(cmd, check=True)
            stamp.write_text(want.hexdigest())
        return python

    def unpack(self, sdist: Path) -> Path:
        """A fresh copy of the sdist: the runner edits it before the run."""
        src = CACHE / "src"
        dest = src / self.sdist
        if dest.exists():
            shutil.rmtree(dest)
        src.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tf:
            tf.extractall(src, filter="data")
        return dest

    def collect(self, python: Path, src: Path, tests: str = "tests") -> list[str]:
        """The node ids pytest collects (for the deselect entries' check)."""
        cmd = [str(python), "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"]
        cmd += [*self.pytest_options, tests]
        run = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
        return run.stdout.splitlines()

    def run_pytest(
        self,
        python: Path,
        src: Path,
        deselect: list[str],
        logfile: Path,
        env: dict[str, str] | None = None,
        tests: str = "tests",
    ) -> dict[str, int]:
        """Run the suite, less `deselect`; the count of each outcome."""
        cmd = [str(python), "-m", "pytest", "-rA", "-p", "no:cacheprovider"]
        cmd += [*self.pytest_options, tests]
        for test in deselect:
            cmd += ["--deselect", test]
        with open(logfile, "w") as fh:
            subprocess.run(
                cmd,
                cwd=src,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=PYTEST_TIMEOUT_S,
                env={**os.environ, **(env or {})},
            )
        outcomes = dict((name, kind) for kind, name in SUMMARY.findall(logfile.read_text()))
        counts = dict.fromkeys(OUTCOMES, 0)
        for kind in outcomes.values():
            counts[kind] += 1
        return counts


def main(suite: SdistSuite, prepare: Prepare, doc: str, argv: list[str] | None = None) -> int:
    """A runner's main: exit status 0 only if no selected test failed or
    errored, the broker stopped cleanly, every deselect entry names a test,
    and at least the passes --expect-file records for the suite were seen."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--deselect-file", help=f"as interop/run.py's; entries '{suite.name}:tests/...'")
    p.add_argument("--expect-file", help=f"as interop/run.py's; the line '{suite.name} N 0'")
    args = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    sdist = suite.download()
    python = suite.python(sdist)
    address = free_loopback([MQTT_PORT, MQTTS_PORT])
    ca = trustme.CA()
    certs = CACHE / f"{suite.name}-certs"
    certs.mkdir(parents=True, exist_ok=True)
    server = certs / "server.pem"
    ca.issue_cert(address).private_key_and_cert_chain_pem.write_to_path(str(server))
    src, env = prepare(sdist, ca, address, certs)
    deselect = read_deselect(args.deselect_file, suite.name)
    unmatched = unmatched_deselects(deselect, suite.collect(python, src), suite.name)
    logfile = RESULTS / f"shoal-{suite.name}.log"
    extra = ["--mqtts-port", str(MQTTS_PORT), "--tls-cert", str(server)]
    with shoal_on(address, MQTT_PORT, extra, RESULTS / f"shoal-{suite.name}-broker.log") as broker:
        c = suite.run_pytest(python, src, deselect, logfile, env)
    print(
        f"\n{suite.name} against Shoal on {address}: {c['PASSED']} passed, {c['FAILED']} failed, "
        f"{c['ERROR']} errors, {c['SKIPPED']} skipped, {len(deselect)} deselected; "
        f"output in {logfile}"
    )
    bad = broker.crashed or bool(unmatched) or c["FAILED"] > 0 or c["ERROR"] > 0
    return exit_status(suite.name, c["PASSED"], c["SKIPPED"], bad, args.expect_file)
