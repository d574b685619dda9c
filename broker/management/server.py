"""The management process (issue 16, item 6): the HTTP API of api.py on
--management-port (15672, RabbitMQ's; 0: none), an aiohttp server on
uvloop. It reads the segment (the definitions journal, alarms) and talks
to the scheduler and the IO workers as `shoal ctl` and clients do; it
holds no state of its own, so the supervisor may restart it at any time."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator

import uvloop
from aiohttp import web
from setproctitle import setproctitle

from shoal.broker import listeners as listening
from shoal.broker.config import Config
from shoal.broker.management import api, http, nodes_api, ui
from shoal.broker.management.backend import Backend
from shoal.broker.management.rates import Rates
from shoal.broker.management.shapes import ChannelRates, DataRates, ExchangeRates
from shoal.shm.processes import ProcessSlot
from shoal.shm.segment import Segment

log = logging.getLogger("shoal.management")


def make_app(config: Config, seg: Segment) -> web.Application:
    app = web.Application(middlewares=[api.authenticate], client_max_size=256 << 20)
    app[http.BACKEND] = Backend(config, seg)
    app[http.STARTED] = time.monotonic()
    app[http.RATES] = Rates(seg)
    app[http.DATA_RATES] = DataRates()
    app[http.CHANNEL_RATES] = ChannelRates()
    app[http.EXCHANGE_RATES] = ExchangeRates()
    app[nodes_api.NODE_RATES] = nodes_api.NodeRates()
    app.cleanup_ctx.append(_sampling)
    ui.routes(app)  # first: /api/auth and /api/extensions before the API's patterns
    api.routes(app)
    return app


async def _sampling(app: web.Application) -> AsyncIterator[None]:
    """Message rates' samples (rates.py), every --collect-statistics-interval."""

    interval = max(0.01, app[http.BACKEND].config.collect_statistics_interval / 1000)

    async def sample() -> None:
        while True:
            try:
                app[http.RATES].sample()
            except Exception:
                log.exception("message rates: sampling failed")
            await asyncio.sleep(interval)

    task = asyncio.get_running_loop().create_task(sample())
    yield
    task.cancel()


def run_management(config: Config, seg: Segment) -> int:
    setproctitle(f"shoal: management (port {config.port})")
    logging.getLogger("pika").setLevel(logging.WARNING)  # a line per request otherwise
    slot = ProcessSlot.management(seg)
    slot.started(os.getpid())
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    runner = web.AppRunner(make_app(config, seg), access_log=None)
    loop.run_until_complete(runner.setup())
    binds = (config.management_bind,) if config.management_bind else config.bind
    for sock in listening.listen(binds, config.management_port):
        loop.run_until_complete(web.SockSite(runner, sock).start())
    slot.set_ready(True)
    log.info("management API on %s port %d, /api/", listening.shown(binds), config.management_port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        loop.run_until_complete(stop.wait())
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()
    return 0
