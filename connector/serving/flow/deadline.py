"""One timer at the earliest deadline of a queue's waits (the flow gate's and the waiting room's expiry)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional


def arm(timer: Optional[asyncio.TimerHandle], due: Optional[float], expire: Callable[[], None]
        ) -> Optional[asyncio.TimerHandle]:
    """The timer to keep: ``timer`` when nothing is due or it fires no later than ``due``; else a new one
    at ``due`` (the loop's clock) calling ``expire``, ``timer`` cancelled."""
    if due is None or (timer is not None and timer.when() <= due):
        return timer
    if timer is not None:
        timer.cancel()
    return asyncio.get_running_loop().call_at(due, expire)
