"""The waiting room's edge (connector/serving/waiting.py), without a server: held until a pair is ready,
released in arrival order (class order under flow control), bounded, expired, and a client that leaves
takes its place and bytes with it (issue 41)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from pdfleet.connector.serving import waiting_room
from pdfleet.connector.serving.flow.gate import FlowGate
from pdfleet.connector.serving.waiting import Dropped, WaitingRoom
from pdfleet.contract import scale_to_zero as stz
from pdfleet.contract.flow_control import PRIORITY_HEADER, TENANT_HEADER, FlowControlConfig, Priority
from pdfleet.contract.router_config import RouterConfig


def room(flow: FlowControlConfig | None = None, **kw) -> tuple[WaitingRoom, CollectorRegistry]:
    config = RouterConfig(prefill=("http://p:1",), decode=("http://d:1",), flow_control=flow or FlowControlConfig(),
                          **{"scale_to_zero_max_waiting": 20, **kw})
    registry = CollectorRegistry()
    return WaitingRoom(config, registry, FlowGate(config.flow_control, registry)), registry


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return registry.get_sample_value(name, labels or {})


async def held(r: WaitingRoom, order: list[str], name: str, headers: dict[str, str] | None = None,
               size: int = 10) -> None:
    await r.hold(headers or {}, size)
    order.append(name)


async def test_held_until_a_pair_is_ready_then_released_in_arrival_order() -> None:
    r, registry = room()
    order: list[str] = []
    tasks = [asyncio.create_task(held(r, order, f"r{i}")) for i in range(5)]
    await asyncio.sleep(0)
    assert (r.queue.size, r.held_bytes, order) == (5, 50, [])
    assert sample(registry, stz.ROUTER_WAITING_REQUESTS) == 5
    r.set_endpoints(pair_ready=False, endpoints_up=True)  # decode up, prefill still waking: still held
    await asyncio.sleep(0)
    assert r.queue.size == 5 and order == []
    r.set_endpoints(pair_ready=True, endpoints_up=True)
    await asyncio.gather(*tasks)
    assert order == [f"r{i}" for i in range(5)]
    assert (r.queue.size, r.held_bytes, sample(registry, stz.ROUTER_WAITING_REQUESTS)) == (0, 0, 0)
    assert sample(registry, stz.ROUTER_ACTIVATIONS + "_total") == 1  # one cold episode for the burst
    assert sample(registry, stz.ROUTER_ACTIVATION_WAIT + "_count") == 1


async def test_under_flow_control_the_top_class_goes_first() -> None:
    flow = FlowControlConfig(enabled=True, priorities=(Priority("interactive", 100), Priority("batch", 1)))
    r, _ = room(flow)
    order: list[str] = []
    tasks = [asyncio.create_task(held(r, order, f"batch{i}", {PRIORITY_HEADER: "batch"})) for i in range(3)]
    tasks.append(asyncio.create_task(held(r, order, "interactive", {PRIORITY_HEADER: "interactive"})))
    await asyncio.sleep(0)
    r.set_endpoints(pair_ready=True, endpoints_up=True)
    await asyncio.gather(*tasks)
    assert order[0] == "interactive" and order[1:] == ["batch0", "batch1", "batch2"]


async def test_under_flow_control_tenants_take_turns() -> None:
    r, _ = room(FlowControlConfig(enabled=True))
    order: list[str] = []
    arrivals = [("a", "a0"), ("a", "a1"), ("a", "a2"), ("b", "b0")]
    tasks = [asyncio.create_task(held(r, order, name, {TENANT_HEADER: tenant})) for tenant, name in arrivals]
    await asyncio.sleep(0)
    r.set_endpoints(pair_ready=True, endpoints_up=True)
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "a1", "a2"]  # negative control: flow control off, arrival order (the first test)


async def test_a_ready_pair_lets_requests_through_at_once_and_the_room_off_holds_nothing() -> None:
    r, registry = room()
    r.set_endpoints(pair_ready=True, endpoints_up=True)
    await r.hold({}, 10)  # returns at once
    off, off_registry = room(scale_to_zero_max_waiting=0)
    await off.hold({}, 10)  # negative control: no pair, but the room is off: on to the old 503
    assert off.queue.size == 0 and sample(off_registry, stz.ROUTER_ACTIVATIONS + "_total") == 0


async def test_the_room_is_bounded_by_count_and_by_bytes() -> None:
    r, registry = room(scale_to_zero_max_waiting=2, scale_to_zero_max_waiting_bytes=100)
    order: list[str] = []
    tasks = [asyncio.create_task(held(r, order, f"r{i}")) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Dropped) as full:
        await r.hold({}, 10)
    assert full.value.drop == waiting_room.room_full()
    tasks[0].cancel()  # a client leaves: its place is free again ...
    await asyncio.sleep(0)
    assert (r.queue.size, r.held_bytes) == (1, 10)
    with pytest.raises(Dropped):
        await r.hold({}, 91)  # ... but not for a body past the byte bound (10 + 91 > 100)
    tasks.append(asyncio.create_task(held(r, order, "late", size=90)))
    await asyncio.sleep(0)
    assert (r.queue.size, r.held_bytes) == (2, 100)
    r.set_endpoints(pair_ready=True, endpoints_up=True)
    await asyncio.gather(*tasks[1:])
    assert order == ["r1", "late"]
    assert sample(registry, stz.ROUTER_WAITING_DROPPED + "_total", {stz.DROPPED_REASON: stz.REJECTED_WAITING_ROOM_FULL}) == 2


@pytest.mark.parametrize("up, status, reason", [(False, 503, stz.REJECTED_NO_ENDPOINTS),
                                                (True, 429, stz.REJECTED_TTL_EXPIRED)])
async def test_an_expired_wait_is_answered_by_whether_endpoints_came_up(up, status, reason) -> None:
    r, registry = room(scale_to_zero_activation_timeout_s=0.05)
    r.set_endpoints(pair_ready=False, endpoints_up=up)
    with pytest.raises(Dropped) as dropped:
        await asyncio.wait_for(r.hold({}, 10), 5)
    assert (dropped.value.drop.status, dropped.value.drop.reason) == (status, reason)
    assert (r.queue.size, r.held_bytes) == (0, 0)
    assert sample(registry, stz.ROUTER_WAITING_DROPPED + "_total", {stz.DROPPED_REASON: reason}) == 1
    assert sample(registry, stz.ROUTER_ACTIVATION_WAIT + "_count") == 0  # no pair came


async def test_the_activator_is_called_once_per_cold_episode_and_its_failure_fails_nothing() -> None:
    r, registry = room()
    calls: list[int] = []

    def activator() -> None:
        calls.append(1)
        raise RuntimeError("the activator's own trouble")

    r.activator = activator
    first = [asyncio.create_task(r.hold({}, 1)) for _ in range(3)]
    await asyncio.sleep(0)
    assert len(calls) == 1
    for t in first:
        t.cancel()
    await asyncio.gather(*first, return_exceptions=True)
    assert r.queue.size == 0  # every client left while cold: the episode ends ...
    again = asyncio.create_task(r.hold({}, 1))
    await asyncio.sleep(0)
    assert len(calls) == 2  # ... and the next held request asks again
    r.set_endpoints(pair_ready=True, endpoints_up=True)
    await again
    assert sample(registry, stz.ROUTER_ACTIVATIONS + "_total") == 2
