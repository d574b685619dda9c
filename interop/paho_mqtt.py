#!/usr/bin/env python3
"""Eclipse Paho's MQTT interoperability tests against Shoal (issue 41).

    python interop/paho_mqtt.py                 # both files, each against a fresh Shoal
    python interop/paho_mqtt.py --file client_test5.py --test test_will_message

`client_test.py` (MQTT 3.1.1) and `client_test5.py` (MQTT 5.0) of
paho.mqtt.testing's `interoperability/` (9d7bb80) are the conformance tests MQTT
brokers are commonly checked with; interop/paho_mqtt_testing/ holds them and the
client and packet modules they import, unchanged (EPL-2.0 or BSD-3-Clause, the
licence files beside them). Each file runs in its own process against its own
broker, the two at once (their tests mostly wait on the broker):

- client_test.py: a broker with defaults, and the topic permission the file's
  `test_subscribe_failure` needs ("a broker configured to refuse
  test/nosubscribe"): guest may not read `test.nosubscribe` on amq.topic;
- client_test5.py: a broker with `--mqtt-max-keep-alive 60`, the test broker's
  setting its `test_server_keep_alive` expects (mosquitto's `max_keepalive 60`).
  Its `test_subscribe_failure` is not run: the file's own client asserts that a
  5.0 SUBACK's code is one of 3.1.1's (0, 1, 2, 0x80) and stops on the 0x87 (not
  authorized) of section 3.9.3 that Shoal and mosquitto send (docs/mqtt.md).

Exit status 0 only if every test run passed. Output, per file, in
interop/.cache/results/paho-FILE.log (the tests' own) and paho-FILE-broker.log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from run import REPO, RESULTS, Shoal, free_port, log

SUITE = Path(__file__).resolve().parent / "paho_mqtt_testing"
FILE_TIMEOUT_S = 600  # the 5.0 file takes ~160 s on a 2-core machine

# What a file is run with: the broker's extra options, ctl commands once it is
# up, and the tests left out (name: why).
PLANS: dict[str, tuple[list[str], list[list[str]], dict[str, str]]] = {
    "client_test.py": (
        [],
        [["set_topic_permissions", "guest", "amq.topic", ".*", r"^(?!test\.nosubscribe$).*"]],
        {},
    ),
    "client_test5.py": (
        ["--mqtt-max-keep-alive", "60"],
        [],
        {
            "test_subscribe_failure": "the suite's client rejects a 5.0 SUBACK code 0x87",
        },
    ),
}


def drive(file: str, port: int, out: str, names: list[str]) -> None:
    """In the child process: import the test file as its `__main__` block would
    run it (host, port and the topic names are module globals its tests read),
    run the named tests (all when none), and write the outcome to `out`."""
    sys.path.insert(0, str(SUITE))
    # The suite's `mqtt/__init__.py` imports its test brokers as well, which are
    # not vendored: the package is made here with only its path.
    package = types.ModuleType("mqtt")
    package.__path__ = [str(SUITE / "mqtt")]
    sys.modules["mqtt"] = package
    module = __import__(file.removesuffix(".py"))
    module.host, module.port = "127.0.0.1", port
    module.topics = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
    module.wildtopics = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
    module.nosubscribe_topics = ("test/nosubscribe",)
    module.topic_prefix = "client_test5/"  # the 5.0 file's shared subscription test
    loader = unittest.defaultTestLoader
    if names:
        suite = loader.loadTestsFromNames([f"Test.{n}" for n in names], module)
    else:
        suite = loader.loadTestsFromTestCase(module.Test)
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    outcome = {
        "ran": result.testsRun,
        "failed": [t.id().rsplit(".", 1)[-1] for t, _ in result.failures + result.errors],
        "skipped": [t.id().rsplit(".", 1)[-1] for t, _ in result.skipped],
    }
    Path(out).write_text(json.dumps(outcome))


def test_names(file: str) -> list[str]:
    text = (SUITE / file).read_text()
    return [
        line.split("def ", 1)[1].split("(", 1)[0]
        for line in text.splitlines()
        if line.lstrip().startswith("def test_")
    ]


def run_file(file: str, only: list[str]) -> tuple[str, bool, str]:
    extra, commands, left_out = PLANS[file]
    names = only or [n for n in test_names(file) if n not in left_out]
    mqtt_port = free_port()
    stem = file.removesuffix(".py")
    RESULTS.mkdir(parents=True, exist_ok=True)
    broker_log = RESULTS / f"paho-{stem}-broker.log"
    extra = [*extra, "--mqtt-port", str(mqtt_port)]
    with Shoal(broker_log, extra) as shoal:
        for command in commands:
            ctl = [sys.executable, "-m", "shoal.broker", "ctl", "-q", "--port", str(shoal.port)]
            subprocess.run([*ctl, "--runtime-dir", shoal.rundir, *command], check=True)
        out = RESULTS / f"paho-{stem}.json"
        out.unlink(missing_ok=True)
        started = time.monotonic()
        with open(RESULTS / f"paho-{stem}.log", "w") as fh:
            child = [sys.executable, __file__, "--drive", file, str(mqtt_port), str(out), *names]
            try:
                subprocess.run(
                    child, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, timeout=FILE_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                return file, False, f"not done in {FILE_TIMEOUT_S} s"
        took = time.monotonic() - started
    if shoal.crashed:
        return file, False, "the broker did not stop cleanly"
    if not out.exists():
        return file, False, "the tests wrote no outcome (see the log)"
    outcome = json.loads(out.read_text())
    summary = (
        f"{outcome['ran']} run, {len(outcome['failed'])} failed {outcome['failed']}, "
        f"{len(left_out) if not only else 0} left out, {took:.0f} s"
    )
    ok = outcome["ran"] == len(names) and not outcome["failed"] and not outcome["skipped"]
    return file, ok, summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", choices=sorted(PLANS), action="append", help="default: both")
    p.add_argument("--test", action="append", default=[], help="only this test (with --file)")
    p.add_argument("--drive", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.drive:
        file, port, out, *names = args.drive
        drive(file, int(port), out, names)
        return 0
    files = args.file or sorted(PLANS)
    with ThreadPoolExecutor(len(files)) as pool:
        results = list(pool.map(lambda f: run_file(f, args.test), files))
    for file, ok, summary in results:
        log(f"{file}: {'passed' if ok else 'FAILED'}: {summary}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
