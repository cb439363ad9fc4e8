from __future__ import annotations

import aiohttp
import pytest
from router_fakes import FakeEngine

from pdfleet.connector.router.app import start_router
from pdfleet.contract.router_config import RouterConfig

# Tight timeouts keep failure tests fast; eject_s=0 keeps endpoint choice a
# function of load alone, so a failing endpoint keeps being tried.
FAST = dict(connect_timeout_s=1.0, prefill_timeout_s=2.0, decode_first_byte_timeout_s=2.0,
            decode_idle_timeout_s=2.0, eject_s=0.0)


class Fleet:
    def __init__(self) -> None:
        self.engines: list[FakeEngine] = []
        self.runners = []
        self.session: aiohttp.ClientSession | None = None

    async def engine(self, name: str, role: str, **kw) -> FakeEngine:
        e = FakeEngine(name=name, role=role, **kw)
        await e.start()
        self.engines.append(e)
        return e

    async def router(self, prefill, decode, *, discovery=None, **overrides) -> str:
        settings = dict(FAST)
        settings.update(overrides)
        urls = lambda xs: tuple(x if isinstance(x, str) else x.url for x in xs)  # noqa: E731
        config = RouterConfig(prefill=urls(prefill), decode=urls(decode), **settings)
        runner, port = await start_router(config, "127.0.0.1", 0, discovery=discovery)
        self.runners.append(runner)
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        for r in self.runners:
            await r.cleanup()
        for e in self.engines:
            await e.stop()


@pytest.fixture
async def fleet():
    f = Fleet()
    f.session = aiohttp.ClientSession()
    try:
        yield f
    finally:
        await f.close()
