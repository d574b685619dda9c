"""`shoal ctl`: rabbitmqctl's verbs for a running broker (issue 16, item 5).

    shoal ctl [--port P | --runtime-dir D] [-q] [--formatter json] VERB [-p VHOST] ARGS...

It finds the broker as `shoal status` does and sends one JSON request to
the scheduler's control socket (`<runtime dir>/scheduler.sock`), whose file
permissions are the access check: who can open it administers the broker.
Output is rabbitmqctl's: a banner ("Listing users ..."), then a header row
and tab-separated rows; `-q` drops the banner, `--formatter json` prints
the rows as a JSON array.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from shoal.broker.config import Config
from shoal.broker.operate import shovel_verbs
from shoal.broker.operate.policy import request
from shoal.broker.scheduler import control as C

Row = dict[str, Any]


class Verb:
    """A verb: its positional arguments, how they become a request, and
    (for a listing) its banner and default columns."""

    def __init__(
        self,
        args: tuple[str, ...],
        build: Callable[[argparse.Namespace], C.Op],
        banner: str = "",
        columns: tuple[str, ...] = (),
        done: str = "",
        optional: tuple[str, ...] = (),
    ) -> None:
        self.args = args
        self.optional = optional
        self.build = build
        self.banner = banner
        self.columns = columns
        self.done = done


def _fields(*names: str, op: str = "") -> Callable[[argparse.Namespace], C.Op]:
    """The request of op `op` (the verb's own by default) with these
    arguments, and the vhost (-p) for an op on one."""

    def build(ns: argparse.Namespace) -> C.Op:
        cls = C.BY_NAME[op or ns.verb]
        fields = {name: getattr(ns, name) for name in names}
        if "vhost" in cls.__struct_fields__:
            fields["vhost"] = ns.vhost
        return cls(**fields)

    return build


def _tags(ns: argparse.Namespace) -> C.Op:
    return C.SetUserTags(user=ns.user, tags=ns.tags)


def _limits(ns: argparse.Namespace) -> dict[str, Any]:
    try:
        limits: dict[str, Any] = json.loads(ns.definition)
    except ValueError as exc:
        raise SystemExit(f"Error: the limits are not JSON: {exc}") from None
    return limits  # not an object: refused by the broker, in its words


def _user_limits(ns: argparse.Namespace) -> C.Op:
    return C.SetUserLimits(user=ns.user, limits=_limits(ns))


def _vhost_limits(ns: argparse.Namespace) -> C.Op:
    return C.SetVhostLimits(vhost=ns.vhost, limits=_limits(ns))


def _import(ns: argparse.Namespace) -> C.Op:
    try:
        text = sys.stdin.read() if ns.path == "-" else open(ns.path).read()  # noqa: SIM115
        definitions = json.loads(text)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"Error: cannot read definitions from {ns.path}: {exc}") from None
    return C.ImportDefinitions(definitions=definitions)


def _policy(ns: argparse.Namespace) -> C.Op:
    try:
        definition = json.loads(ns.definition)
    except ValueError as exc:
        raise SystemExit(f"Error: the policy definition is not JSON: {exc}") from None
    return C.SetPolicy(
        vhost=ns.vhost,
        name=ns.name,
        pattern=ns.pattern,
        definition=definition,
        priority=ns.priority,
        apply_to=ns.apply_to,
    )


def _parameter(ns: argparse.Namespace) -> C.Op:
    try:
        value = json.loads(ns.value)
    except ValueError as exc:
        raise SystemExit(f"Error: the parameter's value is not JSON: {exc}") from None
    return C.SetParameter(vhost=ns.vhost, component=ns.component, name=ns.name, value=value)


BINDING_COLUMNS = (
    "source_name",
    "source_kind",
    "destination_name",
    "destination_kind",
    "routing_key",
    "arguments",
)


def _worker_count(ns: argparse.Namespace) -> C.Op:
    try:
        count = int(ns.count)
    except ValueError:
        count = ns.count  # refused by the broker, in its words
    return C.SetWorkerCount(count=count)


WORKER_COLUMNS = ("wanted", "workers", "max_workers", "settled", "retiring")
SCALE_WAIT = 60.0  # s: set_worker_count waits this long for the workers to settle

CONSUMER_COLUMNS = (
    "queue_name",
    "channel_pid",
    "consumer_tag",
    "ack_required",
    "prefetch_count",
    "active",
    "arguments",
)

VERBS: dict[str, Verb] = {
    "add_user": Verb(
        ("user", "password"), _fields("user", "password"), done='Adding user "{user}" ...'
    ),
    "delete_user": Verb(("user",), _fields("user"), done='Deleting user "{user}" ...'),
    "change_password": Verb(
        ("user", "password"),
        _fields("user", "password"),
        done='Changing password for user "{user}" ...',
    ),
    "clear_password": Verb(
        ("user",), _fields("user"), done='Clearing password for user "{user}" ...'
    ),
    "authenticate_user": Verb(
        ("user", "password"),
        _fields("user", "password"),
        done='Authenticating user "{user}" ...',
    ),
    "set_user_tags": Verb(
        ("user", "tags*"), _tags, done='Setting tags for user "{user}" to [{tags}] ...'
    ),
    "list_users": Verb((), _fields(), "Listing users ...", ("user", "tags")),
    "set_user_limits": Verb(
        ("user", "definition"),
        _user_limits,
        done='Setting user limits to "{definition}" for user "{user}" ...',
    ),
    "clear_user_limits": Verb(
        ("user", "limit"),
        _fields("user", "limit"),
        done='Clearing "{limit}" limit for user "{user}" ...',
    ),
    "list_user_limits": Verb(
        (),
        _fields(op="list_users"),
        'Listing limits for user "{user}" ...',
        ("user", "limits"),
        optional=("user",),
    ),
    "add_vhost": Verb(("name",), _fields(op="add_vhost"), done='Adding vhost "{name}" ...'),
    "delete_vhost": Verb(("name",), _fields(op="delete_vhost"), done='Deleting vhost "{name}" ...'),
    "list_vhosts": Verb((), _fields(), "Listing vhosts ...", ("name",)),
    "trace_on": Verb((), _fields(), done='Starting tracing for vhost "{vhost}" ...'),
    "trace_off": Verb((), _fields(), done='Stopping tracing for vhost "{vhost}" ...'),
    "set_vhost_limits": Verb(
        ("definition",),
        _vhost_limits,
        done='Setting vhost limits to "{definition}" for vhost "{vhost}" ...',
    ),
    "clear_vhost_limits": Verb((), _fields(), done='Clearing vhost "{vhost}" limits ...'),
    "list_vhost_limits": Verb(
        (),
        _fields(op="list_vhosts"),
        'Listing limits for vhost "{vhost}" ...',
        ("vhost", "limits"),
    ),
    "set_permissions": Verb(
        ("user", "configure", "write", "read"),
        _fields("user", "configure", "write", "read"),
        done='Setting permissions for user "{user}" in vhost "{vhost}" ...',
    ),
    "clear_permissions": Verb(
        ("user",),
        _fields("user"),
        done='Clearing permissions for user "{user}" in vhost "{vhost}" ...',
    ),
    "list_permissions": Verb(
        (),
        _fields(),
        'Listing permissions for vhost "{vhost}" ...',
        ("user", "configure", "write", "read"),
    ),
    "list_user_permissions": Verb(
        ("user",),
        _fields("user", op="list_permissions"),
        'Listing permissions for user "{user}" ...',
        ("vhost", "configure", "write", "read"),
    ),
    "set_topic_permissions": Verb(
        ("user", "exchange", "write", "read"),
        _fields("user", "exchange", "write", "read"),
        done='Setting topic permissions on "{exchange}" for user "{user}" in vhost "{vhost}" ...',
    ),
    "clear_topic_permissions": Verb(
        ("user",),
        _fields("user", "exchange"),
        done='Clearing topic permissions for user "{user}" in vhost "{vhost}" ...',
        optional=("exchange",),
    ),
    "list_topic_permissions": Verb(
        (),
        _fields(),
        'Listing topic permissions for vhost "{vhost}" ...',
        ("user", "exchange", "write", "read"),
    ),
    "list_user_topic_permissions": Verb(
        ("user",),
        _fields("user", op="list_topic_permissions"),
        'Listing topic permissions for user "{user}" ...',
        ("vhost", "exchange", "write", "read"),
    ),
    "list_queues": Verb(
        (),
        _fields(),
        "Timeout: 60.0 seconds ...\nListing queues for vhost {vhost} ...",
        ("name", "messages"),
    ),
    "list_exchanges": Verb(
        (), _fields(), "Listing exchanges for vhost {vhost} ...", ("name", "type")
    ),
    "list_bindings": Verb(
        (),
        _fields(),
        "Listing bindings for vhost {vhost}...",
        BINDING_COLUMNS,
    ),
    "purge_queue": Verb(
        ("queue",), _fields("queue"), done="Purging queue '{queue}' in vhost '{vhost}' ..."
    ),
    "delete_queue": Verb(
        ("queue",),
        _fields("queue", "if_empty", "if_unused"),
        done="Deleting queue '{queue}' on vhost '{vhost}' ...",
    ),
    "list_connections": Verb(
        (), _fields(), "Listing connections ...", ("user", "peer_host", "peer_port", "state")
    ),
    "list_channels": Verb(
        (),
        _fields(),
        "Listing channels ...",
        ("pid", "user", "consumer_count", "messages_unacknowledged"),
    ),
    "list_consumers": Verb(
        (),
        _fields(),
        "Listing consumers in vhost {vhost} ...",
        CONSUMER_COLUMNS,
    ),
    "close_connection": Verb(
        ("name", "reason"),
        _fields("name", "reason", op="close_connection"),
        done="Closing connection {name}, reason: {reason}...",
    ),
    "export_definitions": Verb(
        ("path",), _fields(), done='Exporting definitions in JSON to a file at "{path}" ...'
    ),
    "import_definitions": Verb(
        ("path",), _import, done='Importing definitions in JSON from a file at "{path}" ...'
    ),
    "set_policy": Verb(
        ("name", "pattern", "definition"),
        _policy,
        done='Setting policy "{name}" for pattern "{pattern}" to "{definition}" with priority '
        '"{priority}" for vhost "{vhost}" ...',
    ),
    "clear_policy": Verb(
        ("name",), _fields("name"), done='Clearing policy "{name}" on vhost "{vhost}" ...'
    ),
    "set_worker_count": Verb(
        ("count",), _worker_count, done="Setting the number of IO workers to {count} ..."
    ),
    "worker_count": Verb((), _fields(), "Asking for the number of IO workers ...", WORKER_COLUMNS),
    "set_parameter": Verb(
        ("component", "name", "value"),
        _parameter,
        done='Setting runtime parameter "{name}" for component "{component}" to "{value}" '
        'in vhost "{vhost}" ...',
    ),
    "clear_parameter": Verb(
        ("component", "name"),
        _fields("component", "name"),
        done='Clearing runtime parameter "{name}" for component "{component}" on vhost '
        '"{vhost}" ...',
    ),
    "list_parameters": Verb(
        (),
        _fields(),
        'Listing runtime parameters for vhost "{vhost}" ...',
        ("component", "name", "value"),
    ),
    "list_policies": Verb(
        (),
        _fields(),
        'Listing policies for vhost "{vhost}" ...',
        ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal ctl", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--runtime-dir", default="")
    p.add_argument("-q", "--quiet", action="store_true", help="no banner")
    p.add_argument("-s", "--silent", action="store_true", help="no banner, no header row")
    p.add_argument("--formatter", choices=["table", "json"], default="table")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, verb in VERBS.items():
        sub = verbs.add_parser(name)
        sub.add_argument("-p", "--vhost", default="/")
        if name == "delete_queue":
            sub.add_argument("-e", "--if-empty", action="store_true")
            sub.add_argument("-u", "--if-unused", action="store_true")
        if name == "set_policy":
            sub.add_argument("--priority", type=int, default=0)
            sub.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"])
        for arg in verb.args:
            if arg.endswith("*"):
                sub.add_argument(arg[:-1], nargs="*")
            else:
                sub.add_argument(arg)
        for arg in verb.optional:
            sub.add_argument(arg, nargs="?", default="")
        if verb.columns:
            sub.add_argument("columns", nargs="*", help=f"default: {' '.join(verb.columns)}")
    return p


GLOBAL_FLAGS = {"-q": 0, "--quiet": 0, "-s": 0, "--silent": 0, "--formatter": 1}
GLOBAL_FLAGS |= {"--port": 1, "--runtime-dir": 1}


def _globals_first(argv: list[str]) -> list[str]:
    """rabbitmqctl takes its global flags anywhere: put them before the verb."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in GLOBAL_FLAGS:
            takes = GLOBAL_FLAGS[name] if "=" not in arg else 0
            front += argv[i : i + 1 + takes]
            i += 1 + takes
        else:
            rest.append(arg)
            i += 1
    return front + rest


def _verb(argv: list[str]) -> str:
    """The verb: the first word that is neither a global flag nor its value."""
    i = 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in GLOBAL_FLAGS:
            i += 1 + (GLOBAL_FLAGS[name] if "=" not in argv[i] else 0)
        elif argv[i].startswith("-"):
            i += 1
        else:
            return argv[i]
    return ""


def main(argv: list[str]) -> int:
    if argv[-1:] == ["status"] or argv[:1] == ["status"]:  # rabbitmqctl status: `shoal status`
        from shoal.broker.operate import status

        rest = [a for a in argv if a != "status"]
        ns_status = argparse.ArgumentParser(add_help=False)
        ns_status.add_argument("--port", type=int, default=5672)
        ns_status.add_argument("--runtime-dir", default="")
        known, _ = ns_status.parse_known_args(rest)
        return status.main(
            Config(port=known.port, runtime_dir=known.runtime_dir).runtime_path(), False
        )
    from shoal.broker.cluster import cluster_verbs as cluster_control

    if _verb(argv) in cluster_control.VERBS:  # a cluster node's agent answers these
        return cluster_control.main(_globals_first(argv))
    if _verb(argv) in shovel_verbs.VERBS:  # the shovel process answers these
        return shovel_verbs.main(_globals_first(argv))
    ns = _parser().parse_args(_globals_first(argv))
    verb = VERBS[ns.verb]
    if ns.verb in ("add_vhost", "delete_vhost"):
        ns.vhost = ns.name
    message = verb.build(ns)
    quiet = ns.quiet or ns.silent or ns.formatter == "json"
    if ns.verb == "export_definitions" and ns.path == "-":
        quiet = True  # standard output is the JSON alone
    words = {k: (" ".join(v) if isinstance(v, list) else v) for k, v in vars(ns).items()}
    if not quiet:
        print((verb.banner or verb.done).format(**words))
    runtime_dir = Config(port=ns.port, runtime_dir=ns.runtime_dir).runtime_path()
    try:
        answer = request(runtime_dir, message)
    except OSError as exc:
        print(f"Error: no broker answering at {runtime_dir}: {exc}", file=sys.stderr)
        return 69  # rabbitmqctl's "node down" (EX_UNAVAILABLE)
    if "error" in answer:
        code = int(answer.get("code", 70))  # rabbitmqctl's exit codes (EX_SOFTWARE ...)
        # rabbitmqctl writes "Error:" above most errors, not "does not exist" of a vhost.
        error = answer["error"]
        print(
            error if code == 65 and "Virtual host" in error else f"Error:\n{error}", file=sys.stderr
        )
        return code
    if ns.verb == "set_worker_count":
        return _wait_for_workers(runtime_dir, answer, quiet)
    if ns.verb == "add_user" and not quiet:
        print(
            "Done. Don't forget to grant the user permissions to some virtual hosts! See "
            "'rabbitmqctl help set_permissions' to learn more."
        )
    if ns.verb == "authenticate_user" and not quiet:
        print("Success")
    if ns.verb in ("trace_on", "trace_off"):  # (rabbitmqctl prints it with -q too)
        print(f"Trace {'enabled' if ns.verb == 'trace_on' else 'disabled'} for vhost {ns.vhost}")
    if ns.verb == "export_definitions":
        text = json.dumps(answer["definitions"], indent=1)
        if ns.path == "-":
            print(text)
        else:
            with open(ns.path, "w") as f:
                f.write(text + "\n")
    if ns.verb in ("purge_queue", "delete_queue") and ns.verb == "delete_queue" and not quiet:
        print(f"Queue was successfully deleted with {answer.get('messages', 0)} ready messages")
    if verb.columns:
        rows = answer.get("rows", answer.get("policies", []))
        if ns.verb == "list_user_limits":  # the limits alone, as JSON
            for row in rows:
                if row["user"] == ns.user and row["limits"]:
                    print(json.dumps(row["limits"], separators=(",", ":")))
            return 0
        if ns.verb == "list_vhost_limits":  # the limits alone, as JSON
            for row in rows:
                if row["name"] == ns.vhost and row["limits"]:
                    print(json.dumps(row["limits"], separators=(",", ":")))
            return 0
        _print_rows(rows, tuple(ns.columns) or verb.columns, ns.formatter, ns.silent)
    return 0


def _wait_for_workers(runtime_dir: str, answer: dict[str, Any], quiet: bool) -> int:
    """set_worker_count returns once the count asked for serves (bounded):
    0, or 75 (EX_TEMPFAIL) if a retiring worker is still paging in."""
    deadline = time.monotonic() + SCALE_WAIT
    while not answer.get("settled") and time.monotonic() < deadline:
        time.sleep(0.05)
        answer = request(runtime_dir, C.WorkerCount())
    if not answer.get("settled"):
        print(
            f"Error:\n{answer.get('workers')} IO workers serve, {answer.get('wanted')} asked for; "
            f"still retiring: {answer.get('retiring')}",
            file=sys.stderr,
        )
        return 75
    if not quiet:
        print(f"{answer['workers']} IO workers")
    return 0


def _print_rows(rows: list[Row], columns: tuple[str, ...], formatter: str, silent: bool) -> None:
    if formatter == "json":  # as rabbitmqctl lays it out: one object a line
        objects = [
            json.dumps({c: row.get(c, "") for c in columns}, separators=(",", ":")) for row in rows
        ]
        print("[\n" + "\n,".join(objects) + ("\n]" if objects else "]"))
        return
    if not silent:
        print("\t".join(columns))
    for row in rows:
        print("\t".join(_cell(row.get(c, "")) for c in columns))


def _cell(value: Any) -> str:
    if value == {}:
        return "[]"  # an empty table, as Erlang prints it
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
