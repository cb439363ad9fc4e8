"""A fleet behind a Gateway (issue 29): the kopf operator creates, updates and deletes the InferencePool
and its Endpoint Picker with the fleet, against FakeKube with GAIE's InferencePool registered."""

from __future__ import annotations

import base64

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import eventually
from operator_scenarios import (
    CR_RESOURCE,
    KIND_RESOURCES,
    STS,
    condition,
    expected_children,
    fleet,
    fleet_children,
    make_fleet_ready,
    names_by_kind,
    settle,
    wait_children,
    wait_status,
)

pytestmark = pytest.mark.timeout(60)

POOL_SPEC = {"enabled": True, "allowFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}}]}

POOL = KIND_RESOURCES["InferencePool"]
GATEWAY_CHILDREN = {("InferencePool", "llama"), ("Deployment", "llama-epp"), ("Service", "llama-epp"),
                    ("ServiceAccount", "llama-epp"), ("Role", "llama-epp"), ("RoleBinding", "llama-epp"),
                    ("PodDisruptionBudget", "llama-epp"), ("NetworkPolicy", "llama-gateway"),
                    ("NetworkPolicy", "llama-epp")}


def pairs(by_kind: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(kind, name) for kind, names in by_kind.items() for name in names}


async def wait_plan(d: FakeDriver) -> dict:
    cr = await d.get(CR_RESOURCE, "llama")
    await wait_children(d, "llama", names_by_kind(expected_children(cr, NAMESPACE)))
    return cr


async def test_the_pool_and_its_picker_live_and_die_with_the_fleet(driver: FakeDriver, kube):
    d = driver
    cr = await d.create_cr(fleet(gateway={"inferencePool": POOL_SPEC}))
    await wait_plan(d)
    assert GATEWAY_CHILDREN <= pairs(await fleet_children(d, "llama"))
    pool = await d.get(POOL, "llama")
    assert [r["uid"] for r in pool["metadata"]["ownerReferences"] if r.get("controller")] == [cr["metadata"]["uid"]]
    assert pool["spec"]["endpointPickerRef"] == {"kind": "Service", "name": "llama-epp", "port": {"number": 9002},
                                                 "failureMode": "FailClose"}
    # the EPP's caller token (issue 38): generated once into its own Secret, mounted by reference
    secret = await eventually(lambda: kube.get("v1/secrets", NAMESPACE, "llama-epp-caller"), what="the caller Secret")
    assert len(base64.b64decode(secret["data"]["token"])) == 64
    epp = kube.get("apps/v1/deployments", NAMESPACE, "llama-epp")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "PDFLEET_EPP_CALLER_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "llama-epp-caller", "key": "token"}}} in epp["env"]
    # Ready waits for the picker as it waits for the router (the gateway's way in)
    for sts in await d.list(STS, {"pdfleet.io/fleet": "llama"}):
        await d.make_ready("StatefulSet", sts["metadata"]["name"])
    await d.make_ready("Deployment", "llama-router")
    await wait_status(d, "llama", lambda s: "endpoint picker" in condition(s, "Ready")["message"],
                      "Ready=False waiting for the endpoint picker")
    await make_fleet_ready(d, "llama")
    st = await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready=True")
    assert st["epp"]["readyReplicas"] == 2

    # update: the pool and the picker's Service follow the spec
    await d.patch_cr("llama", {"spec": {"gateway": {"inferencePool": {
        "failureMode": "FailOpen", "failOpenWithoutEngineToken": True, "eppPort": 19002}}}})
    await eventually(lambda: kube.get(POOL, NAMESPACE, "llama")["spec"]["endpointPickerRef"]
                     == {"kind": "Service", "name": "llama-epp", "port": {"number": 19002}, "failureMode": "FailOpen"},
                     what="the pool's endpointPickerRef updated")
    await eventually(lambda: kube.get("v1/services", NAMESPACE, "llama-epp")["spec"]["ports"][0]["port"] == 19002,
                     what="the picker's Service port updated")
    await wait_plan(d)

    # disabled: the pool and every picker child go, the rest of the fleet stays
    before = pairs(await fleet_children(d, "llama"))
    await d.patch_cr("llama", {"spec": {"gateway": {"inferencePool": {"enabled": False}}}})
    await wait_plan(d)
    after = pairs(await fleet_children(d, "llama"))
    assert after == before - GATEWAY_CHILDREN
    assert await d.get(POOL, "llama") is None

    # enabled again, then the fleet deleted: the garbage collector takes the pool with the rest
    await d.patch_cr("llama", {"spec": {"gateway": {"inferencePool": {"enabled": True}}}})
    await wait_plan(d)
    assert GATEWAY_CHILDREN <= pairs(await fleet_children(d, "llama"))
    await settle(d)
    await d.delete_cr("llama")
    await wait_children(d, "llama", {})
    assert await d.get(POOL, "llama") is None


async def test_a_pool_changed_by_hand_is_put_back(driver: FakeDriver, kube):
    d = driver
    await d.create_cr(fleet(gateway={"inferencePool": POOL_SPEC}))
    await wait_plan(d)
    await settle(d)
    resp = await kube.delete(f"/apis/inference.networking.k8s.io/v1/namespaces/{NAMESPACE}/inferencepools/llama")
    assert resp.status == 200, await resp.text()
    await eventually(lambda: kube.get(POOL, NAMESPACE, "llama") is not None, what="the pool re-created")



async def test_the_gateways_word_on_the_pool_reaches_the_fleets_status(driver: FakeDriver, kube):
    d = driver
    await d.create_cr(fleet(gateway={"inferencePool": POOL_SPEC}))
    await wait_plan(d)
    await wait_status(d, "llama", lambda s: condition(s, "InferencePoolAccepted")["reason"] == "NoParent", "NoParent")
    applied = (await d.get(POOL, "llama"))["metadata"]["annotations"]["pdfleet.io/applied-hash"]
    gateway = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": NAMESPACE, "name": "gw"}

    def parents(accepted: str, reason: str) -> dict:
        return {"parents": [{"parentRef": gateway, "conditions": [
            {"type": "Accepted", "status": accepted, "reason": reason, "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}

    await kube.set_status(POOL, NAMESPACE, "llama", parents("False", "NotSupportedByGateway"))
    st = await wait_status(d, "llama", lambda s: condition(s, "InferencePoolAccepted")["status"] == "False", "False")
    assert condition(st, "InferencePoolAccepted")["reason"] == "NotSupportedByGateway"
    await kube.set_status(POOL, NAMESPACE, "llama", parents("True", "Accepted"))
    st = await wait_status(d, "llama", lambda s: condition(s, "InferencePoolAccepted")["status"] == "True", "True")
    assert f"Gateway/{NAMESPACE}/gw" in condition(st, "InferencePoolAccepted")["message"]
    # the gateway's status is not the operator's to undo: the pool is not re-applied
    await settle(d)
    assert (await d.get(POOL, "llama"))["metadata"]["annotations"]["pdfleet.io/applied-hash"] == applied
    assert (await d.get(POOL, "llama"))["status"] == parents("True", "Accepted")
