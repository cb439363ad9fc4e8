"""A front end's /metrics as a test writes it: a tiny aiohttp server on 127.0.0.1 that answers each scrape with
``render()`` (the operator's kopf-loop tests point a router pod's IP and port at it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def metrics_page(port: int, render: Callable[[], str]) -> AsyncIterator[None]:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()
