#!/usr/bin/env python3
"""Run the aio-pika and aiormq test suites against Shoal (or any AMQP URL).

    python interop/run.py                       # both suites against a fresh Shoal
    python interop/run.py --suite aiormq -k channel
    python interop/run.py --url amqp://guest:guest@127.0.0.1:5672// --label rabbitmq
    python interop/run.py --deselect-file interop/deselect.txt --suite-timeout 900

Steps: download the sdists (cached in interop/.cache/sdist), unpack a fresh
copy of each (interop/.cache/src), install what their tests need into a
virtual environment of their own (interop/.cache/venv, so that the suites'
pytest plugins stay out of Shoal's own test run), start Shoal on a free
port (unless --url), replace the suites' Docker fixtures with ones that
yield our URL, run pytest with a per-test timeout, stop the broker, print
counts.

The fixture override: both suites get their broker from session fixtures
(`rabbitmq_container`, `amqp_direct_url`, and in aio-pika `docker` plus a
`pytest_configure` that refuses to run without Docker).  A block is appended
to the freshly unpacked copy of tests/conftest.py redefining exactly those
names (later definitions in the same module win); every other fixture of the
suites is left as shipped.  The block reads INTEROP_AMQP_URL and
INTEROP_TLS_PORT from the environment.  Tests that need the AMQPS listener
are skipped when no --tls-port is given; tests that start their own Docker
broker (aio-pika tests/test_robust_recovery.py) are always skipped.

Outcomes come from interop/pytest_interop.py, a plugin loaded into the
suites' pytest: it writes each test report to a JSON-lines file as it
happens, applies the deselect list, and ends the run between two tests when
--suite-timeout is reached.  A run that still has to be killed keeps every
outcome recorded so far.

Results, per suite, in interop/.cache/results/ (LABEL is "shoal" or --label):
LABEL-SUITE.jsonl (raw reports), LABEL-SUITE.txt (one line per test:
outcome, id, message), LABEL-SUITE.log (pytest output), LABEL-SUITE.xml
(JUnit, when pytest got to write it), shoal-SUITE-broker.log (broker log).

Exit status 0 only if every selected test passed or was skipped, every
collected test ran, and the deselect list has no entry that matches nothing.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shoal.broker.cli import local_command

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE = HERE / ".cache"
RESULTS = CACHE / "results"
PLUGIN = "pytest_interop"  # interop/pytest_interop.py

SUITES = {
    # name: (pip requirement, sdist file prefix)
    "aio-pika": ("aio-pika==10.2.1", "aio_pika-10.2.1"),
    "aiormq": ("aiormq==7.2.4", "aiormq-7.2.4"),
}

# What the suites' tests import or load as pytest plugins (from their
# pyproject dependency groups "test"/"dev", minus coverage, docs and lint
# tools; Docker/testcontainers are replaced by the conftest override).
# Pinned to the versions the recorded counts were taken with.  No uvloop:
# aiomisc would pick it up; the suites' default is the asyncio loop.
TEST_REQUIREMENTS = [
    "aio-pika==10.2.1",
    "aiormq==7.2.4",
    "aiomisc==18.0.37",
    "aiomisc-pytest==2.0.0",
    "pytest==9.2.0",
    "pytest-timeout==2.4.0",
    "shortuuid==1.0.13",
    "timeout-decorator==0.5.0",
]

MARK = "# --- shoal interop overrides (appended by interop/run.py) ---"

OVERRIDE = (
    MARK
    + """
import os as _interop_os

import pytest as _interop_pytest
from yarl import URL as _InteropURL


def pytest_configure(config):  # noqa: F811  replaces the Docker check
    pass


class _InteropPorts(dict):
    def __missing__(self, key):
        _interop_pytest.skip(
            f"interop: broker has no {key} listener "
            "(TLS not configured, see run.py --tls-port)"
        )


class _InteropContainer:
    id = "interop"

    def __init__(self, url, tls_port):
        self.host = url.host
        self.ports = _InteropPorts({"5672/tcp": url.port})
        if tls_port:
            self.ports["5671/tcp"] = int(tls_port)


@_interop_pytest.fixture(scope="session")
def docker():  # noqa: F811
    _interop_pytest.skip("interop: test starts its own Docker broker")


@_interop_pytest.fixture(scope="session")
def rabbitmq_container():  # noqa: F811
    return _InteropContainer(
        _InteropURL(_interop_os.environ["INTEROP_AMQP_URL"]),
        _interop_os.environ.get("INTEROP_TLS_PORT"),
    )


@_interop_pytest.fixture(scope="session")
def amqp_direct_url():  # noqa: F811
    return _InteropURL(_interop_os.environ["INTEROP_AMQP_URL"])
"""
)


# aiormq builds all four URLs (amqp, amqp-named, amqps, amqps-client) in one
# fixture body, so a missing TLS port would skip the plain ones too; same
# fixture, but it only looks up the TLS port for the amqps parameters.
AIORMQ_OVERRIDE = """

@_interop_pytest.fixture(params=amqp_url_ids, ids=amqp_url_ids)
async def amqp_url(request, amqp_direct_url, rabbitmq_container):  # noqa: F811
    if request.param == "amqp":
        return amqp_direct_url
    if request.param == "amqp-named":
        return amqp_direct_url.update_query(name="pytest")
    query = {"cafile": cert_path("ca.pem"), "no_verify_ssl": 1}
    if request.param == "amqps-client":
        query.update(keyfile=cert_path("client.key"), certfile=cert_path("client.pem"))
    return amqp_direct_url.with_scheme("amqps").with_port(
        rabbitmq_container.ports["5671/tcp"],
    ).with_query(query)
"""


def log(msg: str) -> None:
    print(f"[interop] {msg}", flush=True)


def download() -> Path:
    sdist = CACHE / "sdist"
    sdist.mkdir(parents=True, exist_ok=True)
    missing = [req for req, prefix in SUITES.values() if not (sdist / f"{prefix}.tar.gz").exists()]
    if missing:
        # --no-binary for these two only: ":all:" would also force their
        # build backend (uv_build) to be built from source, which fails.
        names = ",".join(r.split("==")[0] for r in missing)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            names,
            "-d",
            str(sdist),
            *missing,
        ]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)
    return sdist


def unpack(sdist: Path, suite: str) -> Path:
    prefix = SUITES[suite][1]
    src = CACHE / "src"
    src.mkdir(parents=True, exist_ok=True)
    dest = src / prefix
    if dest.exists():
        shutil.rmtree(dest)
    with tarfile.open(sdist / f"{prefix}.tar.gz") as tf:
        tf.extractall(src, filter="data")
    conftest = dest / "tests" / "conftest.py"
    text = conftest.read_text()
    if MARK not in text:
        extra = AIORMQ_OVERRIDE if suite == "aiormq" else ""
        conftest.write_text(text.rstrip("\n") + "\n\n\n" + OVERRIDE + extra)
    return dest


def venv_python(venv: Path, skip_install: bool) -> Path:
    """The suites' interpreter: a venv of their own, created on first use."""
    python = venv / "bin" / "python"
    stamp = venv / ".interop-installed"
    want = hashlib.sha256("\n".join(TEST_REQUIREMENTS).encode()).hexdigest()
    if skip_install:
        if not python.exists():
            raise SystemExit(f"--no-install but no venv at {venv}")
        return python
    if not python.exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not stamp.exists() or stamp.read_text() != want:
        cmd = [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", *TEST_REQUIREMENTS]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)
        stamp.write_text(want)
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_amqp(host: str, port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                s.settimeout(2)
                if len(s.recv(8)) > 0:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no AMQP broker on {host}:{port}")


def tls_certificates(sdist: Path) -> Path:
    """The server certificate, key and CA that aiormq's sdist ships for its
    RabbitMQ test image (tests/certs, valid until 2217), copied aside: both
    suites' AMQPS tests run against a Shoal serving them, and aiormq's
    client certificate is signed by that CA."""
    certs = CACHE / "certs"
    shutil.rmtree(certs, ignore_errors=True)
    shutil.copytree(unpack(sdist, "aiormq") / "tests" / "certs", certs)
    return certs


class Shoal:
    def __init__(self, logfile: Path, extra: list[str], certs: Path | None = None):
        self.port = free_port()
        self.tls_port = 0
        if certs is not None:  # the AMQPS listener, verify_peer without fail_if_no_peer_cert
            self.tls_port = free_port()
            extra = [
                *extra,
                *("--tls-port", str(self.tls_port), "--tls-cert", str(certs / "server.pem")),
                *("--tls-key", str(certs / "server.key"), "--tls-ca", str(certs / "ca.pem")),
            ]
        self.rundir = tempfile.mkdtemp(prefix="shoal-interop-")
        self.logfile = logfile
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.crashed = False

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def __enter__(self) -> Shoal:
        cmd = local_command(self.port, 2, self.rundir, "--graceful-timeout", "2", *self.extra)
        log(" ".join(cmd))
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.logfile, "w")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_amqp("127.0.0.1", self.port, time.monotonic() + 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                log("broker ignored SIGTERM for 30 s, killing it")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:
            log(f"broker exited with {self.proc.returncode}")
            if self.proc.returncode != 0:
                self.crashed = True
        self._fh.close()
        shutil.rmtree(self.rundir, ignore_errors=True)


def read_deselect(path: str | None, suite: str) -> list[str]:
    """Lines: `[suite:]tests/x.py::test_y  # reason`; '#' lines are comments."""
    if not path:
        return []
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" in line.split("::", 1)[0]:  # "aiormq:tests/..." prefix
            which, line = line.split(":", 1)
            if which.strip() != suite:
                continue
            line = line.strip()
        out.append(line)
    return out


def outcomes(jsonl: Path) -> tuple[dict[str, tuple[str, str]], dict[str, int], list[str]]:
    """Per test id: (outcome, message); the collected and deselected
    counts; the deselect entries that matched nothing.  A test is `failed` if its call
    failed, `error` if setup or teardown failed, `skipped` if skipped (or
    xfailed), else `passed`."""
    rank = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
    tests: dict[str, tuple[str, str]] = {}
    n = {"collected": 0, "deselected": 0}
    unmatched: list[str] = []
    if not jsonl.exists():
        return tests, n, unmatched
    for line in jsonl.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if "collected" in r or "deselected" in r:
            n.update(r)
            continue
        if "unmatched_deselect" in r:
            unmatched.append(r["unmatched_deselect"])
            continue
        if r["outcome"] == "skipped":
            kind = "skipped"
        elif r["outcome"] == "failed":
            kind = "failed" if r["when"] == "call" else "error"
        elif r["when"] == "call" or r["nodeid"] not in tests:
            kind = "passed"
        else:
            continue  # setup/teardown passed: keeps what the call said
        old = tests.get(r["nodeid"])
        if old is None or rank[kind] >= rank[old[0]]:
            tests[r["nodeid"]] = (kind, r["message"] if kind != "passed" else "")
    return tests, n, unmatched


def stop_pytest(proc: subprocess.Popen, suite: str) -> None:
    """SIGINT (twice: the first can be swallowed by the suites' event loop),
    then SIGTERM, then SIGKILL, to the whole process group."""
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGINT, 20), (signal.SIGTERM, 15)):
        log(f"{suite}: sending {sig.name} to pytest")
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass
    log(f"{suite}: killing pytest")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_suite(
    suite: str, src: Path, python: Path, url: str, args: argparse.Namespace
) -> dict[str, int]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{args.label}-{suite}"
    xml, jsonl, txt, logpath = (stem.with_suffix(s) for s in (".xml", ".jsonl", ".txt", ".log"))
    for f in (xml, jsonl, txt):
        f.unlink(missing_ok=True)
    deselect = RESULTS / f"{args.label}-{suite}.deselect"
    deselect.write_text("".join(t + "\n" for t in read_deselect(args.deselect_file, suite)))
    cmd = [
        str(python),
        "-m",
        "pytest",
        "tests",
        "-p",
        PLUGIN,
        "-p",
        "no:cacheprovider",
        "-o",
        "log_cli=false",
        f"--timeout={args.timeout}",
        "--timeout-method=signal",
        "-rfE",
        "-q",
        f"--junitxml={xml}",
    ]
    if args.k:
        cmd += ["-k", args.k]
    cmd += args.pytest_args
    started = time.time()
    deadline = started + args.suite_timeout
    env = dict(
        os.environ,
        INTEROP_AMQP_URL=url,
        INTEROP_RESULTS=str(jsonl),
        INTEROP_DESELECT=str(deselect),
        INTEROP_DEADLINE=str(deadline),
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    env.pop("VIRTUAL_ENV", None)
    if args.tls_port:
        env["INTEROP_TLS_PORT"] = str(args.tls_port)
    else:
        env.pop("INTEROP_TLS_PORT", None)
    log(f"{suite}: {' '.join(cmd)}  (cwd {src}, log {logpath})")
    with open(logpath, "w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=src, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            # The plugin stops between tests at the deadline; a test can then
            # still take up to --timeout, plus the session teardown.
            proc.wait(args.suite_timeout + args.timeout + 60)
        except subprocess.TimeoutExpired:
            log(f"{suite}: pytest did not stop at the {args.suite_timeout} s limit")
            stop_pytest(proc, suite)
        except BaseException:
            log(f"{suite}: interrupted, stopping pytest")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    wall = time.time() - started
    tests, n, unmatched = outcomes(jsonl)
    with open(txt, "w") as fh:
        for nodeid, (kind, msg) in sorted(tests.items()):
            fh.write(f"{kind:8} {nodeid}" + (f"  # {msg.splitlines()[0]}" if msg else "") + "\n")
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for kind, _ in tests.values():
        c[kind] += 1
    c["not run"] = max(0, n["collected"] - len(tests))
    c["deselected"] = n["deselected"]
    c["rc"] = proc.returncode
    c["wall"] = round(wall)
    c["unmatched"] = len(unmatched)
    for entry in unmatched:
        log(f"{suite}: deselect entry matches no test: {entry}")
    bad = [(n, k, m) for n, (k, m) in sorted(tests.items()) if k in ("failed", "error")]
    if bad:
        log(f"{suite}: {len(bad)} failed or errored (all outcomes in {txt}):")
        for nodeid, kind, msg in bad:
            first = msg.splitlines()[0][:200] if msg else ""
            print(f"    {kind.upper():6} {nodeid}  {first}", flush=True)
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=["aio-pika", "aiormq", "all"], default="all")
    p.add_argument("--url", help="AMQP URL of a running broker; skip starting Shoal")
    p.add_argument("--label", help="results file prefix (default: shoal, or 'url' with --url)")
    p.add_argument(
        "--tls-port",
        type=int,
        help="AMQPS port of the --url broker (default: its TLS tests are skipped; a Shoal "
        "started here serves AMQPS with aiormq's test certificates unless --no-tls)",
    )
    p.add_argument("-k", help="passed to pytest -k")
    p.add_argument(
        "--deselect-file",
        help="test ids to leave out, one per line "
        "(optionally 'aio-pika:' or 'aiormq:' first), '# reason' after",
    )
    p.add_argument(
        "--expect-file",
        help="per suite the passed tests at least and the skipped at most "
        "(interop/expected.txt): fewer passed or more skipped fails the run, so "
        "a feature that vanishes (its tests turned into skips) cannot stay green",
    )
    p.add_argument("--timeout", type=int, default=30, help="per-test timeout, s (30)")
    p.add_argument(
        "--suite-timeout",
        type=int,
        default=1800,
        help="per-suite limit, s (1800): no test is started after it",
    )
    p.add_argument(
        "--venv",
        type=Path,
        default=CACHE / "venv",
        help="virtual environment for the suites (interop/.cache/venv)",
    )
    p.add_argument("--no-install", action="store_true", help="skip pip install")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="suites run at once, each against a Shoal of its own (1); CI runs both "
        "at once: they wait on the network far more than they compute",
    )
    p.add_argument(
        "--no-tls",
        action="store_true",
        help="start Shoal without its AMQPS listener (the suites' TLS tests are skipped)",
    )
    p.add_argument(
        "--broker-arg",
        action="append",
        default=[],
        help="extra argument for `python -m shoal.broker` (repeatable; use --broker-arg=--x form)",
    )
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = p.parse_args(argv)
    if args.label is None:
        args.label = "url" if args.url else "shoal"

    suites = list(SUITES) if args.suite == "all" else [args.suite]

    def _on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: pytest and the broker get stopped

    signal.signal(signal.SIGTERM, _on_sigterm)
    sdist = download()
    python = venv_python(args.venv.resolve(), args.no_install)
    # The RabbitMQ test image sets max_message_size to 128 MiB for these
    # suites (Shoal's default too, as RabbitMQ's): kept explicit.
    broker_extra = args.broker_arg or ["--max-message-size", str(128 * 1024 * 1024)]

    certs = None if args.url or args.no_tls else tls_certificates(sdist)

    summary: dict[str, dict[str, int]] = {}
    crashed = []

    def one(suite: str) -> None:
        own = copy.copy(args)  # its own TLS port, when suites run at once
        src = unpack(sdist, suite)
        if args.url:
            summary[suite] = run_suite(suite, src, python, args.url, own)
            return
        broker_log = RESULTS / f"{args.label}-{suite}-broker.log"
        with Shoal(broker_log, broker_extra, certs) as broker:
            own.tls_port = broker.tls_port or None
            summary[suite] = run_suite(suite, src, python, broker.url, own)
        if broker.crashed:
            crashed.append(suite)
            log(f"{suite}: the broker did not exit cleanly, see {broker_log}")
        errors = [
            line
            for line in broker_log.read_text(errors="replace").splitlines()
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        ]
        if errors:
            log(f"{suite}: {len(errors)} ERROR/Traceback lines in {broker_log}, first:")
            print("    " + errors[0], flush=True)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for done in [pool.submit(one, suite) for suite in suites]:
            done.result()
    summary = {suite: summary[suite] for suite in suites}  # printed in suite order

    target = args.url or "Shoal (started by run.py)"
    print(f"\nresults against {target}")
    cols = ("passed", "failed", "error", "skipped", "not run", "deselected")
    print(f"{'suite':10}" + "".join(f"{c:>11}" for c in cols) + f"{'total':>9}{'wall':>8}")
    bad = bool(crashed)
    for suite, c in summary.items():
        total = sum(c[k] for k in cols)
        print(
            f"{suite:10}"
            + "".join(f"{c[k]:11}" for k in cols)
            + f"{total:9}{c['wall']:7}s   (pytest rc {c['rc']})"
        )
        bad |= c["failed"] + c["error"] + c["not run"] + c["unmatched"] > 0
        bad |= total == 0 or c["rc"] not in (0, 1)
    if args.expect_file:
        bad |= not meets_expectations(summary, read_expected(args.expect_file))
    return 1 if bad else 0


def unmatched_deselects(deselect: list[str], names: Iterable[str], suite: str) -> list[str]:
    """The deselect entries that name no test of `suite` (each logged): a
    stale entry fails a run, as a test that vanished must be noticed."""
    known = set(names)
    unmatched = [name for name in deselect if name not in known]
    for name in unmatched:
        log(f"deselect entry {name!r} names no test of {suite}")
    return unmatched


def exit_status(suite: str, passed: int, skipped: int, bad: bool, expect_file: str | None) -> int:
    """A runner's exit status: 1 if `bad` or, with an expect file, if fewer
    passed or more were skipped than it records for `suite`."""
    if expect_file:
        summary = {suite: {"passed": passed, "skipped": skipped}}
        bad |= not meets_expectations(summary, read_expected(expect_file))
    return 1 if bad else 0


def read_expected(path: str) -> dict[str, tuple[int, int]]:
    """suite -> (passed at least, skipped at most), from lines
    `suite passed skipped` ('#' starts a comment)."""
    expected = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            suite, passed, skipped = line.split()
            expected[suite] = (int(passed), int(skipped))
    return expected


def meets_expectations(
    summary: dict[str, dict[str, int]], expected: dict[str, tuple[int, int]]
) -> bool:
    ok = True
    for suite, c in summary.items():
        if suite not in expected:
            continue
        least, most = expected[suite]
        if c["passed"] < least or c["skipped"] > most:
            log(
                f"{suite}: {c['passed']} passed and {c['skipped']} skipped; expected at least "
                f"{least} passed and at most {most} skipped (a feature gone, its tests skipped?)"
            )
            ok = False
    return ok


if __name__ == "__main__":
    sys.exit(main())
