"""pdfleet local's pair at zero (operator/local/scale_to_zero.py): the operator's decisions over real
front ends (a router's state, its waiting room on), applied to fake engine starts and stops."""

from __future__ import annotations

import asyncio

from pdfleet.connector.serving.router_state import RouterState, static_groups
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.autoscale import scale_to_zero as stz
from pdfleet.operator.local.scale_to_zero import PairAtZero

CONFIG = RouterConfig(prefill=("http://127.0.0.1:1",), decode=("http://127.0.0.1:2",), scale_to_zero_max_waiting=10)


class Engines:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def stop(self) -> None:
        self.calls.append("stop")

    async def start(self) -> bool:
        self.calls.append("start")
        return True


def pair(front: RouterState, engines: Engines, idle_s: float = 10.0) -> PairAtZero:
    p = PairAtZero(front_ends=lambda: [front], groups=lambda: static_groups(CONFIG), stop_engines=engines.stop,
                   start_engines=engines.start, idle_seconds=idle_s)
    p.hook()
    return p


def test_idle_retires_the_pair_and_the_first_held_request_wakes_it() -> None:
    async def run() -> None:
        front, engines = RouterState(CONFIG), Engines()
        front.set_endpoints(static_groups(CONFIG))
        p = pair(front, engines)
        assert await p.step(now=100.0) == stz.HOLD  # first look: activity (a front end first seen)
        assert await p.step(now=105.0) == stz.HOLD and engines.calls == []  # 5 s idle < 10 s
        assert await p.step(now=111.0) == stz.RETIRE
        assert engines.calls == ["stop"] and p.asleep
        assert front.picker.selection.revision is None  # no pair offered: the waiting room holds
        assert await p.step(now=200.0) == stz.HOLD and engines.calls == ["stop"]  # asleep, nothing held
        front.picker.waiting.activator()  # what the waiting room calls on the first held request
        assert await p.step(now=201.0) == stz.ACTIVATE
        assert engines.calls == ["stop", "start"] and not p.asleep
        assert front.picker.selection.revision is not None  # the pair is offered again
        (wake,) = p.wakes
        assert wake.parts()["total_s"] >= 0

    asyncio.run(run())


def test_a_request_in_flight_keeps_the_pair_up() -> None:
    """Negative control of the retirement: work at the front end is activity, however long ago the last
    request was answered."""
    async def run() -> None:
        front, engines = RouterState(CONFIG), Engines()
        front.set_endpoints(static_groups(CONFIG))
        p = pair(front, engines, idle_s=1.0)
        await p.step(now=0.0)
        front.picker.acquire("decode", "http://127.0.0.1:2")  # a decode leg runs (its timing counts it)
        from pdfleet.connector.serving import timing
        timing.begin(front.metrics)
        timing.serving("static")
        timing.leg_started("decode")
        for t in (5.0, 50.0, 500.0):
            assert await p.step(now=t) == stz.HOLD
        assert engines.calls == [] and not p.asleep

    asyncio.run(run())
