"""Users, virtual hosts and permissions (issue 16, items 1-3) with pika over
real sockets, administered with `shoal ctl` as with rabbitmqctl: logins
refused with RabbitMQ's texts, each method checked by RabbitMQ's
access-control table (403 on the channel), topic permissions, a revoked
permission applying to an open connection, a deleted vhost or user closing
its connections (320), and all of it kept across a restart, the default
user made at the first start only. Every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import shoal


def ctl(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    done = shoal(broker, "ctl", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def login(broker: Broker, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.port,
            vhost,
            pika.PlainCredentials(user, password),
            connection_attempts=1,
        )
    )


def refused_on_channel(ch: Any, call: Any) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        call(ch)
    return caught.value.reply_code, caught.value.reply_text


@pytest.fixture
def user_in_vhost(broker: Broker) -> Iterator[Broker]:
    """User `u` (password `pw`) in vhost `v`, with no permissions yet."""
    ctl(broker, "add_user", "u", "pw")
    ctl(broker, "add_vhost", "v")
    yield broker


def grant(broker: Broker, configure: str, write: str, read: str) -> None:
    ctl(broker, "set_permissions", "-p", "v", "u", configure, write, read)


def refusal(user: str, permission: str, kind: str, name: str) -> str:
    """RabbitMQ 3.10's text (measured: it does not name the permission)."""
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost 'v' refused for user '{user}'"


def test_logins_are_refused_as_rabbitmq_refuses_them(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    text = (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )
    for user, password in (("u", "wrong"), ("nobody", "pw")):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as caught:
            login(broker, user, password, "v")
        assert text in str(caught.value)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
        login(broker, "u", "pw", "v")  # no permissions in v yet
    assert "NOT_ALLOWED - access to vhost 'v' refused for user 'u'" in str(denied.value)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as missing:
        login(broker, "u", "pw", "nope")
    assert "NOT_ALLOWED - vhost nope not found" in str(missing.value)
    grant(broker, ".*", ".*", ".*")
    login(broker, "u", "pw", "v").close()
    ctl(broker, "change_password", "u", "new")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, "u", "pw", "v")
    login(broker, "u", "new", "v").close()


def test_configure_write_and_read_are_checked_per_method(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    ctl(broker, "set_permissions", "-p", "v", "guest", ".*", ".*", ".*")
    setup = login(broker, "guest", "guest", "v").channel()
    setup.exchange_declare("x.other", "direct")
    setup.queue_declare("other")
    setup.queue_bind("other", "x.other", "k")
    setup.basic_publish("", "other", b"m")
    # u may configure and read u.* only, and write nothing but x.u and u.q.
    grant(broker, r"^u\.", r"^(x\.u|u\.q)$", r"^u\.")
    conn = login(broker, "u", "pw", "v")
    ch = conn.channel()
    ch.queue_declare("u.q")
    ch.exchange_declare("u.x", "fanout")
    cases = [
        (lambda c: c.queue_declare("other"), "configure", "queue", "other"),
        (lambda c: c.queue_declare(""), "configure", "queue", "amq.gen-"),
        (lambda c: c.exchange_declare("x.u", "direct"), "configure", "exchange", "x.u"),
        (lambda c: c.exchange_delete("x.other"), "configure", "exchange", "x.other"),
        (lambda c: c.queue_delete("other"), "configure", "queue", "other"),
        (lambda c: c.queue_purge("other"), "read", "queue", "other"),
        (lambda c: c.basic_get("other"), "read", "queue", "other"),
        (lambda c: c.basic_consume("other", lambda *a: None), "read", "queue", "other"),
        (lambda c: c.queue_bind("u.q", "x.other", "k"), "read", "exchange", "x.other"),
        (lambda c: c.queue_bind("other", "u.x"), "write", "queue", "other"),
        (lambda c: c.queue_unbind("other", "x.other", "k"), "write", "queue", "other"),
        (lambda c: c.exchange_bind("u.x", "x.other", "k"), "write", "exchange", "u.x"),
        (
            lambda c: c.queue_declare("u.dl", arguments={"x-dead-letter-exchange": "x.other"}),
            "write",
            "exchange",
            "x.other",
        ),
        (
            lambda c: c.exchange_declare("u.ae", arguments={"alternate-exchange": "x.other"}),
            "write",
            "exchange",
            "x.other",
        ),
    ]
    for call, permission, kind, name in cases:
        code, text = refused_on_channel(ch, call)
        expected = refusal("u", permission, kind, name)
        if name.endswith("-"):  # a server-named queue: checked by the name it would have
            head, tail = expected.split(name)
            assert text.startswith(head + name) and text.endswith(tail), text
        else:
            assert (code, text) == (403, expected)
        ch = conn.channel()
    # Publishing needs write on the exchange: the default one is amq.default.
    ch.confirm_delivery()
    code, text = refused_on_channel(ch, lambda c: c.basic_publish("", "u.q", b"m"))
    assert (code, text) == (403, refusal("u", "write", "exchange", "amq.default"))
    ch = conn.channel()
    ch.queue_bind("u.q", "u.x")  # write on u.q, read on u.x
    assert ch.basic_get("u.q") == (None, None, None)
    assert setup.queue_declare("other", passive=True).method.message_count == 1
    conn.close()


def test_topic_permissions_restrict_routing_keys(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    ctl(
        broker,
        "set_topic_permissions",
        "-p",
        "v",
        "u",
        "amq.topic",
        r"^allowed\.{username}",
        r"^readable\.",
    )
    conn = login(broker, "u", "pw", "v")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("t")
    ch.queue_bind("t", "amq.topic", "readable.#")
    ch.basic_publish("amq.topic", "allowed.u.x", b"m", mandatory=False)
    code, text = refused_on_channel(ch, lambda c: c.queue_bind("t", "amq.topic", "secret.#"))
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - access to topic 'secret.#' in exchange 'amq.topic' in vhost 'v' "
        "refused for user 'u'",
    )
    ch = conn.channel()
    ch.confirm_delivery()  # so that the publish waits for its answer
    code, text = refused_on_channel(ch, lambda c: c.basic_publish("amq.topic", "other.x", b"m"))
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - access to topic 'other.x' in exchange 'amq.topic' in vhost 'v' "
        "refused for user 'u'",
    )
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", "other.x", b"m")  # only topic exchanges are checked
    listed = ctl(broker, "list_topic_permissions", "-p", "v", "--formatter", "json")
    assert json.loads(listed.stdout) == [
        {
            "user": "u",
            "exchange": "amq.topic",
            "write": r"^allowed\.{username}",
            "read": r"^readable\.",
        }
    ]
    ctl(broker, "clear_topic_permissions", "-p", "v", "u")
    ch.basic_publish("amq.topic", "other.x", b"m")
    conn.close()


def test_a_revoked_permission_applies_to_an_open_connection(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    conn = login(broker, "u", "pw", "v")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q")
    ch.basic_publish("", "q", b"before")
    grant(broker, ".*", "^$", ".*")  # no write any more
    code, text = refused_on_channel(ch, lambda c: c.basic_publish("", "q", b"after"))
    assert (code, text) == (403, refusal("u", "write", "exchange", "amq.default"))
    ch = conn.channel()
    _m, _p, body = ch.basic_get("q", auto_ack=True)
    assert body == b"before"
    conn.close()


def test_deleting_a_vhost_closes_its_connections_and_removes_its_queues(
    user_in_vhost: Broker,
) -> None:
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    ctl(broker, "set_permissions", "-p", "v", "guest", ".*", ".*", ".*")
    conn = login(broker, "u", "pw", "v")
    ch = conn.channel()
    ch.queue_declare("vq", durable=True)
    ch.basic_publish("", "vq", b"m", pika.BasicProperties(delivery_mode=2))
    outside = login(broker, "guest", "guest", "/")  # another vhost: untouched
    ctl(broker, "delete_vhost", "v")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        wait_for(lambda: conn.process_data_events(0.05) or False, 10, "the close")
    assert caught.value.reply_code == 320
    assert caught.value.reply_text == "CONNECTION_FORCED - vhost 'v' is down"
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        login(broker, "u", "pw", "v")
    ctl(broker, "add_vhost", "v")
    grant(broker, ".*", ".*", ".*")
    again = login(broker, "u", "pw", "v").channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        again.queue_declare("vq", passive=True)
    assert gone.value.reply_code == 404
    outside.channel().queue_declare("still-here")
    outside.close()


def test_deleting_a_user_closes_their_connections(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    conn = login(broker, "u", "pw", "v")
    ctl(broker, "delete_user", "u")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        wait_for(lambda: conn.process_data_events(0.05) or False, 10, "the close")
    assert caught.value.reply_code == 320
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, "u", "pw", "v")


def test_users_and_permissions_outlive_a_restart_and_guest_comes_once(broker: Broker) -> None:
    ctl(broker, "add_user", "admin", "s3cret")
    ctl(broker, "set_user_tags", "admin", "administrator")
    ctl(broker, "set_permissions", "admin", ".*", ".*", ".*")
    ctl(broker, "add_vhost", "kept")
    ctl(broker, "set_permissions", "-p", "kept", "admin", "^a", "^b", "^c")
    ctl(broker, "set_vhost_limits", "-p", "kept", '{"max-queues": 10}')
    ctl(broker, "delete_user", "guest")
    broker.restart()
    users = json.loads(ctl(broker, "list_users", "--formatter", "json").stdout)
    assert users == [{"user": "admin", "tags": ["administrator"]}]  # guest is not made again
    perms = json.loads(ctl(broker, "list_user_permissions", "admin", "--formatter", "json").stdout)
    assert sorted(p["vhost"] for p in perms) == ["/", "kept"]
    assert {"vhost": "kept", "configure": "^a", "write": "^b", "read": "^c"} in perms
    limits = ctl(broker, "list_vhost_limits", "-p", "kept", "-q").stdout
    assert '{"max-queues":10}' in limits
    login(broker, "admin", "s3cret", "kept").close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, "guest", "guest")


def test_ctl_refuses_what_rabbitmqctl_refuses(broker: Broker) -> None:
    """rabbitmqctl 3.10's texts and exit codes (measured)."""
    for args, code, text in (
        (("add_user", "guest", "x"), 70, 'Error:\nUser "guest" already exists'),
        (("delete_user", "nobody"), 67, 'Error:\nUser "nobody" does not exist'),
        (("delete_vhost", "nope"), 65, "Virtual host 'nope' does not exist"),
        (
            ("set_permissions", "-p", "nope", "guest", ".*", ".*", ".*"),
            69,
            "Error:\nVirtual host nope does not exist",
        ),
        (
            ("set_permissions", "nobody", ".*", ".*", ".*"),
            67,
            "Error:\nUser nobody does not exist",
        ),
        (("set_permissions", "guest", "(", ".*", ".*"), 70, "invalid regular expression"),
        (("authenticate_user", "guest", "bad"), 65, "user 'guest' - invalid credentials"),
    ):
        done = shoal(broker, "ctl", *args)
        assert done.returncode == code, (args, done.returncode, done.stderr)
        assert text in done.stderr, (args, done.stderr)
    added = ctl(broker, "add_user", "x", "y").stdout
    assert added == (
        'Adding user "x" ...\nDone. Don\'t forget to grant the user permissions to some virtual '
        "hosts! See 'rabbitmqctl help set_permissions' to learn more.\n"
    )
    assert ctl(broker, "authenticate_user", "x", "y").stdout.endswith("Success\n")
    listed = ctl(broker, "list_users", "--formatter", "json").stdout
    assert listed == ('[\n{"user":"guest","tags":["administrator"]}\n,{"user":"x","tags":[]}\n]\n')


def test_vhost_and_user_limits(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    ctl(broker, "set_vhost_limits", "-p", "v", '{"max-connections": 1, "max-queues": 1}')
    first = login(broker, "u", "pw", "v")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as caught:
        login(broker, "u", "pw", "v")
    assert (
        "NOT_ALLOWED - access to vhost 'v' refused for user 'u': connection limit (1) is reached"
        in str(caught.value)
    )
    ch = first.channel()
    ch.queue_declare("one")
    code, text = refused_on_channel(ch, lambda c: c.queue_declare("two"))
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - cannot declare queue 'two': queue limit in vhost 'v' (1) is reached",
    )
    first.close()
    ctl(broker, "clear_vhost_limits", "-p", "v")
    ctl(broker, "set_user_limits", "u", '{"max-connections": 2}')
    kept = [login(broker, "u", "pw", "v") for _ in range(2)]  # on both workers, likely
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as user_limit:
        login(broker, "u", "pw", "v")
    assert (
        "NOT_ALLOWED - connection refused for user 'u': user connection limit (2) is reached"
        in str(user_limit.value)
    )
    kept.pop().close()
    wait_for(lambda: _logs_in(broker), 10, "the closed connection to be uncounted")
    for conn in kept:
        conn.close()


def test_user_max_channels_count_over_all_connections(user_in_vhost: Broker) -> None:
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    ctl(broker, "set_user_limits", "u", '{"max-channels": 2}')
    first = login(broker, "u", "pw", "v")
    kept = [first.channel(), first.channel()]
    # Any other connection, on either worker, is refused once the count is
    # known there (as RabbitMQ's channel tracking: eventually consistent).
    wait_for(lambda: _channel_refusal(broker) != "", 10, "the other worker to count them")
    assert _channel_refusal(broker) == (
        "NOT_ALLOWED - number of channels opened for user 'u' has reached the maximum "
        "allowed user limit of (2)"
    )
    kept.pop().close()  # a closed channel frees its place
    wait_for(lambda: _channel_refusal(broker) == "", 10, "the closed channel to be uncounted")
    ctl(broker, "set_user_limits", "u", '{"max-channels": 0}')
    assert _channel_refusal(broker).endswith("user limit of (0)")
    assert kept[0].is_open  # lowering a limit closes nothing
    ctl(broker, "clear_user_limits", "u", "max-channels")
    first.channel().queue_declare("after-clear")  # applies to open connections


def test_channel_counts_survive_a_scheduler_restart(user_in_vhost: Broker) -> None:
    """The counts live in the workers; a new scheduler gathers them again
    and its first totals replace what the old one had sent."""
    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    ctl(broker, "set_user_limits", "u", '{"max-channels": 1}')
    holder = login(broker, "u", "pw", "v")
    holder.channel()
    wait_for(lambda: _channel_refusal(broker) != "", 10, "the limit to be reached")
    os.kill(broker.pids("scheduler")[0], signal.SIGKILL)
    holder.close()  # while no scheduler hears of it
    wait_for(lambda: _channel_refusal(broker) == "", 20, "the channel to be uncounted")


def _channel_refusal(broker: Broker) -> str:
    """The 530 text a new connection of `u` gets for its first channel
    ("": it opened, and is closed again)."""
    conn = login(broker, "u", "pw", "v")
    try:
        conn.channel()
    except pika.exceptions.ConnectionClosedByBroker as exc:
        assert exc.reply_code == 530
        return str(exc.reply_text)
    conn.close()
    return ""


def _logs_in(broker: Broker) -> bool:
    try:
        login(broker, "u", "pw", "v").close()
    except pika.exceptions.ProbableAccessDeniedError:
        return False
    return True


def test_user_id_must_be_the_publishers_and_passwords_may_be_unicode(broker: Broker) -> None:
    ctl(broker, "add_user", "ünï", "pässwörd€")
    ctl(broker, "set_permissions", "ünï", ".*", ".*", ".*")
    conn = login(broker, "ünï", "pässwörd€")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("uid")
    ch.basic_publish("", "uid", b"own", pika.BasicProperties(user_id="ünï"))
    code, text = refused_on_channel(
        ch, lambda c: c.basic_publish("", "uid", b"forged", pika.BasicProperties(user_id="root"))
    )
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - user_id property set to 'root' but authenticated user was 'ünï'",
    )
    ctl(broker, "set_user_tags", "ünï", "impersonator")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "uid", b"allowed", pika.BasicProperties(user_id="root"))
    assert ch.queue_declare("uid", passive=True).method.message_count == 2
    conn.close()


def test_topic_permissions_hold_for_publishes_pipelined_with_the_open(
    user_in_vhost: Broker,
) -> None:
    """Frames sent in one write with connection.open are checked with the
    permissions as they are (a connection's first read)."""
    from pamqp import commands as C
    from pamqp import frame as pframe
    from pamqp import header as pheader

    broker = user_in_vhost
    grant(broker, ".*", ".*", ".*")
    ctl(broker, "set_topic_permissions", "-p", "v", "u", "amq.topic", "^allowed", ".*")
    setup = login(broker, "u", "pw", "v").channel()
    setup.queue_declare("sink")
    setup.queue_bind("sink", "amq.topic", "secret.#")
    frames = [
        (0, C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0u\0pw")),
        (0, C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0)),
        (0, C.Connection.Open(virtual_host="v")),
        (1, C.Channel.Open()),
        (1, C.Basic.Publish(exchange="amq.topic", routing_key="secret.x")),
        (1, pheader.ContentHeader(0, 0, C.Basic.Properties())),
    ]
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01" + b"".join(pframe.marshal(f, ch) for ch, f in frames))
        received = b""
        while b"access to topic 'secret.x'" not in received:
            chunk = s.recv(65536)
            assert chunk, received
            received += chunk
    assert setup.queue_declare("sink", passive=True).method.message_count == 0
