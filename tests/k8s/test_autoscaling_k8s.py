"""Per-role scalers against a real API server (KUBECONFIG): the scaler CRD's /scale subresource,
as `kubectl scale` and an HPA use it, drives the StatefulSet through the operator's clamp.

Written without a cluster at hand (none can be installed on the development machines): it
runs, like the rest of tests/k8s, with `make test-k8s`."""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import aiohttp
import pytest
import waits
import yaml
from k8s_env import K8sDriver, apply_crd
from operator_scenarios import STS, fleet

from pdfleet.operator import api

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]
SCALER_CRD = pathlib.Path(__file__).resolve().parents[2] / "crds" / "pdfleet.io_disaggregatedinferencescalers.yaml"
SCALERS = f"{api.GROUP}/{api.VERSION}/{api.scaler.PLURAL}"


@pytest.fixture
async def scaler_crd(k8s_http: aiohttp.ClientSession) -> None:
    if not await apply_crd(k8s_http, yaml.safe_load(SCALER_CRD.read_text())):
        pytest.fail("the scaler CRD was not established")


until = functools.partial(waits.until, timeout=60.0, interval=0.2)  # a real cluster: slower than the fake


async def test_scale_subresource_drives_the_statefulset_with_clamp(scaler_crd: None, k8s_driver: K8sDriver):
    d = k8s_driver
    await d.create_cr(fleet(decode={"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}))
    scaler = await until(lambda: d.get(SCALERS, "llama-decode"), "the decode scaler")
    assert scaler["spec"]["replicas"] == 2 and scaler["metadata"]["ownerReferences"][0]["kind"] == api.KIND
    scale_url = f"apis/{api.GROUP}/{api.VERSION}/namespaces/{d.namespace}/{api.scaler.PLURAL}/llama-decode/scale"
    async with d.http.patch(scale_url, json={"spec": {"replicas": 9}},
                            headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["kind"] == "Scale"

    async def decode_at_max() -> bool:
        sts = [s for s in await d.list(STS, {"pdfleet.io/fleet": "llama", "pdfleet.io/role": "decode"})]
        return bool(sts) and all(s["spec"]["replicas"] == 4 for s in sts)

    await until(decode_at_max, "decode clamped to maxReplicas 4")
    async def scale_status() -> Any:   # what an HPA reads
        async with d.http.get(scale_url) as resp:
            scale = await resp.json()
        return scale if scale.get("status", {}).get("replicas") == 4 else None

    scale = await until(scale_status, "the Scale's status.replicas at 4")
    assert scale["spec"]["replicas"] == 9
    assert scale["status"]["selector"] == "pdfleet.io/fleet=llama,pdfleet.io/role=decode"
