"""The Debian package (`make deb`, deploy/debian) installed as an operator
installs it, on this machine (CI's is a fresh Debian 12 root), and purged
after: `apt-get install ./dist/shoal_*.deb`, `shoal --version`, the units
checked by `systemd-analyze verify`, a broker run as the `shoal` user that
takes a publish and gives it back on a get, then `apt-get purge`, which must
leave no file, directory or user behind. And the container image
(deploy/Containerfile), built and run where a container runtime answers.

These change the machine (a package, a user), so they run in a CI step of
their own (`--package`), as root; a machine that already has a `shoal`
package or user is refused rather than touched."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import psutil
import pytest

from tests.broker_process import ROOT, free_port, wait_for

pytestmark = [pytest.mark.package, pytest.mark.timeout(600)]

INSTALLED = [
    "/opt/shoal",
    "/usr/bin/shoal",
    "/usr/lib/systemd/system/shoal.service",
    "/usr/lib/systemd/system/shoal.socket",
    "/usr/lib/sysusers.d/shoal.conf",
    "/usr/lib/tmpfiles.d/shoal.conf",
    "/etc/shoal/shoal.toml",
    "/var/lib/shoal",
    "/run/shoal",
    "/usr/share/doc/shoal",
]
HEALTH = "http://127.0.0.1:15672/api/health/checks/virtual-hosts"
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def run(*cmd: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False
    )
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stdout}{done.stderr}"
    return done.stdout


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def deb() -> Path:
    if os.geteuid() != 0:
        pytest.fail("installing a package needs root (CI's step runs as root)")
    out = run("make", "deb", timeout=600).strip().splitlines()[-1]
    path = Path(out)
    assert path.name.startswith("shoal_") and path.suffix == ".deb", out
    return path


@pytest.fixture
def installed(deb: Path) -> Iterator[Path]:
    already = subprocess.run(["dpkg", "-s", "shoal"], capture_output=True, check=False)
    assert already.returncode != 0, "a shoal package is installed already: not touched"
    assert not user_exists("shoal"), "a shoal user exists already: not touched"
    run("apt-get", "install", "-y", "-q", str(deb), env=APT_ENV)
    try:
        yield deb
    finally:
        subprocess.run(
            ["apt-get", "purge", "-y", "-q", "shoal"],
            capture_output=True,
            env=APT_ENV,
            timeout=300,
            check=False,
        )


def test_the_package_installs_runs_as_its_user_and_purges_clean(installed: Path) -> None:
    # What it put in place.
    assert run("shoal", "--version").strip() == "shoal 0.1.0"
    assert os.readlink("/usr/bin/shoal") == "/opt/shoal/venv/bin/shoal"
    for path in INSTALLED:
        assert os.path.exists(path), path
    shoal_user = pwd.getpwnam("shoal")
    assert shoal_user.pw_dir == "/var/lib/shoal"
    for directory in ("/var/lib/shoal", "/run/shoal"):
        assert os.stat(directory).st_uid == shoal_user.pw_uid, directory
    conffiles = run("dpkg-query", "--showformat=${Conffiles}", "--show", "shoal")
    assert "/etc/shoal/shoal.toml" in conffiles
    # The units: systemd's own check (an unknown key or a missing command fails it).
    run(
        "systemd-analyze",
        "verify",
        "/usr/lib/systemd/system/shoal.service",
        "/usr/lib/systemd/system/shoal.socket",
    )
    # Nothing enabled by surprise.
    wants = glob.glob("/etc/systemd/system/*.wants/shoal.*")
    assert wants == [], wants

    # The broker as the shoal user, with the package's settings file.
    port = free_port()
    log = open(Path("/tmp") / f"shoal-package-{port}.log", "wb")  # noqa: SIM115
    command = "runuser -u shoal -- /usr/bin/shoal --config /etc/shoal/shoal.toml --bind 127.0.0.1"
    command += " --workers 1 --runtime-dir /run/shoal --data-dir /var/lib/shoal"
    command += f" --management-port 0 --metrics-port 0 --port {port}"
    command += " --mqtt-port 0 --mqtt-ws-port 0"  # 1883 and 15675 may be taken here
    broker = subprocess.Popen(
        command.split(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def up() -> bool:
            try:
                pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).close()
            except pika.exceptions.AMQPError:
                return False
            return True

        wait_for(up, 60, "the packaged broker")
        family = psutil.Process(broker.pid).children(recursive=True)
        supervisor = next(p for p in family if "supervisor" in " ".join(p.cmdline()))
        assert supervisor.username() == "shoal"
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare("packaged", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "packaged", b"from the package", pika.BasicProperties(delivery_mode=2))
        _method, _props, body = ch.basic_get("packaged", auto_ack=True)
        assert body == b"from the package"
        conn.close()
        assert os.listdir("/var/lib/shoal"), "the data directory is /var/lib/shoal"
    finally:
        for p in psutil.Process(broker.pid).children(recursive=True):
            if "supervisor" in " ".join(p.cmdline()):
                p.send_signal(signal.SIGTERM)
        broker.wait(60)
        log.close()

    # Purged: nothing of it left.
    run("apt-get", "purge", "-y", "-q", "shoal", env=APT_ENV)
    left = [path for path in INSTALLED if os.path.lexists(path)]
    assert left == [], left
    assert not user_exists("shoal")
    assert subprocess.run(["getent", "group", "shoal"], capture_output=True).returncode != 0
    assert subprocess.run(["dpkg", "-s", "shoal"], capture_output=True).returncode != 0
    assert [n for n in os.listdir("/dev/shm") if "shoal" in n] == []


def _runtime() -> tuple[str | None, str]:
    """A container runtime that answers, or None and why there is none."""
    reasons = []
    for tool in ("podman", "docker"):
        if shutil.which(tool) is None:
            reasons.append(f"{tool}: not installed")
            continue
        done = subprocess.run([tool, "info"], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return tool, ""
        reasons.append(f"{tool}: {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    return None, "; ".join(reasons)


def test_the_container_image_runs_and_is_healthy(deb: Path) -> None:
    tool, why = _runtime()
    if tool is None:
        pytest.skip(f"no container runtime answers here ({why})")
    image = "shoal-test:latest"
    built = subprocess.run(
        [tool, "build", "-f", "deploy/Containerfile", "-t", image, "."],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    if built.returncode != 0 and "debian:bookworm-slim" in built.stderr + built.stdout:
        pytest.skip(f"the base image cannot be pulled here: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stdout + built.stderr
    name = f"shoal-test-{free_port()}"
    run(tool, "run", "-d", "--name", name, "-v", f"{name}-data:/var/lib/shoal", image)
    try:
        deadline = time.monotonic() + 120
        health = ""
        while time.monotonic() < deadline:
            done = subprocess.run(
                [tool, "exec", name, "sh", "-c", f"curl -fsS -u guest:guest {HEALTH}"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            health = done.stdout
            if done.returncode == 0:
                break
            time.sleep(1)
        assert '"status":"ok"' in health.replace(" ", ""), health
    finally:
        subprocess.run([tool, "rm", "-f", name], capture_output=True, timeout=60)
        subprocess.run([tool, "volume", "rm", f"{name}-data"], capture_output=True, timeout=60)
