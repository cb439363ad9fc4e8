"""The flow-control gate's own bookkeeping (connector/serving/flow/gate.py), without a server: a slot is
never leaked, whatever moment a client leaves at."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from pdfleet.contract.flow_control import FlowControlConfig
from pdfleet.connector.serving.flow.gate import FlowGate


def gate(**kw) -> tuple[FlowGate, CollectorRegistry]:
    registry = CollectorRegistry()
    g = FlowGate(FlowControlConfig(**{"enabled": True, "max_in_flight_per_decode": 1, **kw}), registry)
    g.set_ready_decodes(1)
    return g, registry


def held(event: asyncio.Event):
    async def handler() -> web.StreamResponse:
        await event.wait()
        return web.Response(text="ok")
    return handler


async def test_a_client_cancelled_in_the_instant_it_was_admitted_gives_its_slot_back() -> None:
    g, _ = gate()
    first, second = asyncio.Event(), asyncio.Event()
    t1 = asyncio.create_task(g.guard({}, held(first)))
    await asyncio.sleep(0)
    t2 = asyncio.create_task(g.guard({}, held(second)))
    await asyncio.sleep(0)
    assert (g.in_flight, g.queue.size) == (1, 1)
    g.set_ready_decodes(2)  # dispatches t2: its future resolves ...
    assert g.in_flight == 2
    t2.cancel()  # ... and its client leaves before t2 ran again
    with pytest.raises(asyncio.CancelledError):
        await t2
    assert g.in_flight == 1, "the admitted-then-cancelled request released its slot"
    first.set()
    assert (await t1).status == 200
    assert (g.in_flight, g.queue.size) == (0, 0)


async def test_a_client_cancelled_while_queued_leaves_no_trace() -> None:
    g, registry = gate()
    first = asyncio.Event()
    t1 = asyncio.create_task(g.guard({}, held(first)))
    await asyncio.sleep(0)
    t2 = asyncio.create_task(g.guard({"x-gateway-inference-fairness-id": "b"}, held(asyncio.Event())))
    await asyncio.sleep(0)
    t2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t2
    assert g.queue.size == 0
    assert registry.get_sample_value("pdfleet_router_flow_abandoned_total", {"priority": "default"}) == 1
    first.set()
    await t1
    assert g.in_flight == 0


async def test_a_handler_that_fails_still_frees_its_slot() -> None:
    g, _ = gate()

    async def boom() -> web.StreamResponse:
        raise RuntimeError("leg failed")
    with pytest.raises(RuntimeError):
        await g.guard({}, boom)
    assert g.in_flight == 0


async def test_disabled_runs_the_handler_at_once_and_registers_nothing() -> None:
    registry = CollectorRegistry()
    g = FlowGate(FlowControlConfig(), registry)
    g.set_ready_decodes(0)
    event = asyncio.Event()
    event.set()
    assert (await g.guard({}, held(event))).status == 200
    assert not [m for m in registry.collect() if m.name.startswith("pdfleet_router_flow")]


@pytest.mark.parametrize("headers,tenant,klass", [
    ({}, "", 1),  # no headers: anonymous tenant, lowest class
    ({"x-gateway-inference-objective": "interactive", "x-gateway-inference-fairness-id": "t1"}, "t1", 0),
    ({"x-gateway-inference-objective": "unknown"}, "", 1),  # unknown priority: lowest class
    ({"x-gateway-inference-fairness-id": "t" * 129}, "sha256:", 1),  # long ids hashed
])
def test_classify(headers, tenant, klass) -> None:
    from pdfleet.contract.flow_control import Priority
    g = FlowGate(FlowControlConfig(enabled=True, priorities=(Priority("batch", 1), Priority("interactive", 5))),
                 CollectorRegistry())
    got_tenant, got_klass = g.classify(headers)
    assert got_tenant.startswith(tenant) and (tenant != "" or got_tenant == "") and got_klass == klass
    if tenant == "sha256:":
        assert len(got_tenant) == len("sha256:") + 64
