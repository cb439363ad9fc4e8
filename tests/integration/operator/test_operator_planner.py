"""The SLO planner end to end: the real kopf operator scrapes a real router (its /metrics, over
HTTP, at the router pod's IP and port), decides, and scales the scalers through /scale;
an HPA on one of the fleet's scalers makes it stand down, with the reason."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from operator_scenarios import DEPLOY, STS, fleet, make_fleet_ready, wait_status

from pdfleet.connector.router.app import start_router
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator import api

from router_fakes import FakeEngine  # noqa: E402

pytestmark = pytest.mark.timeout(60)
SCALERS = f"{api.GROUP}/{api.VERSION}/{api.scaler.PLURAL}"


@contextlib.asynccontextmanager
async def slow_fleet(prefill_delay_s: float):
    """A real router in front of fake engines whose prefill is slow: TTFT well above 100 ms."""
    p = FakeEngine(name="p0", role="prefill", delay_s=prefill_delay_s)
    d = FakeEngine(name="d0", role="decode")
    await p.start()
    await d.start()
    runner, port = await start_router(RouterConfig(prefill=(p.url,), decode=(d.url,)), "127.0.0.1", 0)
    stop = asyncio.Event()

    async def load() -> None:
        async with aiohttp.ClientSession() as session:
            async def one() -> None:
                body = {"model": "tiny", "prompt": "hi", "max_tokens": 3}
                async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
                    await resp.read()   # released: the pool never runs dry

            while not stop.is_set():
                await asyncio.gather(*(one() for _ in range(4)))

    task = asyncio.create_task(load())
    try:
        yield port
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await runner.cleanup()
        await p.stop()
        await d.stop()


async def router_pod(kube: FakeKube, port: int) -> None:
    """The router Deployment's pod as Kubernetes makes it (a ReplicaSet between them, the template hash):
    the planner reads only pods the fleet's workloads run (issue 30). Its port is the spec's (`port`)."""
    dep = await eventually(lambda: kube.get(DEPLOY, NAMESPACE, "llama-router"), what="the router Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == port
    await kube.simulate_deployment(NAMESPACE, "llama-router", pods=True, ip="127.0.0.1")


def planner_fleet(port: int) -> dict[str, Any]:
    return fleet(prefill={"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
                 decode={"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
                 router={"replicas": 1, "port": port},
                 scaling={"planner": {"enabled": True, "ttftMs": 100, "itlMs": 1000, "intervalSeconds": 1,
                                      "scaleDownDelaySeconds": 600}})


def events(kube: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == reason]


async def test_planner_scales_prefill_up_from_the_routers_ttft(driver: FakeDriver, kube: FakeKube):
    async with slow_fleet(prefill_delay_s=0.3) as port:
        await driver.create_cr(planner_fleet(port))
        await router_pod(kube, port)
        await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the StatefulSets")
        await make_fleet_ready(driver, "llama")   # its pods ready: no scale-up is under way
        await eventually(lambda: (kube.get(SCALERS, NAMESPACE, "llama-prefill") or {}).get("spec", {}).get("replicas", 0) >= 2,
                         timeout=20, what="the planner scaling prefill up")
        st = await wait_status(driver, "llama", lambda s: "up:" in s.get("scaling", {}).get("planner", ""), "planner status")
        assert "prefill" in st["scaling"]["planner"] and "of 100ms" in st["scaling"]["planner"]
        rev = st["revision"]
        await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-prefill-{rev}")["spec"]["replicas"] >= 2,
                         what="the prefill StatefulSet following the planner")
        (event, *_) = await eventually(lambda: events(kube, "PlannerScaled"), what="a PlannerScaled event")
        assert "prefill 1 -> " in event["message"]
        # ITL is far within its 1 s target and the scale-down delay is long: decode stays put.
        assert kube.get(SCALERS, NAMESPACE, "llama-decode")["spec"]["replicas"] == 1
        # The planner wrote through /scale, as an HPA would.
        assert any(c.resource == "disaggregatedinferencescalers/scale" and c.verb == "patch" for c in kube.writes())


async def test_planner_stands_down_when_an_hpa_targets_a_scaler(driver: FakeDriver, kube: FakeKube):
    async with slow_fleet(prefill_delay_s=0.3) as port:
        resp = await kube.post(f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers", json={
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "decode-hpa"},
            "spec": {"scaleTargetRef": {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInferenceScaler",
                                        "name": "llama-decode"}, "minReplicas": 1, "maxReplicas": 4}})
        assert resp.status == 201, await resp.text()
        await driver.create_cr(planner_fleet(port))
        await router_pod(kube, port)
        await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the StatefulSets")
        await make_fleet_ready(driver, "llama")
        st = await wait_status(driver, "llama", lambda s: "refused" in s.get("scaling", {}).get("planner", ""), "refused")
        assert "HorizontalPodAutoscaler/decode-hpa" in st["scaling"]["planner"]
        (event,) = await eventually(lambda: events(kube, "PlannerConflict"), what="a PlannerConflict event")
        assert event["type"] == "Warning" and "decode-hpa" in event["message"]
        await asyncio.sleep(2.5)   # two planner intervals with a TTFT far above target: still nothing written
        assert kube.get(SCALERS, NAMESPACE, "llama-prefill")["spec"]["replicas"] == 1
        assert not any(c.resource == "disaggregatedinferencescalers/scale" for c in kube.writes())
        # The HPA removed: the planner takes over.
        resp = await kube.delete(f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/decode-hpa")
        assert resp.status == 200
        # A liveness wait, not a speed check: a loaded CI machine took more than 20 s here once.
        await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-prefill")["spec"]["replicas"] >= 2, timeout=60,
                         what="the planner scaling once the HPA is gone")
