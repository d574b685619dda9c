"""A real Celery worker (Celery from PyPI, 5.5+) against Shoal, with quorum
queues and a topic exchange, so native delayed delivery is on (issue 15's
acceptance): countdown tasks and retries with a countdown run on time
(±1 s), and while they wait they are in the broker's delay queues, not in
the worker (its queue has nothing unacknowledged, and a task sent later
without a countdown runs at once). Every wait is bounded."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import ROOT, Broker, wait_for

pytestmark = pytest.mark.celery

COUNTDOWNS = (1, 2, 3, 5)


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_countdowns_and_retries_run_on_time(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "ran.jsonl"
    env = dict(os.environ, SHOAL_CELERY_BROKER=broker.url, SHOAL_CELERY_OUT=str(out))
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery.tasks",
                "worker",
                "--pool",
                "solo",
                "--loglevel",
                "info",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "ready." in log.read_text(), 60, "the Celery worker to be ready")
        monkeypatch.setenv("SHOAL_CELERY_BROKER", broker.url)
        from tests.celery import tasks

        tasks.app.conf.broker_url = broker.url
        sent = time.time()
        for countdown in COUNTDOWNS:
            tasks.stamp.apply_async((f"countdown {countdown}",), countdown=countdown)
        tasks.flaky.apply_async(("retried",))
        # The countdown tasks wait in the broker: the worker holds none of
        # them, and a task sent now runs at once.
        time.sleep(0.3)  # let the immediate first attempt of `flaky` run
        tasks.stamp.apply_async(("at once",))
        wait_for(lambda: any(r.get("label") == "at once" for r in records(out)), 5, "at once")
        # (the task writes its record before the worker acks it: its ack is
        # a moment behind; a countdown task held by the worker would stay
        # unacked for a second and more)
        wait_for(lambda: broker_unacked(broker, "tasks") == 0, 0.5, "no task held unacked")
        wait_for(lambda: len(records(out)) == len(COUNTDOWNS) + 4, 30, "every task to run")
        ran = records(out)
        for countdown in COUNTDOWNS:
            (at,) = [r["at"] for r in ran if r.get("label") == f"countdown {countdown}"]
            assert abs(at - sent - countdown) <= 1.0, (countdown, at - sent)
        attempts = sorted(r["at"] for r in ran if r["task"] == "flaky")
        assert len(attempts) == 3
        for earlier, later in itertools.pairwise(attempts):
            assert abs(later - earlier - 2) <= 1.0, attempts
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)
    assert "Traceback" not in log.read_text().split("ready.", 1)[1], log.read_text()


def broker_unacked(broker: Broker, queue: str) -> int:
    for q in broker.status()["queues"]:
        if q["name"] == queue:
            return int(q["messages_unacked"])
    raise AssertionError(f"no queue {queue}")
