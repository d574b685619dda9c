"""The control socket's typed requests (broker/scheduler/control.py): the
JSON the clients send decodes into its op, refusals keep their texts, the
answers are the JSON they always were, and every op has its handler."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from shoal.broker.amqp import access, errors
from shoal.broker.operate import ctl
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler import scheduler as sched
from shoal.broker.scheduler.accounts import Accounts, names
from shoal.broker.scheduler.parameters import Parameters
from shoal.broker.scheduler.policies import Policies
from shoal.broker.scheduler.transfer import Transfer


def decode(request: dict[str, Any]) -> C.Op | C.Failed:
    return C.decode(json.dumps(request).encode())


def answer(reply: C.Reply | dict[str, Any]) -> Any:
    line = C.encode(reply)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    return json.loads(line)


def test_every_op_has_its_handler() -> None:
    parts = SimpleNamespace(
        accounts=object.__new__(Accounts),
        transfer=object.__new__(Transfer),
        policies=object.__new__(Policies),
        parameters=object.__new__(Parameters),
    )
    table = sched._control_table(parts)  # type: ignore[arg-type]
    assert set(table) | set(C.CONNECTION_REQUESTS) == set(C.REQUESTS)
    assert not set(table) & set(C.CONNECTION_REQUESTS)
    assert set(C.BY_NAME) >= {"add_user", "set_policy", "list_consumers", "import_definitions"}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # `shoal ctl` sends the vhost with every verb: ignored where unread.
        (
            {"op": "add_user", "vhost": "/", "user": "u", "password": "p"},
            C.AddUser(user="u", password="p"),
        ),
        (
            {"op": "set_user_tags", "user": "u", "tags": ["a", "b"]},
            C.SetUserTags(user="u", tags=["a", "b"]),
        ),
        ({"op": "add_vhost", "vhost": "v"}, C.AddVhost(vhost="v")),
        ({"op": "list_queues"}, C.ListQueues()),
        ({"op": "list_queues", "vhost": "v"}, C.ListQueues(vhost="v")),
        (
            {
                "op": "delete_queue",
                "vhost": "/",
                "queue": "q",
                "if_empty": True,
                "if_unused": False,
            },
            C.DeleteQueue(vhost="/", queue="q", if_empty=True),
        ),
        ({"op": "set_worker_count", "count": "three"}, C.SetWorkerCount(count="three")),
        (
            {
                "op": "set_policy",
                "vhost": "/",
                "name": "p",
                "pattern": "^a",
                "definition": {"message-ttl": 5},
                "priority": 2,
                "apply_to": "queues",
            },
            C.SetPolicy(
                vhost="/",
                name="p",
                pattern="^a",
                definition={"message-ttl": 5},
                priority=2,
                apply_to="queues",
            ),
        ),
        ({"op": "list_consumers", "vhost": "/"}, C.ListConsumers(vhost="/")),
        (
            {"op": "close_connection", "name": "c", "reason": "r"},
            C.CloseConnection(name="c", reason="r"),
        ),
    ],
)
def test_requests_decode_as_the_clients_send_them(request_: dict[str, Any], expected: C.Op) -> None:
    assert decode(request_) == expected


def test_a_vhost_not_given_is_the_default_one() -> None:
    request = decode({"op": "list_exchanges"})
    assert isinstance(request, C.ListExchanges)
    assert request.in_vhost("default") == "default"
    assert C.ListExchanges(vhost="").in_vhost("default") == ""


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"op": "no_such_op"}, {"error": "unknown request 'no_such_op'"}),
        ({"user": "u"}, {"error": "unknown request None"}),
        ({"op": 5}, {"error": "unknown request 5"}),
        ({"op": "add_user", "user": 5}, {"error": "user must be a string", "code": 70}),
        ({"op": "list_queues", "vhost": None}, {"error": "vhost must be a string", "code": 70}),
        (
            {"op": "set_user_tags", "user": "u", "tags": [1]},
            {"error": "tags must be a list of strings", "code": 70},
        ),
        (
            {"op": "set_user_limits", "user": "u", "limits": 3},
            {"error": "limits must be a JSON object", "code": 70},
        ),
        # The policy ops never answered with a code.
        ({"op": "set_policy", "priority": "high"}, {"error": "priority must be an integer"}),
    ],
)
def test_refused_requests_keep_their_texts(
    request_: dict[str, Any], expected: dict[str, Any]
) -> None:
    refused = decode(request_)
    assert isinstance(refused, C.Failed)
    assert answer(refused) == expected


@pytest.mark.parametrize("line", [b"{not json\n", b"{}}\n", b"[1]\n"])
def test_a_line_that_is_not_one_json_object(line: bytes) -> None:
    refused = C.decode(line)
    assert isinstance(refused, C.Failed)
    assert answer(refused) == {"error": "a request is one JSON object on one line"}


def test_names_are_a_list_or_one_string() -> None:
    assert names(None) == [] and names("") == []
    assert names("a,b c") == ["a", "b", "c"]
    assert names(["x"]) == ["x"]


def test_replies_are_the_json_they_were() -> None:
    assert answer(C.OK) == {"ok": True}
    assert answer(C.Rows([{"name": "q"}])) == {"rows": [{"name": "q"}]}
    assert answer(C.PolicyRows([])) == {"policies": []}
    assert answer(C.Counted(messages=3)) == {"ok": True, "messages": 3}
    assert answer(C.Authenticated(tags=["administrator"])) == {
        "ok": True,
        "tags": ["administrator"],
    }
    assert answer(C.Exported({"vhosts": []})) == {"definitions": {"vhosts": []}}
    row = {"wanted": 2, "workers": 2, "max_workers": 8, "settled": True, "retiring": []}
    assert answer(C.Workers(**row, rows=[row])) == {**row, "rows": [row]}  # type: ignore[arg-type]
    assert answer(C.Failed("no", 69)) == {"error": "no", "code": 69}
    assert answer(C.Failed("no")) == {"error": "no"}


def test_a_refusal_answers_in_its_own_words() -> None:
    def refuse(error: Exception) -> Any:
        def handler(request: C.Op) -> C.Reply:
            raise error

        return handler

    user_gone = refuse(access.AccessError('User "x" does not exist', 67))
    assert C.run(user_gone, C.DeleteUser(user="x")) == C.Failed('User "x" does not exist', 67)
    not_found = refuse(errors.ChannelError(errors.NOT_FOUND, "no queue 'q' in vhost '/'"))
    assert C.run(not_found, C.PurgeQueue(queue="q")) == C.Failed(
        "NOT_FOUND - no queue 'q' in vhost '/'", 70
    )
    assert C.run(refuse(ValueError("bad")), C.ClearPolicy(name="p")) == C.Failed("bad")
    with pytest.raises(KeyError):  # a bug is no refusal
        C.run(refuse(KeyError("x")), C.ListUsers())


def test_every_op_is_tagged_with_its_name() -> None:
    for name, cls in C.BY_NAME.items():
        assert msgspec.json.decode(msgspec.json.encode(cls()))["op"] == name


def test_every_shoal_ctl_verb_sends_a_request_the_scheduler_decodes(tmp_path: Path) -> None:
    definitions = tmp_path / "definitions.json"
    definitions.write_text("{}")
    values = {
        "definition": '{"max-queues": 3}',
        "value": '{"src-uri": "amqp://"}',
        "path": str(definitions),
        "count": "2",
    }
    for verb_name, verb in ctl.VERBS.items():
        argv = [verb_name, "-p", "v"]
        for arg in verb.args:
            argv += ["a", "b"] if arg.endswith("*") else [values.get(arg, arg)]
        ns = ctl._parser().parse_args(argv)
        if verb_name in ("add_vhost", "delete_vhost"):
            ns.vhost = ns.name
        request = verb.build(ns)
        assert C.decode(C.encode(request)) == request, verb_name
        vhost = getattr(request, "vhost", "v")
        assert vhost in ("v", "name"), (verb_name, vhost)  # -p, or the vhost added/deleted


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["--port", "5681", "cluster_status"], "cluster_status"),
        (["delete_queue", "step_down"], "delete_queue"),  # a queue named like a cluster verb
        (["-q", "step_down"], "step_down"),
        (["--runtime-dir=/x", "transfer_leadership", "node-1"], "transfer_leadership"),
        (["--formatter", "json", "list_queues"], "list_queues"),
    ],
)
def test_the_verb_decides_who_answers(argv: list[str], verb: str) -> None:
    """Cluster verbs go to the node's agent (broker/cluster/cluster_verbs.py), the
    rest to the scheduler: by the verb, never by a word elsewhere."""
    assert ctl._verb(argv) == verb
