"""Flow control keeps its bound (issue 38): ``FlowGate.wait_for_decode`` (connector/serving/flow/gate.py)
holds admitted requests whose prefill leg is over until decode has a slot, in class order; decode never
holds more than maxInFlightPerDecode x ready decodes, whatever the pipeline let through ahead of it."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from pdfleet.connector.serving.flow.gate import FlowGate, Shed
from pdfleet.contract.flow_control import FlowControlConfig, Priority

pytestmark = pytest.mark.timeout(30)  # every wait here ends by itself; a bug must not hang the suite

PRIORITY = "x-gateway-inference-objective"
CLASSES = (Priority("hi", 8), Priority("lo", 1))


def gate(decodes: int = 1, registry: CollectorRegistry | None = None, **kw) -> FlowGate:
    g = FlowGate(FlowControlConfig(**{"enabled": True, "max_in_flight_per_decode": 2, **kw}),
                 registry or CollectorRegistry())
    g.set_ready_decodes(decodes)
    return g


def with_pipeline(g: FlowGate) -> FlowGate:
    """As after some requests with long prefill legs: capacity more are let through ahead of decode (the
    pipeline's cap; the requests here, reporting no prefill time, lower the mean only a little)."""
    g.mean_pre_decode_s, g.mean_decode_s = 10.0, 1.0
    assert g.effective_capacity() == 2 * g.capacity
    return g


class Decode:
    """What decode would see: the requests in their decode leg, and the most at once."""

    def __init__(self) -> None:
        self.now: list[str] = []
        self.order: list[str] = []  # in the order they started their decode leg
        self.most = 0
        self.release = asyncio.Event()

    async def request(self, g: FlowGate, name: str, headers: dict | None = None, *, wait: bool = True) -> None:
        async with g.admit(headers or {}) as a:
            if wait:
                await g.wait_for_decode(a)
            a.decode_started()
            self.now.append(name)
            self.order.append(name)
            self.most = max(self.most, len(self.now))
            await self.release.wait()
            self.now.remove(name)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("wait,most", [
    (True, 4),  # 2 decodes x 2: the pipeline's 4 more wait for a slot
    (False, 8),  # negative control (the gate before issue 38): the pipeline lands on decode too
])
async def test_decode_never_holds_more_than_its_capacity(wait, most) -> None:
    g = with_pipeline(gate(decodes=2))
    d = Decode()
    tasks = [asyncio.create_task(d.request(g, f"r{i}", wait=wait)) for i in range(12)]
    await settle()
    assert (g.in_flight, g.queue.size) == (8, 4), "admission lets capacity + pipeline through, as before"
    assert (len(d.now), g.in_decode, g.decode_queue.size) == (most, most, 8 - most)
    d.release.set()
    await asyncio.gather(*tasks)
    assert d.most == most
    assert (g.in_flight, g.in_decode, g.queue.size, g.decode_queue.size) == (0, 0, 0, 0)


async def test_a_freed_slot_goes_to_the_top_class_first() -> None:
    g = with_pipeline(gate(decodes=2, priorities=CLASSES, max_in_flight_per_decode=1))  # decode 2, admitted 4
    d = Decode()
    tasks = []
    for name, prio in (("lo0", "lo"), ("lo1", "lo"), ("lo2", "lo"), ("hi1", "hi")):
        tasks.append(asyncio.create_task(d.request(g, name, {PRIORITY: prio})))
        await settle()
    assert d.now == ["lo0", "lo1"] and g.decode_queue.size == 2  # lo2 asked for decode before hi1
    d.release.set()
    await asyncio.gather(*tasks)
    assert d.order == ["lo0", "lo1", "hi1", "lo2"]


async def test_a_retried_decode_leg_keeps_its_slot_and_is_counted_once() -> None:
    g = gate(max_in_flight_per_decode=1)
    async with g.admit({}) as a:
        await g.wait_for_decode(a)
        a.decode_started()
        await g.wait_for_decode(a)  # the retry: at once, the same hold
        a.decode_started()
        assert g.in_decode == 1
    assert g.in_decode == 0


async def test_a_client_that_leaves_while_waiting_for_decode_takes_nothing() -> None:
    registry = CollectorRegistry()
    g = gate(registry=registry, max_in_flight_per_decode=1)
    with_pipeline(g)
    d = Decode()
    first = asyncio.create_task(d.request(g, "a"))
    second = asyncio.create_task(d.request(g, "b"))
    await settle()
    assert (g.in_decode, g.decode_queue.size) == (1, 1)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert (g.in_flight, g.in_decode, g.decode_queue.size) == (1, 1, 0)
    assert registry.get_sample_value("pdfleet_router_flow_abandoned_total", {"priority": "default"}) == 1
    assert registry.get_sample_value("pdfleet_router_flow_decode_waiting", {"priority": "default"}) == 0
    d.release.set()
    await first
    assert (g.in_flight, g.in_decode) == (0, 0)


async def test_a_client_that_leaves_in_the_instant_it_got_a_slot_gives_it_back() -> None:
    g = with_pipeline(gate(max_in_flight_per_decode=1))
    release, granted = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with g.admit({}) as a:
            await g.wait_for_decode(a)
            a.decode_started()
            await release.wait()

    async def leaver() -> None:
        async with g.admit({}) as a:
            await g.wait_for_decode(a)
            granted.set()

    async def third() -> None:
        async with g.admit({}) as a:
            await g.wait_for_decode(a)
            a.decode_started()

    first, second = asyncio.create_task(holder()), asyncio.create_task(leaver())
    await settle()
    assert (g.in_decode, g.decode_queue.size) == (1, 1)
    g.set_ready_decodes(2)  # a second slot: the leaver's wait resolves ...
    assert g.in_decode == 2
    second.cancel()  # ... and its client leaves before it ran again
    with pytest.raises(asyncio.CancelledError):
        await second
    assert not granted.is_set() and g.in_decode == 1, "the slot went back at once"
    await asyncio.wait_for(third(), 1)  # and the next request has it
    release.set()
    await first
    assert (g.in_flight, g.in_decode) == (0, 0)


async def test_waiting_for_decode_past_max_queue_seconds_is_shed() -> None:
    registry = CollectorRegistry()
    g = gate(registry=registry, max_in_flight_per_decode=1, max_queue_s=0.05)
    with_pipeline(g)
    d = Decode()
    first = asyncio.create_task(d.request(g, "a"))
    await settle()
    with pytest.raises(Shed) as shed:
        await d.request(g, "b")
    assert shed.value.reason == "queue_timeout" and shed.value.status == 429
    assert "decode slot" in shed.value.message and shed.value.retry_after_s >= 1
    assert registry.get_sample_value("pdfleet_router_flow_shed_total",
                                     {"priority": "default", "reason": "queue_timeout"}) == 1
    assert (g.in_flight, g.in_decode, g.decode_queue.size) == (1, 1, 0)
    d.release.set()
    await first


async def test_disabled_or_without_decodes_it_returns_at_once_and_takes_no_slot() -> None:
    off = FlowGate(FlowControlConfig(), CollectorRegistry())
    async with off.admit({}) as a:
        await off.wait_for_decode(a)
    assert off.in_decode == 0
    g = gate(decodes=0)  # no serving revision: the gate is open
    async with g.admit({}) as a:
        await g.wait_for_decode(a)
        assert (g.in_flight, g.in_decode) == (0, 0)


async def test_the_pipeline_is_sized_from_the_time_before_the_wait_not_with_it() -> None:
    """Counting the decode wait as pre-decode time would grow the pipeline with its own queue."""
    g = with_pipeline(gate(max_in_flight_per_decode=1))
    d = Decode()
    first = asyncio.create_task(d.request(g, "a"))
    await settle()
    async with g.admit({}) as b:
        b.admitted_at -= 0.5  # half a second in its prefill leg
        waiting = asyncio.create_task(g.wait_for_decode(b))
        await settle()
        assert b.ready_at is not None and not waiting.done()
        pre = g.mean_pre_decode_s
        d.release.set()
        await waiting
        b.decode_at = None
        b.decode_started()
        assert g.mean_pre_decode_s == pre, "the wait's end is not a second pre-decode time"
        assert b.decode_at >= b.ready_at
    await first
