"""Issue 20 on a real cluster (KUBECONFIG), marked `k8s`: a Secret squatting the fleet's key Secret name
is never used, and EndpointSlices made by hand with the fleet's labels get no traffic from the router's
discovery; the EndpointSlice controller itself removes or rewrites a forged slice that claims to be its
own (the claim docs/router.md rests on)."""

from __future__ import annotations

import asyncio
import base64

import pytest
from k8s_env import K8sDriver
from operator_scenarios import STS, condition, fleet, scenario_create, wait_status

from pdfleet.connector.router.app import Router
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.discovery import kubernetes_discovery

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]


async def test_squatted_key_secret_is_never_used(k8s_driver: K8sDriver):
    ns = k8s_driver.namespace
    squat = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llama-kv-auth", "namespace": ns},
             "data": {"key": base64.b64encode(b"0" * 64).decode()}}
    async with k8s_driver.http.post(f"api/v1/namespaces/{ns}/secrets", json=squat) as resp:
        assert resp.status == 201, await resp.text()
    await k8s_driver.create_cr(fleet())
    st = await wait_status(k8s_driver, "llama", lambda s: condition(s, "Ready")["reason"] == "NotOwned",
                           "Ready=False NotOwned", timeout=60)
    assert "Secret/llama-kv-auth" in condition(st, "Ready")["message"]
    await asyncio.sleep(3)
    assert await k8s_driver.list(STS, {"pdfleet.io/fleet": "llama"}) == []
    secret = await k8s_driver.get("v1/secrets", "llama-kv-auth")
    assert secret["data"] == squat["data"] and not secret["metadata"].get("ownerReferences")
    async with k8s_driver.http.delete(f"api/v1/namespaces/{ns}/secrets/llama-kv-auth") as resp:
        assert resp.status in (200, 202)
    for _ in range(120):  # the operator's retry (backoff) makes its own
        ours = await k8s_driver.get("v1/secrets", "llama-kv-auth")
        if ours and ours["metadata"].get("ownerReferences"):
            break
        await asyncio.sleep(1)
    else:
        raise AssertionError("the operator never made its own key Secret")
    assert ours["data"] != squat["data"]


async def test_hand_made_endpointslices_get_no_traffic(k8s_driver: K8sDriver):
    import os

    ns = k8s_driver.namespace
    cr = await scenario_create(k8s_driver)
    services = [s for s in await k8s_driver.list("v1/services", {"pdfleet.io/fleet": "llama"})
                if s["metadata"]["labels"].get("pdfleet.io/role") == "prefill"]
    (svc,) = services
    labels = dict(svc["metadata"]["labels"])

    def forged(name, ip, *, claims_controller):
        meta = {"name": name, "namespace": ns, "labels": {**labels, "kubernetes.io/service-name": svc["metadata"]["name"]}}
        if claims_controller:
            meta["labels"]["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Service", "name": svc["metadata"]["name"],
                                        "uid": svc["metadata"]["uid"], "controller": True}]
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta, "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}]}

    for body in (forged("by-hand", "10.254.0.1", claims_controller=False),
                 forged("claims-controller", "10.254.0.2", claims_controller=True)):
        async with k8s_driver.http.post(f"apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                                        json=body) as resp:
            assert resp.status == 201, await resp.text()

    config = RouterConfig(kubernetes_fleet="llama", kubernetes_namespace=ns, kubernetes_fleet_uid=cr["metadata"]["uid"],
                          kubeconfig=os.environ.get("KUBECONFIG"))
    router = Router(config)
    task = asyncio.create_task(kubernetes_discovery(config)(router))
    try:
        await asyncio.sleep(5)
        urls = {e.url for g in router._groups.values() for e in (*g.prefill, *g.decode)}
        assert not any("10.254." in u for u in urls), urls
        assert router.metrics.endpointslices_refused._value.get() >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # the controller does not keep a slice that claims to be its own without the Service owning it as it would
    for _ in range(60):
        got = await k8s_driver.get("discovery.k8s.io/v1/endpointslices", "claims-controller")
        if got is None or all("10.254.0.2" not in (e.get("addresses") or []) for e in got.get("endpoints") or []):
            break
        await asyncio.sleep(1)
    else:
        raise AssertionError("the EndpointSlice controller kept a forged slice of the fleet's Service")
