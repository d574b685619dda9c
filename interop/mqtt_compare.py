"""The same MQTT behaviour probes against several brokers, side by side
(issue 41: "compare behaviour with mosquitto and with RabbitMQ's plugin on
the same scripts"). Each probe is a short exchange over a bare client
(tests/mqtt_raw.py) that prints what the broker did; docs/mqtt.md keeps the
table and says why each difference is what it is.

    python interop/mqtt_compare.py shoal=127.0.0.1:1883 mosquitto=127.0.0.1:1884 \
        rabbitmq=127.0.0.1:1885 [--user guest --password guest]
    python interop/mqtt_compare.py --start     # starts the three as bench/mqtt.py does

A probe that a broker does not take (RabbitMQ 3.10 speaks 3.1.1 only) says so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests

from shoal.broker.mqtt import packets as P
from tests.mqtt_raw import RawClient

QUIET_S = 1.0  # how long "nothing more came" is waited for

Login = dict[str, Any]


def _client(port: int, level: int, client_id: str, login: Login, **kw: Any) -> RawClient:
    c = RawClient(port, level)
    present, code, props = c.connect(client_id, kw.pop("props", {}), **login, **kw)
    if code:
        c.close()
        raise RuntimeError(f"CONNACK {code:#x}")
    c.present, c.props = present, props  # type: ignore[attr-defined]
    return c


def _drain(c: RawClient) -> list[tuple[int, P.Publish]]:
    """Every PUBLISH that comes within QUIET_S, acked."""
    got = []
    c.sock.settimeout(QUIET_S)
    try:
        while True:
            flags, message = c.received()
            got.append((flags, message))
            if message.qos == 1:
                c.ack(P.PUBACK, message.packet_id or 0)
            elif message.qos == 2:
                c.ack(P.PUBREC, message.packet_id or 0)
    except (TimeoutError, EOFError):
        pass
    return got


def _uid(name: str) -> str:
    return f"cmp-{name}-{os.getpid()}"


# ------------------------------------------------------------------ probes
def qos2_subscription(port: int, login: Login) -> str:
    c = _client(port, P.MQTT_311, _uid("q2"), login)
    try:
        granted = c.subscribe("cmp/q2/#", 2)[0]
        c.publish("cmp/q2/x", b"x", qos=2, packet_id=1)
        answer = c.read(P.PUBREC, P.PUBACK)[0]
        if answer == P.PUBREC:
            c.ack(P.PUBREL, 1)
        got = _drain(c)
        said = "PUBREC" if answer == P.PUBREC else "PUBACK (taken as QoS 1)"
        return (
            f"a QoS 2 PUBLISH gets {said}; granted {granted}, "
            f"delivered at QoS {got[0][1].qos if got else '-'}"
        )
    finally:
        c.close()


def session_present(port: int, login: Login) -> str:
    cid = _uid("sp")
    _client(port, P.MQTT_311, cid, login, clean=False).close()
    c = _client(port, P.MQTT_311, cid, login, clean=False)
    present = c.present  # type: ignore[attr-defined]
    c.close()
    _client(port, P.MQTT_311, cid, login, clean=True).close()
    return f"{int(present)}"


def overlapping(port: int, login: Login) -> str:
    c = _client(port, P.MQTT_311, _uid("ov"), login)
    try:
        c.subscribe("cmp/ov/#", 0, packet_id=1)
        c.subscribe("cmp/ov/a", 1, packet_id=2)
        c.publish("cmp/ov/a", b"x", qos=1, packet_id=3)
        got = _drain(c)
        return f"{len(got)} cop{'y' if len(got) == 1 else 'ies'} (QoS {[m.qos for _f, m in got]})"
    finally:
        c.close()


def dollar_topics(port: int, login: Login) -> str:
    c = _client(port, P.MQTT_311, _uid("dl"), login)
    try:
        c.subscribe("#", 0)
        c.publish("$cmp/x", b"x")
        c.publish("cmp/dollar", b"y")
        got = [m.topic for _f, m in _drain(c) if m.topic in ("$cmp/x", "cmp/dollar")]
        return "'#' got " + (", ".join(got) or "nothing")
    finally:
        c.close()


def retain_flag(port: int, login: Login) -> str:
    c = _client(port, P.MQTT_311, _uid("rf"), login)
    try:
        c.subscribe("cmp/rf/#", 1)
        c.publish("cmp/rf/x", b"kept", qos=1, packet_id=1, retain=True)
        live = [f & 1 for f, m in _drain(c) if m.topic == "cmp/rf/x"]
        later = _client(port, P.MQTT_311, _uid("rf2"), login)
        later.subscribe("cmp/rf/#", 1)
        kept = [f & 1 for f, m in _drain(later) if m.topic == "cmp/rf/x"]
        later.close()
        c.publish("cmp/rf/x", b"", qos=1, packet_id=2, retain=True)  # cleared
        return f"live RETAIN {live}, new subscriber RETAIN {kept}"
    finally:
        c.close()


def qos2_resend(port: int, login: Login) -> str:
    sub = _client(port, P.MQTT_311, _uid("rs"), login)
    pub = _client(port, P.MQTT_311, _uid("rp"), login)
    try:
        sub.subscribe("cmp/rs", 1)
        pub.publish("cmp/rs", b"once", qos=2, packet_id=7)
        first = pub.read(P.PUBREC, P.PUBACK)[0]
        pub.publish("cmp/rs", b"once", qos=2, packet_id=7, dup=True)  # resent before PUBREL
        pub.read(P.PUBREC, P.PUBACK)
        if first == P.PUBREC:
            pub.ack(P.PUBREL, 7)
            pub.read(P.PUBCOMP)
        return f"delivered {len(_drain(sub))} time(s)"
    finally:
        sub.close()
        pub.close()


def empty_client_id(port: int, login: Login) -> str:
    c = RawClient(port, P.MQTT_311)
    try:
        return f"CONNACK {c.connect('', {}, clean=False, **login)[1]}"
    except (EOFError, OSError) as exc:
        return f"closed ({type(exc).__name__})"
    finally:
        c.close()


def bad_protocol_level(port: int, login: Login) -> str:
    c = RawClient(port, 3)
    try:
        return f"CONNACK {c.connect(_uid('lv'), {}, **login)[1]}"
    except (EOFError, OSError) as exc:
        return f"closed ({type(exc).__name__})"
    finally:
        c.close()


def malformed_subscribe(port: int, login: Login) -> str:
    c = _client(port, P.MQTT_311, _uid("mf"), login)
    try:
        c.sock.sendall(P.packet(P.SUBSCRIBE, 0, b"\x00\x01" + P.string("a/#") + b"\x01"))  # flags 0
        return "closed" if c.closed_by_broker() else "kept open"
    finally:
        c.close()


def connack_five(port: int, login: Login) -> str:
    c = RawClient(port, P.MQTT_5)
    try:
        _present, code, props = c.connect(_uid("c5"), {}, **login)
    except (EOFError, OSError):
        return "5.0 refused (socket closed)"
    finally:
        c.close()
    if code:
        return f"5.0 refused: CONNACK {code:#x}"
    keep = (
        "maximum_qos",
        "topic_alias_maximum",
        "receive_maximum",
        "subscription_identifier_available",
        "shared_subscription_available",
        "retain_available",
    )
    return ", ".join(f"{k}={props[k]}" for k in keep if k in props) or "(no properties)"


def shared_subscription(port: int, login: Login) -> str:
    try:
        a = _client(port, P.MQTT_5, _uid("sa"), login)
        b = _client(port, P.MQTT_5, _uid("sb"), login)
    except (RuntimeError, EOFError, OSError) as exc:
        return f"5.0 refused ({exc})"
    try:
        codes = a.subscribe("$share/g/cmp/sh/#", 1) + b.subscribe("$share/g/cmp/sh/#", 1, 2)
        for i in range(10):
            a.publish(f"cmp/sh/{i}", b"x", qos=1, packet_id=10 + i)
        total = len(_drain(a)) + len(_drain(b))
        return f"SUBACK {list(codes)}, 10 messages -> {total} deliveries"
    finally:
        a.close()
        b.close()


def auth_method(port: int, login: Login) -> str:
    c = RawClient(port, P.MQTT_5)
    try:
        code = c.connect(_uid("au"), {"authentication_method": "SCRAM-SHA-1"}, **login)[1]
        return f"CONNACK {code:#x}"
    except (EOFError, OSError):
        return "closed"
    finally:
        c.close()


def empty_user_name(port: int, _login: Login) -> str:
    """A user name of length 0 and no password, at both levels (gmqtt's and
    aiomqtt's tests log in so, against an anonymous broker)."""
    codes = []
    for level in (P.MQTT_311, P.MQTT_5):
        c = RawClient(port, level)
        try:
            codes.append(f"{c.connect(_uid('eu'), {}, username='')[1]:#x}")
        except (EOFError, OSError):
            codes.append("closed")
        finally:
            c.close()
    return "CONNACK " + " / ".join(codes)


PROBES: list[tuple[str, Callable[[int, Login], str]]] = [
    ("QoS 2 subscription", qos2_subscription),
    ("session present on return (3.1.1)", session_present),
    ("overlapping subscriptions, QoS 0 and 1", overlapping),
    ("'#' and $-topics", dollar_topics),
    ("RETAIN flag", retain_flag),
    ("QoS 2 PUBLISH resent before PUBREL", qos2_resend),
    ("empty client id, persistent 3.1.1", empty_client_id),
    ("protocol level 3", bad_protocol_level),
    ("SUBSCRIBE with flags 0 (malformed)", malformed_subscribe),
    ("5.0 CONNACK properties", connack_five),
    ("5.0 shared subscription", shared_subscription),
    ("5.0 authentication method", auth_method),
    ("empty user name, no password (3.1.1 / 5.0)", empty_user_name),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("brokers", nargs="*", help="name=host:port")
    parser.add_argument(
        "--start",
        action="store_true",
        help="start Shoal, mosquitto and RabbitMQ's plugin (bench/mqtt.py's way), guest/guest",
    )
    parser.add_argument("--user")
    parser.add_argument("--password")
    ns = parser.parse_args()
    login: Login = {}
    if ns.user:
        login = {"username": ns.user, "password": (ns.password or "").encode()}
    brokers = [(b.split("=")[0], int(b.rsplit(":", 1)[1])) for b in ns.brokers]
    if ns.start:
        with contextlib.ExitStack() as stack:
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
            import mqtt as bench  # (bench/mqtt.py)

            for name, start in (
                ("Shoal", lambda: bench.started_shoal_mqtt(2, [])),
                ("mosquitto", bench.started_mosquitto),
                ("RabbitMQ 3.10", bench.started_rabbitmq_mqtt),
            ):
                broker = stack.enter_context(start())
                if broker.port:
                    brokers.append((name, broker.port))
                else:
                    print(f"{name}: not started ({broker.unavailable})", file=sys.stderr)
            _table(brokers, login or {"username": "guest", "password": b"guest"})
        return
    _table(brokers, login)


def _table(brokers: list[tuple[str, int]], login: Login) -> None:
    print("| probe | " + " | ".join(name for name, _ in brokers) + " |")
    print("|---|" + "---|" * len(brokers))
    for title, probe in PROBES:
        row = []
        for _name, port in brokers:
            try:
                row.append(probe(port, login))
            except (OSError, EOFError, RuntimeError, P.PacketError, IndexError) as exc:
                row.append(f"error: {type(exc).__name__} {exc}")
        print(f"| {title} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    socket.setdefaulttimeout(10)
    main()
