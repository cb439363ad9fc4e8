"""The gate's front-end-agnostic admission (connector/serving/flow/gate.py: ``admit``, ``Shed``), its
cost argument, and capacity counted from what decode holds (the pipeline ahead of decode)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from pdfleet.connector.serving.flow import gate as gate_module
from pdfleet.connector.serving.flow.gate import FlowGate, Shed
from pdfleet.contract.flow_control import FlowControlConfig, Priority

TENANT, PRIORITY = "x-gateway-inference-fairness-id", "x-gateway-inference-objective"


def gate(decodes: int = 1, **kw) -> FlowGate:
    g = FlowGate(FlowControlConfig(**{"enabled": True, "max_in_flight_per_decode": 1, **kw}), CollectorRegistry())
    g.set_ready_decodes(decodes)
    return g


async def hold(g: FlowGate, headers: dict, release: asyncio.Event, log: list, name: str, cost=None) -> None:
    async with g.admit(headers, cost=cost):
        log.append(name)
        await release.wait()


async def test_admit_holds_a_slot_for_the_block_and_sheds_with_the_reason_and_retry_after() -> None:
    g = gate(max_queued=1)
    release, log = asyncio.Event(), []
    first = asyncio.create_task(hold(g, {}, release, log, "a"))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold(g, {TENANT: "b"}, release, log, "b"))
    await asyncio.sleep(0)
    assert (g.in_flight, g.queue.size, log) == (1, 1, ["a"])
    with pytest.raises(Shed) as shed:
        async with g.admit({TENANT: "b"}):
            pass
    assert (shed.value.status, shed.value.reason) == (429, "queue_full")
    assert shed.value.retry_after_s >= 1 and "holds 1 requests" in shed.value.message
    release.set()
    await asyncio.gather(first, second)
    assert (g.in_flight, g.queue.size, log) == (0, 0, ["a", "b"])


async def test_admit_gives_the_slot_back_when_the_block_raises() -> None:
    g = gate()
    with pytest.raises(RuntimeError):
        async with g.admit({}):
            raise RuntimeError("handler failed")
    assert g.in_flight == 0


async def test_disabled_or_without_capacity_admit_lets_everything_through_uncounted() -> None:
    for g in (FlowGate(FlowControlConfig(), CollectorRegistry()), gate(decodes=0)):
        async with g.admit({}) as admission:
            gate_module.decode_started()  # a no-op hold
            assert not admission.counted
        assert g.in_flight == 0 and g.in_decode == 0


async def test_guard_answers_429_with_retry_after_from_the_same_shed() -> None:
    g = gate(max_queued=1, max_queue_s=0.05)
    release = asyncio.Event()
    t = asyncio.create_task(hold(g, {}, release, [], "a"))
    await asyncio.sleep(0)

    async def handler():
        raise AssertionError("never run")

    response = await g.guard({}, handler)  # queued, then expired after 0.05 s
    assert response.status == 429 and int(response.headers["Retry-After"]) >= 1
    release.set()
    await t


async def test_costs_decide_who_goes_next() -> None:
    """Two tenants at the same request rate, b asking 4x the tokens: a gets 4 of every 5 dispatches."""
    g = gate(max_queued=100)
    release = asyncio.Event()
    blocker = asyncio.create_task(hold(g, {}, release, [], "blocker"))
    await asyncio.sleep(0)
    log: list[str] = []
    tasks = []
    for _ in range(10):
        for tenant, cost in (("a", 100.0), ("b", 400.0)):
            ev = asyncio.Event()
            ev.set()
            tasks.append(asyncio.create_task(hold(g, {TENANT: tenant}, ev, log, tenant, cost=cost)))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(blocker, *tasks)
    assert log[:10].count("a") == 8, log  # by cost: 8 a (800 tokens) and 2 b (800 tokens)


async def test_without_a_cost_a_request_costs_the_recent_mean_and_requests_fairness_ignores_costs() -> None:
    g = gate()
    assert g._cost(None) == 1.0
    assert g._cost(300.0) == 300.0 and g._cost(None) == 300.0
    assert g._cost(float("nan")) == 300.0 and g._cost(-1) == 300.0
    assert gate(fairness="requests")._cost(300.0) == 1.0


async def test_capacity_counts_decode_and_lets_a_pipeline_through_ahead_of_it() -> None:
    """A request that reports its decode leg teaches the gate how long requests spend before decode;
    the gate then lets capacity x pre-decode / decode requests through beyond decode's capacity."""
    g = gate(decodes=4)  # capacity 4
    assert g.effective_capacity() == 4  # nothing reported: every admitted request counts as a decode
    loop = asyncio.get_running_loop()
    async with g.admit({}) as a:
        a.admitted_at = loop.time() - 0.1  # 100 ms in its prefill leg
        gate_module.decode_started()
        gate_module.decode_started()  # a retried decode leg: the same hold
        assert (g.in_flight, g.in_decode) == (1, 1)
        a.decode_at = loop.time() - 0.8  # 800 ms of decode
    assert (g.in_flight, g.in_decode) == (0, 0)
    assert g.pipeline() == 1 and g.effective_capacity() == 5  # ceil(1.5 x 4 x 0.1 / 0.8)
    g.mean_pre_decode_s = 10.0
    assert g.pipeline() == 4  # never more than decode's capacity again


async def test_the_pipeline_margin_is_the_top_class_s_alone() -> None:
    """Lower classes get the pipeline without its margin: the surplus that may wait inside decode, first
    come first served, is never theirs, so the top class finds decode slots under load."""
    g = gate(decodes=16, priorities=(Priority("hi", 8), Priority("lo", 1)), max_queued=100)
    g.mean_pre_decode_s, g.mean_decode_s = 0.25, 1.0
    assert (g.pipeline(), g.pipeline(1.0)) == (6, 4)  # ceil(1.5 x 16 x 0.25), 16 x 0.25
    assert (g.effective_capacity(), g.lower_capacity()) == (22, 20)
    release, log = asyncio.Event(), []
    tasks = [asyncio.create_task(hold(g, {PRIORITY: "lo"}, release, log, f"lo{i}")) for i in range(30)]
    await asyncio.sleep(0)
    assert len(log) == 20 - 5  # the lower capacity less the headroom (a quarter of 22)
    tasks += [asyncio.create_task(hold(g, {PRIORITY: "hi"}, release, log, f"hi{i}")) for i in range(10)]
    await asyncio.sleep(0)
    assert sum(n.startswith("hi") for n in log) == 22 - 15  # the top class up to the whole capacity
    release.set()
    await asyncio.gather(*tasks)


async def test_priorities_still_apply_through_admit() -> None:
    g = gate(priorities=(Priority("hi", 8), Priority("lo", 1)), max_queued=10)
    release, log = asyncio.Event(), []
    first = asyncio.create_task(hold(g, {PRIORITY: "lo"}, release, log, "lo0"))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(hold(g, {PRIORITY: p}, release, log, n))
            for n, p in (("lo1", "lo"), ("hi1", "hi"))]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *rest)
    assert log == ["lo0", "hi1", "lo1"]
