#!/usr/bin/env python3
"""Run the aio-pika and aiormq test suites against Shoal (or any AMQP URL).

    python interop/run.py                       # both suites against a fresh Shoal
    python interop/run.py --suite aiormq -k channel
    python interop/run.py --url amqp://guest:guest@127.0.0.1:5672//   # e.g. RabbitMQ
    python interop/run.py --deselect-file interop/deselect.txt

Steps: download the sdists (cached in interop/.cache/sdist), unpack a fresh
copy of each (interop/.cache/src), install what their tests need into the
running interpreter's environment, start Shoal on a free port (unless --url),
replace the suites' Docker fixtures with ones that yield our URL, run pytest
with a per-test timeout and JUnit XML, stop the broker, print counts.

The fixture override: both suites get their broker from session fixtures
(`rabbitmq_container`, `amqp_direct_url`, and in aio-pika `docker` plus a
`pytest_configure` that refuses to run without Docker).  A block is appended
to the freshly unpacked copy of tests/conftest.py redefining exactly those
names (later definitions in the same module win); every other fixture of the
suites is left as shipped.  The block reads INTEROP_AMQP_URL and
INTEROP_TLS_PORT from the environment.  Tests that need the AMQPS listener
are skipped when no --tls-port is given; tests that start their own Docker
broker (aio-pika tests/test_robust_recovery.py) are always skipped.

Results: interop/.cache/results/<suite>.xml (JUnit), <suite>.log (pytest
output), shoal-<suite>.log (broker log).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from broker.cli import local_command

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE = HERE / ".cache"

SUITES = {
    # name: (pip requirement, sdist file prefix)
    "aio-pika": ("aio-pika==10.2.1", "aio_pika-10.2.1"),
    "aiormq": ("aiormq==7.2.4", "aiormq-7.2.4"),
}

# What the suites' tests import or load as pytest plugins (from their
# pyproject dependency groups "test"/"dev", minus coverage, docs and lint
# tools; Docker/testcontainers are replaced by the conftest override).
TEST_REQUIREMENTS = [
    "aio-pika==10.2.1",
    "aiormq==7.2.4",
    "aiomisc",
    "aiomisc-pytest>=2,<3",
    "pytest",
    "pytest-timeout",
    "shortuuid",
    "timeout-decorator",
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


def install(skip: bool) -> None:
    if skip:
        return
    cmd = [sys.executable, "-m", "pip", "install", "-q", *TEST_REQUIREMENTS]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True)


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


class Shoal:
    def __init__(self, logfile: Path, extra: list[str]):
        self.port = free_port()
        self.rundir = tempfile.mkdtemp(prefix="shoal-interop-")
        self.logfile = logfile
        self.extra = extra
        self.proc: subprocess.Popen | None = None

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


def counts(xml: Path) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    if not xml.exists():
        return c
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            c["failed"] += 1
        elif "error" in kinds:
            c["error"] += 1
        elif "skipped" in kinds:
            c["skipped"] += 1
        else:
            c["passed"] += 1
    return c


def run_suite(suite: str, src: Path, url: str, args: argparse.Namespace) -> dict[str, int]:
    results = CACHE / "results"
    results.mkdir(parents=True, exist_ok=True)
    xml = results / f"{suite}.xml"
    xml.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests",
        "-p",
        "no:cacheprovider",
        "-o",
        "log_cli=false",
        f"--timeout={args.timeout}",
        "-rA",
        "-q",
        f"--junitxml={xml}",
    ]
    if args.k:
        cmd += ["-k", args.k]
    for test_id in read_deselect(args.deselect_file, suite):
        cmd += ["--deselect", test_id]
    cmd += args.pytest_args
    env = dict(os.environ, INTEROP_AMQP_URL=url)
    if args.tls_port:
        env["INTEROP_TLS_PORT"] = str(args.tls_port)
    else:
        env.pop("INTEROP_TLS_PORT", None)
    logpath = results / f"{suite}.log"
    log(f"{suite}: {' '.join(cmd)}  (cwd {src}, log {logpath})")
    with open(logpath, "w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=src, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(args.suite_timeout)
        except (subprocess.TimeoutExpired, BaseException) as exc:
            if not isinstance(exc, subprocess.TimeoutExpired):
                log(f"{suite}: interrupted, stopping pytest")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            log(f"{suite}: suite exceeded {args.suite_timeout} s, stopping pytest")
            # SIGINT first: pytest then still writes the JUnit XML and summary
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    c = counts(xml)
    c["rc"] = proc.returncode
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=["aio-pika", "aiormq", "all"], default="all")
    p.add_argument("--url", help="AMQP URL of a running broker; skip starting Shoal")
    p.add_argument(
        "--tls-port",
        type=int,
        help="AMQPS port of that broker (default: the suites' TLS tests are skipped)",
    )
    p.add_argument("-k", help="passed to pytest -k")
    p.add_argument(
        "--deselect-file",
        help="test ids to leave out, one per line "
        "(optionally 'aio-pika:' or 'aiormq:' first), '# reason' after",
    )
    p.add_argument("--timeout", type=int, default=30, help="per-test timeout, s (30)")
    p.add_argument("--suite-timeout", type=int, default=1800, help="whole-suite limit, s")
    p.add_argument("--no-install", action="store_true", help="skip pip install")
    p.add_argument(
        "--broker-arg",
        action="append",
        default=[],
        help="extra argument for `python -m broker` (repeatable; use --broker-arg=--x form)",
    )
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = p.parse_args(argv)

    suites = list(SUITES) if args.suite == "all" else [args.suite]

    def _on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: pytest and the broker get stopped

    signal.signal(signal.SIGTERM, _on_sigterm)
    sdist = download()
    install(args.no_install)
    # The RabbitMQ test image raises max_message_size to 128 MiB for these
    # suites; give Shoal the same limit unless told otherwise.
    broker_extra = args.broker_arg or ["--max-message-size", str(128 * 1024 * 1024)]

    summary: dict[str, dict[str, int]] = {}
    for suite in suites:
        src = unpack(sdist, suite)
        if args.url:
            summary[suite] = run_suite(suite, src, args.url, args)
        else:
            with Shoal(CACHE / "results" / f"shoal-{suite}.log", broker_extra) as broker:
                summary[suite] = run_suite(suite, src, broker.url, args)

    target = args.url or "Shoal (started by run.py)"
    print(f"\nresults against {target}")
    print(f"{'suite':10} {'passed':>7} {'failed':>7} {'error':>7} {'skipped':>8} {'total':>7}")
    bad = False
    for suite, c in summary.items():
        total = c["passed"] + c["failed"] + c["error"] + c["skipped"]
        print(
            f"{suite:10} {c['passed']:7} {c['failed']:7} {c['error']:7} {c['skipped']:8} "
            f"{total:7}   (pytest rc {c['rc']})"
        )
        bad |= c["failed"] + c["error"] > 0 or total == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
