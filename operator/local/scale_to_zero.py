"""`pdfleet local`'s pair at zero (issue 41): the operator's decisions (autoscale/scale_to_zero.py) over
this process's front ends (the router, and the Endpoint Picker with --gateway), applied to the engine
processes instead of to scalers. Idle for idleSeconds: the front ends stop offering the pair (their
waiting rooms hold what comes), the legs in flight drain, and every engine stops. The first held
request (the waiting room's activator, or the next look at the front ends' gauges) starts them all
again; once healthy, the front ends get the pair back and serve what they held, in order.

``Wake`` records where a wake's time goes (bench/scale_from_zero.py prints it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from prometheus_client import generate_latest

from pdfleet.operator.autoscale import scale_to_zero as stz

DRAIN_TIMEOUT_S = 60.0
WAKE_LINE = "woke the pair: "  # then the parts of the wake, name=seconds
RETIRED_LINE = "scaled to zero: "  # then why  # the longest a retirement waits for legs in flight before it stops the engines anyway


@dataclass
class Wake:
    """One wake: when the first request was held (monotonic), when the engines were started, healthy,
    and offered to the front ends again."""

    asked_at: float
    started_at: float = 0.0
    healthy_at: float = 0.0
    serving_at: float = 0.0

    def parts(self) -> dict[str, float]:
        return {"activation_s": self.started_at - self.asked_at, "engine_start_s": self.healthy_at - self.started_at,
                "offer_s": self.serving_at - self.healthy_at, "total_s": self.serving_at - self.asked_at}

    def line(self) -> str:
        """What `pdfleet local` prints once the pair serves again (bench/scale_from_zero.py reads it)."""
        return WAKE_LINE + " ".join(f"{k}={v:.3f}" for k, v in self.parts().items())


@dataclass
class PairAtZero:
    """The local edge: ``step`` once per supervision turn, ``asked`` set by the front ends' activators."""

    front_ends: Callable[[], Sequence[Any]]  # each has .metrics.registry, .picker, .set_endpoints(groups)
    groups: Callable[[], list[Any]]  # the pair's endpoints (static_groups of the router's config)
    stop_engines: Callable[[], Awaitable[None]]
    start_engines: Callable[[], Awaitable[bool]]  # True once every engine is healthy
    idle_seconds: float
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    asked_at: Optional[float] = None  # when a front end first held a request since the last wake
    asleep: bool = False
    wakes: list[Wake] = field(default_factory=list)
    _prev: Optional[dict[str, stz.FrontEndSample]] = None
    _state: stz.PairState = stz.PairState()

    def hook(self) -> None:
        """The front ends' waiting rooms ask at once (within a turn otherwise, from their gauges)."""
        for fe in self.front_ends():
            fe.picker.waiting.activator = self._ask

    def _ask(self) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()
        self.asked.set()

    def observe(self) -> stz.Observation:
        cur = {str(i): stz.parse_front_end(generate_latest(fe.metrics.registry).decode())
               for i, fe in enumerate(self.front_ends())}
        obs, self._prev = stz.observe(self._prev, cur), cur
        return obs

    async def step(self, now: Optional[float] = None) -> str:
        """Read the front ends, decide as the operator would, act; returns the action."""
        obs = self.observe()
        replicas = {role: 0 if self.asleep else 1 for role in stz.ROLES}
        decision = stz.decide(time.monotonic() if now is None else now, obs, replicas, self._state,
                              self.idle_seconds)
        self._state = decision.state
        if decision.action == stz.ACTIVATE or (self.asleep and self.asked.is_set()):
            await self.wake()
            return stz.ACTIVATE
        if decision.action == stz.RETIRE:
            await self.retire()
        return decision.action

    async def retire(self) -> None:
        """Stop offering the pair (new requests are held), drain the legs in flight, stop the engines."""
        for fe in self.front_ends():
            fe.set_endpoints([])
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while any(fe.picker.outstanding.counts for fe in self.front_ends()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.stop_engines()
        self.asleep = True
        self._prev = None  # a fresh look after the pair is back (no idleness inferred across the gap)

    async def wake(self) -> bool:
        wake = Wake(self.asked_at if self.asked_at is not None else time.monotonic())
        self.asked.clear()
        self.asked_at = None
        wake.started_at = time.monotonic()
        ok = await self.start_engines()
        wake.healthy_at = time.monotonic()
        if not ok:
            return False
        groups = self.groups()
        for fe in self.front_ends():
            fe.set_endpoints(groups)
        wake.serving_at = time.monotonic()
        self.asleep = False
        self._state = stz.PairState(time.monotonic())  # idleness counts from the wake
        self.wakes.append(wake)
        return True
