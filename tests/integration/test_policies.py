"""Policies (issue 15, item 9) through `shoal policy`, as rabbitmqctl's
set_policy / clear_policy / list_policies: applied to queues whose names
match, existing ones at once; RabbitMQ's rules when a queue argument and a
policy disagree (the lower limit wins, the queue's own dead-letter
exchange wins); the highest priority applies; cleared policies stop
applying; policies are kept across a restart; bad policies are refused.
pika over real sockets; every wait is bounded."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pika

from tests.broker_process import Broker, wait_for
from tests.clients import connect, shoal
from tests.integration.test_dead_letters import fanout_dlx, next_message


def shoal_policy(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return shoal(broker, "policy", *args)


def set_policy(
    broker: Broker, name: str, pattern: str, definition: dict[str, Any], *extra: str
) -> None:
    done = shoal_policy(broker, "set", name, pattern, json.dumps(definition), *extra)
    assert done.returncode == 0, done.stdout + done.stderr


def count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_a_policy_applies_to_matching_queues_at_once(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("pol.a")
    ch.queue_declare("other")
    set_policy(broker, "ttl", r"^pol\.", {"message-ttl": 100}, "--apply-to", "queues")
    # As RabbitMQ: a message's expiry is set when it is enqueued.
    for queue in ("pol.a", "other"):
        ch.basic_publish("", queue, b"m")
    wait_for(lambda: count(ch, "pol.a") == 0, 10, "the existing queue's message to expire")
    ch.queue_declare("pol.b")  # declared after the policy: it applies too
    ch.basic_publish("", "pol.b", b"m")
    wait_for(lambda: count(ch, "pol.b") == 0, 10, "the new queue's message to expire")
    assert count(ch, "other") == 1
    listed = shoal_policy(broker, "list", "--json")
    assert json.loads(listed.stdout) == [
        {
            "vhost": "/",
            "name": "ttl",
            "pattern": r"^pol\.",
            "apply-to": "queues",
            "priority": 0,
            "definition": {"message-ttl": 100},
        }
    ]
    assert shoal_policy(broker, "clear", "ttl").returncode == 0
    ch.basic_publish("", "pol.a", b"kept")
    conn.sleep(0.4)  # longer than the cleared TTL: what is tested is an absence
    assert count(ch, "pol.a") == 1
    conn.close()


def test_the_lower_limit_wins(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("low.own", arguments={"x-max-length": 2})
    ch.queue_declare("low.policy", arguments={"x-max-length": 10})
    set_policy(broker, "cap", r"^low\.", {"max-length": 5})
    for queue in ("low.own", "low.policy"):
        for i in range(8):
            ch.basic_publish("", queue, b"%d" % i)
    assert (count(ch, "low.own"), count(ch, "low.policy")) == (2, 5)
    conn.close()


def test_the_queues_own_dead_letter_exchange_wins(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    fanout_dlx(ch)
    ch.exchange_declare("mine", "fanout")
    ch.queue_declare("mine-q")
    ch.queue_bind("mine-q", "mine")
    ch.queue_declare("dl.own", arguments={"x-dead-letter-exchange": "mine"})
    ch.queue_declare("dl.none")
    set_policy(broker, "dlx", r"^dl\.", {"dead-letter-exchange": "dlx"})
    for queue in ("dl.own", "dl.none"):
        ch.basic_publish("", queue, queue.encode())
        method, _got = next_message(ch, queue, ack=False)
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert next_message(ch, "mine-q")[1]["body"] == "dl.own"
    assert next_message(ch, "dlq")[1]["body"] == "dl.none"
    conn.close()


def test_the_highest_priority_applies_and_survives_a_restart(broker: Broker) -> None:
    set_policy(broker, "weak", "^prio", {"max-length": 1}, "--priority", "1")
    set_policy(broker, "strong", "^prio", {"max-length": 3}, "--priority", "5")
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("prio", durable=True)
    for i in range(6):
        ch.basic_publish("", "prio", b"%d" % i)
    assert count(ch, "prio") == 3
    conn.close()
    broker.restart()
    listed = json.loads(shoal_policy(broker, "list", "--json").stdout)
    assert sorted(p["name"] for p in listed) == ["strong", "weak"]
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_purge("prio")
    for i in range(6):
        ch.basic_publish("", "prio", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    assert count(ch, "prio") == 3
    conn.close()


def test_a_key_that_does_not_fit_a_queue_is_ignored(broker: Broker) -> None:
    set_policy(broker, "strategy", "^fit", {"dead-letter-strategy": "at-least-once"})
    set_policy(broker, "rk", "^fit", {"dead-letter-routing-key": "k"}, "--priority", "1")
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("fit", arguments={"x-max-length": 1})  # classic: neither applies
    for i in range(3):
        ch.basic_publish("", "fit", b"%d" % i)
    assert count(ch, "fit") == 1  # its own rules hold
    conn.close()


def test_bad_policies_are_refused(broker: Broker) -> None:
    for definition, text in (
        ({"message-ttl": -1}, "message-ttl: -1 is not an integer >= 0"),
        ({"no-such-key": 1}, "'no-such-key' is not a recognised policy key"),
        ({"overflow": "sideways"}, "overflow: 'sideways' is not one of"),
        ({}, "must set at least one key"),
    ):
        done = shoal_policy(broker, "set", "bad", ".*", json.dumps(definition))
        assert done.returncode == 1 and text in done.stdout, done.stdout
    done = shoal_policy(broker, "clear", "never-set")
    assert done.returncode == 1 and "no policy 'never-set' in vhost '/'" in done.stdout


def test_an_alternate_exchange_by_policy_and_the_exchange_s_own_first(broker: Broker) -> None:
    """RabbitMQ's recommended way to give exchanges an alternate: a policy
    with `alternate-exchange`, applying to exchanges (or all) whose names
    match, existing ones at once; an exchange's own argument wins (the Java
    client's Policies.alternateExchange and alternateExchangeArgs)."""
    conn = connect(broker)
    ch = conn.channel()
    for ae, queue in (("ae", "caught"), ("ae2", "caught2")):
        ch.exchange_declare(ae, "fanout")
        ch.queue_declare(queue)
        ch.queue_bind(queue, ae)
    ch.exchange_declare("has-ae", "fanout")
    ch.exchange_declare("has-ae-args", "fanout", arguments={"alternate-exchange": "ae2"})
    set_policy(broker, "AE", "^has-ae", {"alternate-exchange": "ae"}, "--apply-to", "exchanges")
    ch.confirm_delivery()
    ch.basic_publish("has-ae", "", b"by policy")
    ch.basic_publish("has-ae-args", "", b"by argument")
    ch.exchange_declare("has-ae-later", "fanout")  # declared after the policy: it applies too
    ch.basic_publish("has-ae-later", "", b"later")
    assert (count(ch, "caught"), count(ch, "caught2")) == (2, 1)
    assert shoal_policy(broker, "clear", "AE").returncode == 0
    ch.basic_publish("has-ae", "", b"unrouted")
    assert count(ch, "caught") == 2
    conn.close()
