"""pytest plugin that interop/run.py loads into the aio-pika/aiormq runs.

- Writes one JSON line per test report to $INTEROP_RESULTS as it happens
  (flushed), so the outcomes survive a run that has to be killed: the
  upstream suites run under aiomisc's event loop, and pytest there does not
  always stop on the first SIGINT, which used to lose the JUnit XML.
- Leaves out the test ids listed in $INTEROP_DESELECT (one per line): an id
  matches itself, its parametrizations (`id[...]`) and, for a class or
  module, everything in it; `*` matches any run of characters
  (`tests/test_amqp*.py::*::test_dlx`), nothing else is special.  Unlike pytest's --deselect (a bare
  prefix match) `test_x` does not also drop `test_x_more`.  Entries that
  match nothing are reported, so the list cannot go stale silently.
- Stops the session cleanly, between two tests, once the wall-clock time
  $INTEROP_DEADLINE (epoch seconds) has passed: pytest then still writes
  its summary and the JUnit XML; tests not run are counted by run.py.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pytest

_out: Any = None
_deadline: float | None = None


def _write(record: dict[str, Any]) -> None:
    if _out is not None:
        _out.write(json.dumps(record) + "\n")
        _out.flush()


def _message(report: pytest.TestReport) -> str:
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple):  # skip: (path, lineno, reason)
        return str(lr[2])
    crash = getattr(lr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(lr).strip().splitlines()[-1] if str(lr).strip() else ""


def pytest_configure(config: pytest.Config) -> None:
    global _out, _deadline
    path = os.environ.get("INTEROP_RESULTS")
    if path:
        _out = open(path, "a", buffering=1)  # noqa: SIM115  closed in unconfigure
    if os.environ.get("INTEROP_DEADLINE"):
        _deadline = float(os.environ["INTEROP_DEADLINE"])


def pytest_unconfigure(config: pytest.Config) -> None:
    global _out
    if _out is not None:
        _out.close()
        _out = None


def _matches(nodeid: str, entry: str) -> bool:
    if "*" in entry:
        pattern = ".*".join(re.escape(part) for part in entry.split("*"))
        return re.fullmatch(pattern + r"(\[.*|::.*)?", nodeid) is not None
    return nodeid == entry or nodeid.startswith((entry + "[", entry + "::"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get("INTEROP_DESELECT")
    entries = []
    if path:
        with open(path) as fh:
            entries = [line.strip() for line in fh if line.strip()]
    if not entries:
        return
    used: set[str] = set()
    keep, drop = [], []
    for item in items:
        hit = [e for e in entries if _matches(item.nodeid, e)]
        used.update(hit)
        (drop if hit else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    _write({"deselected": len(drop)})
    for entry in entries:
        if entry not in used:
            _write({"unmatched_deselect": entry})


def pytest_collection_finish(session: pytest.Session) -> None:
    _write({"collected": len(session.items)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _write(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"),
            "duration": round(report.duration, 3),
            "message": _message(report)[:500],
        }
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    yield
    if _deadline is not None and time.time() > _deadline and nextitem is not None:
        item.session.shouldstop = "interop: suite time limit reached"
