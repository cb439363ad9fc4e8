"""Polling until a condition holds, with a deadline (monotonic clocks): in a test's event loop, or blocking."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable

# What a check may raise while the state it reads is half-built: polled again, not a failure yet.
NOT_YET = (AssertionError, KeyError, TypeError, IndexError)


async def until(check: Callable[[], Any], what: str = "", *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``check`` (plain, or returning an awaitable) in the running loop, which keeps serving meanwhile,
    until it returns something truthy: that value. Past ``timeout``: AssertionError naming ``what`` and the
    last value or error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
            if last:
                return last
        except NOT_YET as e:
            last = e
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}: last={last!r}")
        await asyncio.sleep(interval)


async def http_ok(session: Any, url: str) -> bool:
    """Whether ``url`` answers 200 now (a server still starting refuses the connection: False)."""
    try:
        async with session.get(url) as r:
            return r.status == 200
    except OSError:
        return False


def wait_until(check: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``check`` (blocking) until it returns something truthy: that value; past ``timeout``, the
    last (falsy) value, for the caller to assert on."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
