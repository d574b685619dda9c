"""CI's interop step fails when a client suite passes fewer tests, or skips
more, than interop/expected.txt records: a feature that vanishes (the TLS
listener, say: some 600 tests would turn into skips) cannot leave the step
green. (The step itself runs in .ci/run, against a real broker.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("interop_run", ROOT / "interop" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def counts(passed: int, skipped: int) -> dict[str, int]:
    return {"passed": passed, "skipped": skipped, "failed": 0, "error": 0}


def test_the_recorded_counts_cover_both_suites_and_ci_checks_them() -> None:
    run = run_module()
    expected = run.read_expected(str(ROOT / "interop" / "expected.txt"))
    assert set(expected) == set(run.SUITES)
    assert all(passed > 900 for passed, _skipped in expected.values())
    assert "--expect-file interop/expected.txt" in (ROOT / ".ci" / "run").read_text()


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
