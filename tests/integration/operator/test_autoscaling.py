"""Per-role autoscaling end to end: the real kopf operator against FakeKube.

The test plays HPA / `kubectl scale` by patching a scaler's `/scale` subresource over HTTP.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from operator_scenarios import CR_RESOURCE, STS, condition, fleet, make_fleet_ready, status_of, wait_status

from pdfleet.operator import api

pytestmark = pytest.mark.timeout(60)
SCALERS = f"{api.GROUP}/{api.VERSION}/{api.scaler.PLURAL}"
AUTO_P = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}}
AUTO_D = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}}


async def scale(kube: FakeKube, name: str, replicas: int) -> None:
    """What `kubectl scale dinfscaler/<name> --replicas N` and an HPA send."""
    resp = await kube.patch(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NAMESPACE}/{api.scaler.PLURAL}/{name}/scale",
                            json={"spec": {"replicas": replicas}}, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


def sts_replicas(kube: FakeKube, role: str, revision: str) -> int:
    return kube.get(STS, NAMESPACE, f"llama-{role}-{revision}")["spec"]["replicas"]


def events(kube: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == reason]


async def start(driver: FakeDriver, **spec: Any) -> str:
    await driver.create_cr(fleet(**spec))
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "a revision")
    return st["revision"]


async def test_scalers_are_created_with_owner_references(driver: FakeDriver, kube: FakeKube):
    rev = await start(driver, prefill={"replicas": 1}, decode=AUTO_D)
    cr = kube.get(CR_RESOURCE, NAMESPACE, "llama")
    scaler = await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode"), what="the decode scaler")
    (owner,) = scaler["metadata"]["ownerReferences"]
    assert owner["uid"] == cr["metadata"]["uid"] and owner["kind"] == "DisaggregatedInference" and owner["controller"]
    assert scaler["spec"]["replicas"] == 2, "a new scaler starts at the CR's replicas"
    assert kube.get(SCALERS, NAMESPACE, "llama-prefill") is None, "prefill has no autoscaling: no scaler"
    scaler = await eventually(lambda: (s := kube.get(SCALERS, NAMESPACE, "llama-decode")).get("status") and s,
                              what="the scaler's status")
    assert scaler["status"]["replicas"] == 2 and scaler["status"]["selector"] == "pdfleet.io/fleet=llama,pdfleet.io/role=decode"
    assert sts_replicas(kube, "decode", rev) == 2
    # The fleet's deletion takes its scalers along (garbage collection through the owner reference).
    await driver.delete_cr("llama")
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode") is None, what="the scaler collected")


async def test_scale_patch_moves_the_statefulset_not_the_revision(driver: FakeDriver, kube: FakeKube):
    rev = await start(driver, prefill=AUTO_P, decode=AUTO_D)
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode"), what="the decode scaler")
    await scale(kube, "llama-decode", 5)
    await eventually(lambda: sts_replicas(kube, "decode", rev) == 5, what="decode StatefulSet at 5")
    await scale(kube, "llama-prefill", 3)
    await eventually(lambda: sts_replicas(kube, "prefill", rev) == 3, what="prefill StatefulSet at 3")
    st = await wait_status(driver, "llama", lambda s: s.get("scaling", {}).get("decode", {}).get("replicas") == 5,
                           "scaling status")
    assert st["revision"] == rev and kube.list(STS, NAMESPACE) and len(kube.list(STS, NAMESPACE)) == 2
    assert condition(st, "ScalingLimited")["status"] == "False"
    scaler = await eventually(lambda: (s := kube.get(SCALERS, NAMESPACE, "llama-decode"))["status"]["replicas"] == 5 and s,
                              what="scaler status replicas 5")
    assert scaler["status"]["clamped"] is False and scaler["status"]["requestedReplicas"] == 5
    assert events(kube, "ScalingClamped") == []


async def test_above_max_is_clamped_with_condition_and_event(driver: FakeDriver, kube: FakeKube):
    rev = await start(driver, prefill=AUTO_P, decode=AUTO_D)
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-prefill"), what="the prefill scaler")
    await scale(kube, "llama-prefill", 20)
    await eventually(lambda: sts_replicas(kube, "prefill", rev) == 8, what="prefill clamped to maxReplicas 8")
    st = await wait_status(driver, "llama", lambda s: condition(s, "ScalingLimited")["status"] == "True", "ScalingLimited")
    assert "above maxReplicas 8" in condition(st, "ScalingLimited")["message"]
    assert st["scaling"]["prefill"] == {"requestedReplicas": 20, "replicas": 8, "reason": "above maxReplicas 8"}
    scaler = await eventually(lambda: (s := kube.get(SCALERS, NAMESPACE, "llama-prefill"))["status"]["clamped"] and s,
                              what="clamped in the scaler's status")
    assert scaler["status"]["replicas"] == 8 and scaler["spec"]["replicas"] == 20, "the operator never rewrites spec"
    (event,) = await eventually(lambda: events(kube, "ScalingClamped"), what="a ScalingClamped event")
    assert event["type"] == "Warning" and "prefill 20 -> 8" in event["message"]
    assert event["involvedObject"]["kind"] == "DisaggregatedInference"
    # Back within bounds: the condition clears, an event says so.
    await scale(kube, "llama-prefill", 4)
    await eventually(lambda: sts_replicas(kube, "prefill", rev) == 4, what="prefill at 4")
    await wait_status(driver, "llama", lambda s: condition(s, "ScalingLimited")["status"] == "False", "cleared")
    await eventually(lambda: events(kube, "ScalingWithinBounds"), what="a ScalingWithinBounds event")


async def test_against_the_ratio_is_clamped(driver: FakeDriver, kube: FakeKube):
    # decode fixed at 2, prefill autoscaled, prefill/decode at most 2.0
    rev = await start(driver, prefill=AUTO_P, decode={"replicas": 2}, scaling={"ratio": {"min": 0.5, "max": 2.0}})
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-prefill"), what="the prefill scaler")
    await scale(kube, "llama-prefill", 6)
    await eventually(lambda: sts_replicas(kube, "prefill", rev) == 4, what="prefill clamped to 2.0 x 2 decode")
    st = await wait_status(driver, "llama", lambda s: condition(s, "ScalingLimited")["status"] == "True", "ScalingLimited")
    assert "ratio max 2 with 2 decode" in condition(st, "ScalingLimited")["message"]
    await eventually(lambda: any("ratio max 2" in e["message"] for e in events(kube, "ScalingClamped")), what="event")
    assert sts_replicas(kube, "decode", rev) == 2


async def test_cr_replicas_edited_while_autoscaling_changes_nothing(driver: FakeDriver, kube: FakeKube):
    rev = await start(driver, prefill={"replicas": 1}, decode=AUTO_D)
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode"), what="the decode scaler")
    await scale(kube, "llama-decode", 3)
    await eventually(lambda: sts_replicas(kube, "decode", rev) == 3, what="decode at 3")
    # A Git change of both roles' replicas: the autoscaled one keeps its scaler's size.
    await driver.patch_cr("llama", {"spec": {"decode": {"replicas": 7}, "prefill": {"replicas": 2}}})
    generation = kube.get(CR_RESOURCE, NAMESPACE, "llama")["metadata"]["generation"]
    await wait_status(driver, "llama", lambda s: s.get("observedGeneration") == generation, "the edit reconciled")
    # Negative control: the role without autoscaling follows its replicas, as today.
    await eventually(lambda: sts_replicas(kube, "prefill", rev) == 2, what="prefill follows the CR")
    await asyncio.sleep(0.3)
    assert sts_replicas(kube, "decode", rev) == 3
    assert kube.get(SCALERS, NAMESPACE, "llama-decode")["spec"]["replicas"] == 3
    history = [v["spec"]["replicas"] for v in kube.objects[STS, NAMESPACE, f"llama-decode-{rev}"].history if v]
    assert 7 not in history


async def test_rollout_carries_the_scaled_size(driver: FakeDriver, kube: FakeKube):
    old = await start(driver, prefill={"replicas": 1}, decode=AUTO_D)
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode"), what="the decode scaler")
    await scale(kube, "llama-decode", 3)
    await eventually(lambda: sts_replicas(kube, "decode", old) == 3, what="decode at 3")
    await make_fleet_ready(driver, "llama")
    await wait_status(driver, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready")
    scaler_uid = kube.get(SCALERS, NAMESPACE, "llama-decode")["metadata"]["uid"]

    await driver.patch_cr("llama", {"spec": {"engine": {"blockSize": 32}}})   # a new revision
    new_sts = await eventually(lambda: [s for s in kube.list(STS, NAMESPACE, {"pdfleet.io/role": "decode"})
                                        if s["metadata"]["labels"]["pdfleet.io/revision"] != old],
                               what="the new decode StatefulSet")
    new = new_sts[0]["metadata"]["labels"]["pdfleet.io/revision"]
    assert new_sts[0]["spec"]["replicas"] == 3, "the new pair starts at the scaled size, not the CR's 2"
    # Scaled mid-rollout: the serving pair (all the traffic) and the new pair both follow.
    await scale(kube, "llama-decode", 4)
    await eventually(lambda: sts_replicas(kube, "decode", new) == 4 and sts_replicas(kube, "decode", old) == 4,
                     what="both pairs at 4")
    assert (await status_of(driver, "llama"))["revision"] == old
    assert kube.get(SCALERS, NAMESPACE, "llama-decode")["metadata"]["uid"] == scaler_uid, "the scaler survives rollouts"


async def test_deleted_scaler_is_recreated_at_the_current_size(driver: FakeDriver, kube: FakeKube):
    rev = await start(driver, prefill={"replicas": 1}, decode=AUTO_D)
    first = await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode"), what="the decode scaler")
    await scale(kube, "llama-decode", 3)
    await eventually(lambda: sts_replicas(kube, "decode", rev) == 3, what="decode at 3")
    resp = await kube.delete(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NAMESPACE}/{api.scaler.PLURAL}/llama-decode")
    assert resp.status == 200
    again = await eventually(lambda: (s := kube.get(SCALERS, NAMESPACE, "llama-decode")) and
                             s["metadata"]["uid"] != first["metadata"]["uid"] and s, what="the scaler recreated")
    assert again["spec"]["replicas"] == 3, "recreated at the role's current size, not the CR's 2"
    assert again["metadata"]["ownerReferences"][0]["uid"] == kube.get(CR_RESOURCE, NAMESPACE, "llama")["metadata"]["uid"]
    await asyncio.sleep(0.3)
    history = [v["spec"]["replicas"] for v in kube.objects[STS, NAMESPACE, f"llama-decode-{rev}"].history if v]
    assert history[-1] == 3 and history.count(2) <= 1 and history[history.index(3):] == [3] * len(history[history.index(3):])


async def test_ratio_the_operator_alone_can_refuse(driver: FakeDriver, kube: FakeKube):
    # Admitted by the CRD (some real ratio fits the bounds), refused by the operator (no whole numbers do).
    await driver.create_cr(fleet(prefill={"replicas": 1}, decode={"autoscaling": {"minReplicas": 2, "maxReplicas": 3}},
                                 scaling={"ratio": {"min": 0.35, "max": 0.45}}))
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == "InvalidSpec", "InvalidSpec")
    assert "spec.scaling.ratio" in condition(st, "Ready")["message"]
    await eventually(lambda: [e for e in events(kube, "InvalidSpec") if "spec.scaling.ratio" in e["message"]], what="event")
    assert kube.list(SCALERS, NAMESPACE) == [] and kube.list(STS, NAMESPACE) == []


async def test_autoscaling_removed_deletes_the_scaler_and_the_spec_rules_again(driver: FakeDriver, kube: FakeKube):
    rev = await start(driver, prefill={"replicas": 1}, decode=AUTO_D)
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode"), what="the decode scaler")
    await scale(kube, "llama-decode", 4)
    await eventually(lambda: sts_replicas(kube, "decode", rev) == 4, what="decode at 4")
    await driver.patch_cr("llama", {"spec": {"decode": {"autoscaling": None}}})
    await eventually(lambda: kube.get(SCALERS, NAMESPACE, "llama-decode") is None, what="the scaler deleted")
    await eventually(lambda: sts_replicas(kube, "decode", rev) == 2, what="decode back at the CR's replicas")
    st = await wait_status(driver, "llama", lambda s: "scaling" not in s, "no scaling status")
    assert [c for c in st["conditions"] if c["type"] == "ScalingLimited"] == []
