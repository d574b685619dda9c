"""Records what RabbitMQ 3.10.8's own UI fetches on every page the browser
test visits, against a private node with the management plugin and the same
scenario (ui_driver.Scenario): tests/browser/data/rabbitmq_3_10_ui.json,
the reference the test compares Shoal's answers with, field by field.

    .venv/bin/python -m tests.browser.capture_rabbitmq [--shots DIR]

Needs Debian's rabbitmq-server and chromium, and playwright (pip)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from bench.compare import free_port, rabbit_env, start_rabbitmq_node
from tests.browser import ui_driver

OUT = Path(__file__).parent / "data" / "rabbitmq_3_10_ui.json"
STATS_INTERVAL_S = 12  # RabbitMQ collects node and queue stats every 5 s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shots", type=Path, help="screenshots of RabbitMQ's pages here")
    args = parser.parse_args()
    port, management_port = free_port(), free_port()
    base = Path(tempfile.mkdtemp(prefix="shoal-ui-rabbit-"))
    env = rabbit_env(port, base)
    (base / "enabled_plugins").write_text("[rabbitmq_management].\n")
    conf = base / "rabbitmq.conf"
    conf.write_text(f"management.tcp.port = {management_port}\nmanagement.tcp.ip = 127.0.0.1\n")
    env["RABBITMQ_CONFIG_FILE"] = str(conf)
    if os.geteuid() == 0:
        for path in (base, base / "enabled_plugins", conf):
            shutil.chown(path, "rabbitmq", "rabbitmq")
    ctl = ["rabbitmqctl", "-n", env["RABBITMQ_NODENAME"]]
    try:
        start_rabbitmq_node(env, ctl, port)
        scenario = ui_driver.Scenario(port, management_port)
        names = scenario.names(60)
        time.sleep(STATS_INTERVAL_S)
        if args.shots:
            args.shots.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as playwright:
            session = ui_driver.UiSession(
                playwright, f"http://127.0.0.1:{management_port}/", args.shots
            )
            visits = [session.login()]
            visits += [session.visit(route, name) for name, route in ui_driver.routes(names)]
            session.close()
        scenario.close()
        for visit in visits:
            for error in visit.errors:
                print(visit.route, error)
        OUT.write_text(json.dumps(ui_driver.normalised(visits, names), indent=1, sort_keys=True))
        print(f"wrote {OUT}")
    finally:
        subprocess.run([*ctl, "stop"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
