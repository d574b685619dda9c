"""`shoal ctl`'s shovel verbs, as rabbitmq_shovel's rabbitmqctl commands:

    shoal ctl shovel_status
    shoal ctl delete_shovel [-p VHOST] NAME
    shoal ctl restart_shovel [-p VHOST] NAME

The status and a restart are the shovel process's to answer (its socket,
broker/shovel/shovel_socket.py); deleting a shovel clears its parameter at the
scheduler, as RabbitMQ's delete_shovel does."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

from shoal.broker.amqp.shovel_definition import COMPONENT
from shoal.broker.config import Config
from shoal.broker.operate.policy import request
from shoal.broker.scheduler import control as C
from shoal.broker.shovel import shovel_socket as status

VERBS = ("shovel_status", "delete_shovel", "restart_shovel")
# rabbit_shovel_status's rows as the CLI formats them (fmt_status).
STATUS_KEYS = {
    "src_protocol": "source_protocol",
    "src_uri": "source",
    "dest_protocol": "destination_protocol",
    "dest_uri": "destination",
    "src_queue": "source_queue",
    "src_exchange": "source_exchange",
    "src_exchange_key": "source_exchange_key",
    "dest_queue": "destination_queue",
    "dest_exchange": "destination_exchange",
    "dest_exchange_key": "destination_exchange_key",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal ctl")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--runtime-dir", default="")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-s", "--silent", action="store_true")
    p.add_argument("--formatter", choices=["table", "json"], default="table")
    verbs = p.add_subparsers(dest="verb", required=True)
    verbs.add_parser("shovel_status")
    for verb in ("delete_shovel", "restart_shovel"):
        sub = verbs.add_parser(verb)
        sub.add_argument("-p", "--vhost", default="/")
        sub.add_argument("name")
    return p


def cli_row(row: dict[str, Any]) -> dict[str, Any]:
    """A status row as `rabbitmqctl shovel_status` shows it."""
    shown: dict[str, Any] = {
        "name": row["name"],
        "vhost": row["vhost"],
        "type": row["type"],
        "state": row["state"],
        "last_changed": row["timestamp"],
        "source": "",
        "destination": "",
        "termination_reason": row.get("reason", ""),
    }
    for key, name in STATUS_KEYS.items():
        if key in row:
            shown[name] = row[key]
    return shown


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    runtime_dir = Config(port=ns.port, runtime_dir=ns.runtime_dir).runtime_path()
    quiet = ns.quiet or ns.silent or ns.formatter == "json"
    node = f"shoal@{socket.gethostname()}"
    try:
        if ns.verb == "shovel_status":
            if not quiet:
                print(f"Shovel status on node {node}")
            rows = [cli_row(r) for r in status.status(runtime_dir)]
            _print(rows, ns.formatter, ns.silent)
            return 0
        if ns.verb == "restart_shovel":
            if not quiet:
                print(f"Restarting dynamic Shovel {ns.name} in virtual host {ns.vhost}")
            if status.restart(runtime_dir, ns.vhost, ns.name):
                return 0
        else:
            if not quiet:
                print(f"Deleting shovel {ns.name} in vhost {ns.vhost}")
            found = any(
                r["name"] == ns.name and r["vhost"] == ns.vhost
                for r in status.status(runtime_dir, ns.vhost)
            )
            if found:
                clear = C.ClearParameter(vhost=ns.vhost, component=COMPONENT, name=ns.name)
                answer = request(runtime_dir, clear)
                if "error" not in answer:
                    return 0
    except OSError as exc:
        print(f"Error: no shovel process answering at {runtime_dir}: {exc}", file=sys.stderr)
        return 69
    print(
        "Error:\nShovel with the given name was not found on the target node "
        f"'{node}' and / or virtual host '{ns.vhost}'",
        file=sys.stderr,
    )
    return 69


def _print(rows: list[dict[str, Any]], formatter: str, silent: bool) -> None:
    if formatter == "json":
        print(json.dumps(rows))
        return
    columns = sorted({key for row in rows for key in row})
    if not silent and columns:
        print("\t".join(columns))
    for row in rows:
        print("\t".join(str(row.get(c, "")) for c in columns))
