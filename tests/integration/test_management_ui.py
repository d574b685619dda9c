"""The management web UI's files and the two API calls it makes before
anyone logs in (issue 27, first part): RabbitMQ 3.10.8's UI, vendored in
broker/management/www, served at the management port's root. The pages
themselves, driven in a browser, are the next part of issue 27.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.broker_process import Broker
from tests.integration.test_management import managed  # noqa: F401  (fixture)

WWW = Path(__file__).resolve().parents[2] / "broker" / "management" / "www"
# RabbitMQ 3.10.8's answers (management plugin alone, 12 s after start, guest),
# captured from a private node for the comparisons of issue 27.
DATA = Path(__file__).resolve().parent / "data"


def get(broker: Broker, path: str, auth: bool = False) -> tuple[int, str, bytes]:
    port = broker.management_port  # type: ignore[attr-defined]
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/", "text/html"),
        ("/index.html", "text/html"),
        ("/js/main.js", "javascript"),
        ("/js/tmpl/overview.ejs", ""),
        ("/css/main.css", "text/css"),
        ("/img/shoal-logo.svg", "image/svg"),
        ("/img/shoal-icon.svg", "image/svg"),
        ("/api/index.html", "text/html"),
    ],
)
def test_the_pages_files_are_served_without_login(
    managed: Broker,  # noqa: F811
    path: str,
    kind: str,
) -> None:
    status, content_type, body = get(managed, path)
    assert status == 200, (path, status)
    assert kind in content_type
    local = WWW / ("index.html" if path in ("/", "/index.html") else path.lstrip("/"))
    assert body == local.read_bytes()  # unchanged


def test_the_ui_is_shoals_own(managed: Broker) -> None:  # noqa: F811
    """Shoal's name and mark, not RabbitMQ's (a trademark of its owner):
    the title, the logo in the header and on the login page, the icon; no
    Erlang labels over values that are Python's (www/SHOAL.md)."""
    _status, _type, page = get(managed, "/")
    assert b"<title>Shoal Management</title>" in page and b"RabbitMQ" not in page
    assert b'href="img/shoal-icon.svg"' in page
    status, content_type, icon = get(managed, "/favicon.ico")
    assert status == 200 and "image/svg" in content_type and b"Shoal" in icon
    for template in ("layout.ejs", "login.ejs", "login_uaa.ejs"):
        status, _type, text = get(managed, f"/js/tmpl/{template}")
        assert status == 200 and b'src="img/shoal-logo.svg"' in text, template
        assert b"rabbitmqlogo" not in text, template
    assert get(managed, "/img/rabbitmqlogo.svg")[0] == 404, "RabbitMQ's logo is still shipped"
    for path in ("/js/tmpl/overview.ejs", "/js/tmpl/node.ejs", "/js/global.js"):
        assert b"Erlang processes" not in get(managed, path)[2], path
    assert (
        b"'\">Python ' + fmt_escape_html(overview.python_version)"
        in get(managed, "/js/global.js")[2]
    )


def test_auth_answers_before_login_as_rabbitmq_3_10_does(managed: Broker) -> None:  # noqa: F811
    status, content_type, body = get(managed, "/api/auth")
    assert status == 200 and "json" in content_type
    # RabbitMQ 3.10.8's answer, measured on a private node (the page then
    # shows its login form).
    measured = json.loads((DATA / "rabbitmq_3_10_management_api.json").read_text())
    assert (
        json.loads(body)
        == measured["/api/auth"]
        == {
            "enable_uaa": False,
            "uaa_client_id": "",
            "uaa_location": "",
        }
    )


def test_the_rest_of_the_api_still_needs_a_login(managed: Broker) -> None:  # noqa: F811
    for path in ("/api/extensions", "/api/overview", "/api/whoami"):
        assert get(managed, path)[0] == 401, path
    status, _type, body = get(managed, "/api/extensions", auth=True)
    measured = json.loads((DATA / "rabbitmq_3_10_management_api.json").read_text())
    # RabbitMQ's own dispatcher, as measured, then Shoal's page (shoal_page.py).
    assert status == 200
    assert json.loads(body) == [*measured["/api/extensions"], {"javascript": "shoal.js"}]


def test_nothing_outside_the_ui_folder_is_served(managed: Broker) -> None:  # noqa: F811
    for path in ("/js/../../api.py", "/js/%2e%2e/%2e%2e/api.py", "/css/../ui.py"):
        status, _type, body = get(managed, path)
        assert status in (403, 404), (path, status)
        assert b"from __future__" not in body  # no source of the broker


def test_overview_and_nodes_carry_what_the_page_reads_first(managed: Broker) -> None:  # noqa: F811
    """www/js/global.js setup_global_vars reads these before any page shows
    (without exchange_types it threw, and the page stayed empty)."""
    status, _type, body = get(managed, "/api/overview", auth=True)
    overview = json.loads(body)
    assert status == 200
    measured = json.loads((DATA / "rabbitmq_3_10_management_api.json").read_text())
    for rabbit_type in measured["/api/overview"]["exchange_types"]:
        assert rabbit_type in overview["exchange_types"]  # the same, field by field
    names = [x["name"] for x in overview["exchange_types"]]
    assert {"direct", "fanout", "headers", "topic", "x-message-deduplication"} <= set(names)
    assert overview["rates_mode"] == "basic"
    assert overview["sample_retention_policies"]["global"] == [600, 3600, 28800, 86400]
    assert overview["disable_stats"] is False
    assert overview["churn_rates"]["connection_created_details"] == {"rate": 0.0}
    status, _type, body = get(managed, "/api/nodes", auth=True)
    (node,) = json.loads(body)
    assert node["mem_used"] > 0 and node["fd_used"] > 0 and node["fd_total"] >= node["fd_used"]
    assert node["disk_free"] > 0 and node["mem_alarm"] is False
