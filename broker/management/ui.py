"""The management web UI (issue 27): RabbitMQ 3.10.8's own, vendored in
www/ from Debian's rabbitmq-server package (MPL 2.0 and the licences of its
parts in www/licenses), served at the management port's root as RabbitMQ
serves it, in front of Shoal's API (api.py). It carries Shoal's name and
mark, not RabbitMQ's: www/SHOAL.md lists every change to the vendored files
and why.

Why RabbitMQ's and not our own: operators know its pages, and its pages
exercise the API the way the tools they already use do; what it needs of
the API is what RabbitMQ answers, compared on a private node.

The static files and GET /api/auth need no login (the page asks /api/auth
before it shows the login form); everything else under /api/ does.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from shoal.broker.management import shoal_page
from shoal.broker.management.http import BACKEND

WWW = Path(__file__).resolve().parent / "www"
# Paths answered without credentials: the page itself and what it loads first.
PUBLIC_PREFIXES = ("/js/", "/css/", "/img/", "/cli/", "/licenses/")
PUBLIC_PATHS = frozenset({"/", "/index.html", "/favicon.ico", "/api/auth", "/api/index.html"})


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WWW / "index.html")


async def favicon(request: web.Request) -> web.FileResponse:
    """Shoal's icon (www/SHOAL.md): the page names it; a browser that asks
    for /favicon.ico by habit gets the same SVG."""
    return web.FileResponse(
        WWW / "img" / "shoal-icon.svg", headers={"Content-Type": "image/svg+xml"}
    )


async def api_docs(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WWW / "api" / "index.html")


async def auth(request: web.Request) -> web.Response:
    """RabbitMQ 3.10.8's answer with no OAuth 2 (UAA) configured (measured:
    tests/integration/data/rabbitmq_3_10_management_api.json): the page then
    shows its own login form (www/index.html reads enable_uaa)."""
    return web.json_response({"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""})


async def extensions(request: web.Request) -> web.Response:
    """The UI plugins' scripts: RabbitMQ 3.10.8 with the management plugin
    alone lists its own dispatcher (measured), which the page loads again;
    Shoal adds its own page (shoal_page.py) the same way, and the shovel
    management plugin's pages (www/js/shovel.js: "Move messages" on a
    queue's page, the shovel pages under Admin) while shovels run."""
    scripts = [{"javascript": "dispatcher.js"}, {"javascript": "shoal.js"}]
    if request.app[BACKEND].config.shovels:
        scripts.append({"javascript": "shovel.js"})
    return web.json_response(scripts)


def routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/", index)
    r.add_get("/index.html", index)
    r.add_get("/favicon.ico", favicon)
    r.add_get("/api/auth", auth)
    r.add_get("/api/extensions", extensions)
    r.add_get("/api/index.html", api_docs)
    shoal_page.routes(r)  # before /js/: its script and template sit beside RabbitMQ's
    for prefix in PUBLIC_PREFIXES:
        r.add_static(prefix.rstrip("/"), WWW / prefix.strip("/"))
