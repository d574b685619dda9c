"""`shoal policy`: set, clear and list policies (broker/amqp/policy_rules.py)
of a running broker, as rabbitmqctl's set_policy / clear_policy /
list_policies do, through the scheduler's control socket (found as `shoal
status` finds the broker: --port or --runtime-dir).

    shoal policy set NAME PATTERN DEFINITION [--priority N] [--apply-to queues|exchanges|all]
                     [--vhost V]
    shoal policy clear NAME [--vhost V]
    shoal policy list [--vhost V] [--json]

DEFINITION is a JSON object, e.g. '{"message-ttl": 60000, "dead-letter-exchange": "dlx"}'.
"""

from __future__ import annotations

import argparse
import json
import socket
from typing import Any

from shoal.broker.config import Config
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.introspect import socket_path


def request(runtime_dir: str, message: C.Op, timeout: float = 10.0) -> dict[str, Any]:
    """One request to the scheduler's control socket (control.py), and its
    answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path(runtime_dir))
        sock.sendall(C.encode(message))
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal policy", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--runtime-dir", default="")
    p.add_argument("--vhost", default="/")
    verbs = p.add_subparsers(dest="verb", required=True)
    set_ = verbs.add_parser("set", help="set (or replace) a policy")
    set_.add_argument("name")
    set_.add_argument("pattern", help="a regular expression searched in queue names")
    set_.add_argument("definition", help="a JSON object of policy keys")
    set_.add_argument("--priority", type=int, default=0)
    set_.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"])
    clear = verbs.add_parser("clear", help="remove a policy")
    clear.add_argument("name")
    list_ = verbs.add_parser("list", help="the policies of a virtual host")
    list_.add_argument("--json", action="store_true")
    return p


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    message: C.Op
    if ns.verb == "list":
        message = C.ListPolicies(vhost=ns.vhost)
    elif ns.verb == "clear":
        message = C.ClearPolicy(vhost=ns.vhost, name=ns.name)
    else:
        try:
            definition = json.loads(ns.definition)
        except ValueError as exc:
            print(f"shoal policy: the definition is not JSON: {exc}")
            return 2
        if not isinstance(definition, dict):
            print("shoal policy: the definition must be a JSON object")
            return 2
        message = C.SetPolicy(
            vhost=ns.vhost,
            name=ns.name,
            pattern=ns.pattern,
            definition=definition,
            priority=ns.priority,
            apply_to=ns.apply_to,
        )
    runtime_dir = Config(port=ns.port, runtime_dir=ns.runtime_dir).runtime_path()
    try:
        answer = request(runtime_dir, message)
    except OSError as exc:
        print(f"shoal policy: no scheduler answering at {runtime_dir}: {exc}")
        return 1
    if "error" in answer:
        print(f"shoal policy: {answer['error']}")
        return 1
    if ns.verb == "list":
        rows = answer["policies"]
        if ns.json:
            print(json.dumps(rows, indent=2))
        else:
            print("vhost\tname\tpattern\tapply-to\tdefinition\tpriority")
            for p in rows:
                print(
                    f"{p['vhost']}\t{p['name']}\t{p['pattern']}\t{p['apply-to']}\t"
                    f"{json.dumps(p['definition'])}\t{p['priority']}"
                )
    return 0
