"""Whether a vLLM engine (or the router) answers ``GET /health`` with 200, and waiting until it does.

One helper for `pdfleet local`, the benches and the tests that start engines: every wait has a
deadline and gives up early when the process it waits for has died.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Callable

HEALTH_PATH = "/health"
# Engines are dialled directly: a proxy from the environment must never sit between.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NotHealthy(RuntimeError):
    """An engine did not become healthy: it exited, or the deadline passed."""


def healthy(base_url: str, timeout: float = 2.0) -> bool:
    """One probe: True when ``base_url``/health answers 200 within ``timeout`` seconds."""
    try:
        with _OPENER.open(base_url.rstrip("/") + HEALTH_PATH, timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def wait_healthy(base_url: str, *, alive: Callable[[], bool] = lambda: True, timeout: float = 600.0,
                 interval: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> float:
    """Probe until healthy; the seconds it took. ``NotHealthy`` when ``alive()`` turns false or
    after ``timeout`` seconds."""
    started = clock()
    while True:
        if not alive():
            raise NotHealthy(f"{base_url}: the process exited while starting")
        if healthy(base_url):
            return clock() - started
        if clock() - started >= timeout:
            raise NotHealthy(f"{base_url}: not healthy after {timeout:.0f}s")
        sleep(interval)
