"""`shoal status --consumers`: per queue, each consumer's scheduler state,
priority, pointer, credit and unacked count, joined from the scheduler and
the IO workers; run as the real command against a broker with consumers on
both workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from tests.broker_process import ROOT, Broker, wait_for
from tests.clients import connect, connections_on_both_workers, pump, shoal


def shoal_status(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return shoal(broker, "status", *args)


def consumers_of(broker: Broker, queue: str) -> dict[str, dict[str, Any]]:
    done = shoal_status(broker, "--consumers", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["missing_workers"] == []
    (q,) = [q for q in answer["queues"] if q["name"] == queue]
    return {c["tag"]: c | {"queue": q} for c in q["consumers"]}


def test_status_lists_each_consumer_with_its_state_credit_and_pointer(broker: Broker) -> None:
    a, b = connections_on_both_workers(broker)
    pub = connect(broker)
    pch = pub.channel()
    pch.confirm_delivery()
    pch.queue_declare("obs", arguments={"x-max-priority": 3})
    held: list[int] = []
    ach = a.channel()
    ach.basic_qos(prefetch_count=5)
    ach.basic_consume(
        "obs",
        lambda c, m, p, body: held.append(m.delivery_tag),
        consumer_tag="greedy",
        arguments={"x-priority": 10},
    )
    bch = b.channel()
    bch.basic_qos(prefetch_count=10)
    bch.basic_consume(
        "obs",
        lambda c, m, p, body: None,
        consumer_tag="picky",
        arguments={"x-filter-jms-selector": "colour = 'green'"},
    )
    bch.basic_consume(
        "obs",
        lambda c, m, p, body: None,
        consumer_tag="browser",
        arguments={"x-filter-no-consume": True},
    )
    for i in range(8):
        pch.basic_publish("", "obs", b"%d" % i, pika_properties(i))
    pump([a, b], lambda: len(held) >= 5, 10, "the greedy consumer's prefetch")

    def settled() -> dict[str, dict[str, Any]] | None:
        found = consumers_of(broker, "obs")
        quiet = not any(c["pulling"] for c in found.values())
        return found if quiet and found["greedy"]["state"] == "not_interested" else None

    found = wait_for(settled, 10, "the consumers to settle")
    greedy, picky, browser = found["greedy"], found["picky"], found["browser"]
    assert greedy["queue"]["messages_ready"] == 3 and greedy["queue"]["messages_unacked"] == 5
    assert greedy["queue"]["max_priority"] == 3
    assert (greedy["priority"], greedy["credit"], greedy["unacked"]) == (10, 0, 5)
    assert greedy["acquiring"] and not greedy["can_deliver"]
    # The selector wants none of the three left: it has seen them all, with credit to spare.
    assert picky["selector"] == "colour = 'green'"
    assert (picky["state"], picky["credit"], picky["unacked"]) == ("interested", 10, 0)
    assert picky["seen_everything"]
    assert browser["state"] == "non_acquiring" and not browser["acquiring"]
    # Pointers are per priority level here: the browser read past all 8 entries.
    assert isinstance(browser["pointer"], dict)
    assert sum(browser["pointer"].values()) > 0
    assert {greedy["worker"], picky["worker"]} == {0, 1}

    text = shoal_status(broker, "--consumers")
    assert text.returncode == 0
    assert "queue 'obs' in vhost '/': 3 ready, 5 unacked, max priority 3" in text.stdout
    assert "greedy" in text.stdout and "colour = 'green'" in text.stdout
    for c in (a, b, pub):
        c.close()


def test_status_answers_after_a_scheduler_restart(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("obs2")
    ch.basic_consume("obs2", lambda *a: None, consumer_tag="c1")
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 10, "a new scheduler")

    def listed() -> bool:
        done = shoal_status(broker, "--consumers", "--json")
        return done.returncode == 0 and "c1" in consumers_of(broker, "obs2")

    wait_for(listed, 10, "the consumer listed by the new scheduler")
    conn.close()


def test_status_without_a_broker_says_so(tmp_path: Any) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal.broker",
            "status",
            "--consumers",
            "--runtime-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1
    assert "no scheduler answering" in done.stdout


def pika_properties(i: int) -> Any:
    import pika

    return pika.BasicProperties(priority=i % 4, headers={"colour": "red"})
