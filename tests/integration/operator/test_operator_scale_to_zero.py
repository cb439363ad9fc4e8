"""Scale to zero as a pair (issue 41), the operator's side: the real kopf loop over FakeKube reads the router
pod's /metrics (a tiny aiohttp server plays the front end: its waiting gauge, activations and request counters,
streams in flight) and writes both scalers' /scale by server-side apply as its own field manager.

Negative controls beside each case: nothing held at 0 -> nothing written; a stream in flight past idleSeconds
-> no retirement; an HPA's write while the pair serves -> the operator writes nothing back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from metrics_page import metrics_page  # noqa: E402
from operator_scenarios import STS, condition, fleet, make_fleet_ready, wait_status

from pdfleet.contract import metrics as names
from pdfleet.contract import scale_to_zero as stz
from pdfleet.operator import api
from pdfleet.operator.autoscale.scale_to_zero_edge import SCALE_TO_ZERO_MANAGER
from pdfleet.operator.reconcile.reconciler import ReconcileOptions

pytestmark = pytest.mark.timeout(60)
SCALERS = f"{api.GROUP}/{api.VERSION}/{api.scaler.PLURAL}"
SCALE = "disaggregatedinferencescalers/scale"
OPTIONS = ReconcileOptions(default_image="pdfleet/runtime:test", drain_seconds=0.5, workers=2,
                           prefix_routing_interval_s=3600)


def page(s: dict[str, float]) -> str:
    return (f"# TYPE {stz.ROUTER_WAITING_REQUESTS} gauge\n{stz.ROUTER_WAITING_REQUESTS} {s['waiting']}\n"
            f"# TYPE {stz.ROUTER_ACTIVATIONS} counter\n{stz.ROUTER_ACTIVATIONS}_total {s['activations']}\n"
            f"# TYPE {names.ROUTER_REVISION_REQUESTS} counter\n"
            f'{names.ROUTER_REVISION_REQUESTS}_total{{revision="r",outcome="answered"}} {s["requests"]}\n'
            f"# TYPE {names.ROUTER_STREAMS} gauge\n{names.ROUTER_STREAMS}{{revision=\"r\"}} {s['streams']}\n")


@pytest.fixture
async def front_end(unused_tcp_port: int):
    """The router pod's /metrics as the waiting room exposes them."""
    state = {"waiting": 0.0, "activations": 0.0, "requests": 0.0, "streams": 0.0}
    async with metrics_page(unused_tcp_port, lambda: page(state)):
        yield unused_tcp_port, state


def pair_fleet(port: int, replicas: int, idle_seconds: int = 1) -> dict[str, Any]:
    role = {"replicas": replicas, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}
    return fleet(prefill=role, decode=role, router={"replicas": 1, "port": port},
                 scaling={"scaleToZero": {"enabled": True, "idleSeconds": idle_seconds,
                                          "activationTimeoutSeconds": 60, "maxWaiting": 10}})


def scaler(kube: FakeKube, role: str) -> int:
    return (kube.get(SCALERS, NAMESPACE, f"llama-{role}") or {}).get("spec", {}).get("replicas", -1)


def pair(kube: FakeKube) -> tuple[int, int]:
    return scaler(kube, "prefill"), scaler(kube, "decode")


def scale_writes(kube: FakeKube, since: int = 0) -> list[Any]:
    return [c for c in kube.writes(since) if c.resource == SCALE]


def events(kube: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == reason]


def sts_replicas(kube: FakeKube, rev: str) -> tuple[int, int]:
    return tuple(kube.get(STS, NAMESPACE, f"llama-{r}-{rev}")["spec"]["replicas"] for r in ("prefill", "decode"))


async def start(kube: FakeKube, start_operator, port: int, replicas: int) -> tuple[FakeDriver, str]:
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=OPTIONS)
    await driver.create_cr(pair_fleet(port, replicas))
    await eventually(lambda: kube.get("apps/v1/deployments", NAMESPACE, "llama-router"), what="the router Deployment")
    await kube.simulate_deployment(NAMESPACE, "llama-router", pods=True, ip="127.0.0.1")
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "a revision")
    await eventually(lambda: pair(kube) == (replicas, replicas), what="both scalers")
    return driver, st["revision"]


async def test_a_held_request_wakes_both_roles_in_one_write_each(kube: FakeKube, start_operator, front_end):
    port, state = front_end
    driver, rev = await start(kube, start_operator, port, replicas=0)
    await make_fleet_ready(driver, "llama")   # the StatefulSet controller reports 0 of 0
    st = await wait_status(driver, "llama", lambda s: condition(s, "ScaledToZero").get("status") == "True"
                           and condition(s, "Ready").get("status") == "True"
                           and condition(s, "Progressing").get("reason") == "Complete", "Ready, scaled to zero, complete")
    assert condition(st, "Ready")["reason"] == "ScaledToZero", condition(st, "Ready")
    assert st["prefill"]["replicas"] == 0 and st["decode"]["replicas"] == 0
    # Negative control: at 0 with nothing held, the operator reads the front end and writes nothing.
    await asyncio.sleep(1.5)
    assert scale_writes(kube) == [] and pair(kube) == (0, 0)

    since = len(kube.calls)
    state.update(waiting=2, activations=1)   # the waiting room holds two requests
    await eventually(lambda: pair(kube) == (1, 1), timeout=10, what="both scalers 0 -> 1")
    await eventually(lambda: sts_replicas(kube, rev) == (1, 1), what="both StatefulSets at 1")
    await asyncio.sleep(1.5)   # still held (the pods are not ready yet): no second write
    writes = scale_writes(kube, since)
    assert sorted(c.name for c in writes) == ["llama-decode", "llama-prefill"], writes
    assert {c.field_manager for c in writes} == {SCALE_TO_ZERO_MANAGER}
    (event,) = events(kube, "PairActivated")
    assert event["type"] == "Normal" and "prefill 0 -> 1" in event["message"] and "decode 0 -> 1" in event["message"]
    assert "2 request(s) held" in event["message"]
    st = await wait_status(driver, "llama", lambda s: condition(s, "ScaledToZero").get("reason") == "Activating",
                           "Activating")
    assert "2 request(s) held" in condition(st, "ScaledToZero")["message"]
    metrics = driver.operator.runtime["reconciler"].metrics
    assert metrics.count("pdfleet_operator_pair_activations_total", {"fleet": "llama"}) == 1


async def test_idle_retires_both_roles_after_the_drain(kube: FakeKube, start_operator, front_end):
    port, state = front_end
    state.update(streams=1)   # a long answer still streaming
    driver, rev = await start(kube, start_operator, port, replicas=1)
    await make_fleet_ready(driver, "llama")
    # Negative control: in flight for longer than idleSeconds (1 s): nothing is retired.
    await asyncio.sleep(2.5)
    assert pair(kube) == (1, 1) and scale_writes(kube) == []
    state.update(streams=0, requests=1)   # it finished; from now on nothing comes
    await eventually(lambda: pair(kube) == (0, 0), timeout=10, what="both scalers -> 0 together")
    writes = scale_writes(kube)
    assert sorted(c.name for c in writes) == ["llama-decode", "llama-prefill"]
    assert {c.field_manager for c in writes} == {SCALE_TO_ZERO_MANAGER}
    await eventually(lambda: sts_replicas(kube, rev) == (0, 0), what="both StatefulSets at 0")
    (event,) = await eventually(lambda: events(kube, "PairRetired"), what="a PairRetired event")
    assert "prefill 1 -> 0" in event["message"] and "decode 1 -> 0" in event["message"]
    st = await wait_status(driver, "llama", lambda s: condition(s, "ScaledToZero").get("status") == "True",
                           "ScaledToZero")
    assert condition(st, "Ready")["reason"] == "ScaledToZero"


async def test_a_request_mid_retirement_turns_it_around(kube: FakeKube, start_operator, front_end):
    port, state = front_end
    driver, rev = await start(kube, start_operator, port, replicas=1)
    await make_fleet_ready(driver, "llama")
    await eventually(lambda: pair(kube) == (0, 0), timeout=10, what="retired")
    # The StatefulSets are at 0 but their pods still drain (the fake keeps them); a request arrives and is held.
    since = len(kube.calls)
    state.update(waiting=1, activations=1)
    await eventually(lambda: pair(kube) == (1, 1), timeout=10, what="activated again")
    await eventually(lambda: sts_replicas(kube, rev) == (1, 1), what="both StatefulSets back at 1")
    assert sorted(c.name for c in scale_writes(kube, since)) == ["llama-decode", "llama-prefill"]
    assert len(events(kube, "PairRetired")) == 1 and len(events(kube, "PairActivated")) == 1
    # While the request is held nothing retires the pair again, past idleSeconds.
    await asyncio.sleep(2.0)
    assert pair(kube) == (1, 1)


async def test_an_hpa_and_the_operator_do_not_fight(kube: FakeKube, start_operator, front_end):
    port, state = front_end
    driver, rev = await start(kube, start_operator, port, replicas=0)
    state.update(waiting=1, activations=1)
    await eventually(lambda: pair(kube) == (1, 1), timeout=10, what="activated")
    await make_fleet_ready(driver, "llama")
    state.update(waiting=0, requests=1)
    # An HPA (or KEDA's) takes the pair from 1 up: an update of /scale as its own manager.
    since = len(kube.calls)
    for role, n in (("decode", 3), ("prefill", 2)):
        resp = await kube.patch(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NAMESPACE}/{api.scaler.PLURAL}/"
                                f"llama-{role}/scale?fieldManager=horizontal-pod-autoscaler",
                                json={"spec": {"replicas": n}}, headers={"Content-Type": "application/merge-patch+json"})
        assert resp.status == 200, await resp.text()
    await eventually(lambda: sts_replicas(kube, rev) == (2, 3), what="the StatefulSets follow the HPA")
    # Traffic keeps coming: the operator writes nothing back (its only writes are the pair's 0 <-> 1).
    for n in range(2, 6):
        state.update(requests=n)
        await asyncio.sleep(0.4)
    assert pair(kube) == (2, 3)
    assert [c for c in scale_writes(kube, since) if c.field_manager == SCALE_TO_ZERO_MANAGER] == []
    # Idle: both go to 0 together from the HPA's sizes, then a held request brings both to 1, as its own manager.
    await eventually(lambda: pair(kube) == (0, 0), timeout=10, what="retired from the HPA's sizes")
    state.update(waiting=1, activations=2)
    await eventually(lambda: pair(kube) == (1, 1), timeout=10, what="activated again")
    ours = [c for c in scale_writes(kube, since) if c.field_manager == SCALE_TO_ZERO_MANAGER]
    assert len(ours) == 4 and all(c.verb == "patch" for c in ours)
