"""CI's interop step fails when a client suite passes fewer tests, or skips
more, than interop/expected.txt records: a feature that vanishes (the TLS
listener, say: some 600 tests would turn into skips) cannot leave the step
green. (The step itself runs in .ci/run, against a real broker.)"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("interop_run", ROOT / "interop" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def counts(passed: int, skipped: int) -> dict[str, int]:
    return {"passed": passed, "skipped": skipped, "failed": 0, "error": 0}


def go_client_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """interop/go_client.py, which imports interop/run.py as `run` (its
    directory first on sys.path, as when it runs as a script)."""
    monkeypatch.syspath_prepend(str(ROOT / "interop"))
    for name in ("run", "go_client"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("go_client")
    monkeypatch.delitem(sys.modules, "go_client")
    monkeypatch.delitem(sys.modules, "run")
    return module


def test_the_recorded_counts_cover_every_suite_and_ci_checks_them() -> None:
    run = run_module()
    expected = run.read_expected(str(ROOT / "interop" / "expected.txt"))
    assert set(expected) == {*run.SUITES, "amqp091-go", "paho.mqtt.golang", "aiomqtt", "gmqtt"}
    assert all(
        passed > 900 for suite, (passed, _skipped) in expected.items() if suite in run.SUITES
    )
    assert expected["amqp091-go"] == (111, 0)
    assert expected["paho.mqtt.golang"] == (40, 0)
    assert expected["aiomqtt"] == (58, 0)
    assert expected["gmqtt"] == (82, 0)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "interop/run.py --deselect-file interop/deselect.txt" in ci
    assert "interop/go_client.py --deselect-file interop/deselect.txt" in ci
    assert "interop/go_mqtt.py --deselect-file interop/deselect.txt" in ci
    assert "interop/aiomqtt_suite.py --deselect-file interop/deselect.txt" in ci
    assert "interop/gmqtt_suite.py --deselect-file interop/deselect.txt" in ci
    assert ci.count("--expect-file interop/expected.txt") == 5
    assert "\n.venv/bin/python interop/paho_mqtt.py\n" in ci  # (any failure fails it)


GO_RUN = """=== RUN   TestIntegrationOpenClose
--- PASS: TestIntegrationOpenClose (0.01s)
=== RUN   TestIntegrationChannelClosing
    --- PASS: TestIntegrationChannelClosing/sub (0.00s)
--- PASS: TestIntegrationChannelClosing (0.25s)
=== RUN   TestIntegrationConsumeFlow
--- FAIL: TestIntegrationConsumeFlow (0.01s)
panic: interface conversion: error is nil, not *amqp091.Error [recovered]
"""


def test_a_go_run_that_panics_counts_the_tests_it_never_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    go = go_client_module(monkeypatch)
    selected = [
        "TestIntegrationOpenClose",
        "TestIntegrationChannelClosing",
        "TestIntegrationConsumeFlow",
        "TestIntegrationPublishConsume",
        "ExampleConnection_reconnect",
    ]
    c = go.tally(GO_RUN, selected)
    assert (c["PASS"], c["FAIL"], c["SKIP"]) == (2, 1, 0)  # the subtest is not counted
    assert c["not run"] == 1  # PublishConsume, after the panic
    assert c["panic"] == 1 and c["goleak"] == 0


def test_a_go_run_stopped_by_its_time_limit_names_the_test_that_hung(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    go = go_client_module(monkeypatch)
    text = (
        "=== RUN   TestOpen\n--- PASS: TestOpen (0.00s)\n"
        "=== RUN   TestConfirm\n=== RUN   TestConfirm/sub\n"
        "panic: test timed out after 5m0s\n"
    )
    c = go.tally(text, ["TestOpen", "TestConfirm", "TestLater"])
    assert c["running"] == ["TestConfirm"]  # not its subtest, not the one never started
    assert (c["PASS"], c["not run"], c["panic"]) == (1, 2, 1)


def test_a_go_run_that_leaves_a_connection_open_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    go = go_client_module(monkeypatch)
    text = (
        "--- PASS: TestA (0.01s)\nPASS\n"
        "goleak: Errors on successful test run: found unexpected goroutines:\n"
    )
    c = go.tally(text, ["TestA"])
    assert (c["PASS"], c["not run"], c["panic"], c["goleak"]) == (1, 0, 0, 1)


def test_fewer_passed_or_more_skipped_fails() -> None:
    run = run_module()
    expected = {"aio-pika": (1069, 35), "aiormq": (1030, 20)}
    same = {"aio-pika": counts(1069, 35), "aiormq": counts(1030, 20)}
    assert run.meets_expectations(same, expected)
    more = {"aio-pika": counts(1070, 34), "aiormq": counts(1030, 20)}
    assert run.meets_expectations(more, expected)
    tls_gone = {"aio-pika": counts(941, 163), "aiormq": counts(1030, 20)}
    assert not run.meets_expectations(tls_gone, expected)
    one_skip_more = {"aio-pika": counts(1069, 36), "aiormq": counts(1030, 20)}
    assert not run.meets_expectations(one_skip_more, expected)
