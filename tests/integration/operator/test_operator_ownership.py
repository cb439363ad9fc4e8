"""Issue 20 row 3, in kopf's real loop: an object of a child's name that the fleet does not own
(a user's own Deployment, a Service carrying the fleet's labels) is never taken over: no write to it,
a NotOwned condition and event naming it; the rest of the fleet is written; once it is gone, the
operator makes its own."""

from __future__ import annotations

import asyncio

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import eventually
from operator_scenarios import DEPLOY, STS, condition, fleet, settle, wait_status

pytestmark = pytest.mark.timeout(60)
SERVICES = "v1/services"


async def test_same_named_objects_the_fleet_does_not_own_are_never_taken_over(driver: FakeDriver, kube):
    users_deploy = await kube.put(DEPLOY, NAMESPACE, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llama-router", "namespace": NAMESPACE, "labels": {"app": "mine"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "mine"}},
                 "template": {"metadata": {"labels": {"app": "mine"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
    lookalike = await kube.put(SERVICES, NAMESPACE, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "llama-router", "namespace": NAMESPACE, "labels": {"pdfleet.io/fleet": "llama"}},
        "spec": {"selector": {"app": "mine"}, "ports": [{"port": 80}]}})
    await driver.create_cr(fleet())
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == "NotOwned",
                           "Ready=False NotOwned")
    message = condition(st, "Ready")["message"]
    assert "Deployment/llama-router" in message and "Service/llama-router" in message, message
    assert "authSecretRef" not in message  # only said when the key Secret is in the way
    await eventually(lambda: [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == "NotOwned"],
                     what="a NotOwned event")
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the engines, written meanwhile")
    await settle(driver)
    assert kube.get(DEPLOY, NAMESPACE, "llama-router") == users_deploy
    assert kube.get(SERVICES, NAMESPACE, "llama-router") == lookalike
    assert not [c for c in kube.writes() if c.name == "llama-router" and c.resource in ("deployments", "services")]
    events = [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == "NotOwned"]
    assert len(events) == 1  # retries do not repeat it

    await kube.remove(DEPLOY, NAMESPACE, "llama-router")
    await kube.remove(SERVICES, NAMESPACE, "llama-router")
    ours = await eventually(lambda: kube.get(DEPLOY, NAMESPACE, "llama-router"), timeout=30, what="our router")
    assert ours["metadata"]["ownerReferences"][0]["name"] == "llama"
    await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] != "NotOwned", "NotOwned cleared",
                      timeout=30)


def forged_pod(name: str, role: str, revision: str, ip: str, owner: dict | None = None) -> dict:
    """A pod anyone who may create pods in the namespace can make: the fleet's labels, ready."""
    meta = {"name": name, "labels": {"pdfleet.io/fleet": "llama", "pdfleet.io/role": role,
                                     "pdfleet.io/revision": revision, "app.kubernetes.io/name": "pdfleet"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


async def serving_fleet(driver: FakeDriver, kube) -> str:
    """A fleet whose first pair and router the controllers made ready: its serving revision."""
    await driver.create_cr(fleet())
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the first pair")
    for sts in kube.list(STS, NAMESPACE):
        await kube.simulate_statefulset(NAMESPACE, sts["metadata"]["name"])
    await kube.simulate_deployment(NAMESPACE, "llama-router")
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready")
    return st["revision"]


async def test_hand_made_engine_pods_of_a_new_revision_switch_nothing(driver: FakeDriver, kube):
    """Issue 30: ready prefill/decode pods with the new revision's labels but no owner (or an owner
    reference naming the new StatefulSet by name with a made-up uid) neither switch the router nor
    become endpoints; the fleet's own pods then do, and every forged pod was counted once."""
    old = await serving_fleet(driver, kube)
    await driver.patch_cr("llama", {"spec": {"engine": {"blockSize": 32}}})
    st = await wait_status(driver, "llama", lambda s: s["rollout"]["targetRevision"] != old, "a new target")
    new = st["rollout"]["targetRevision"]
    for role in ("prefill", "decode"):
        await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-{role}-{new}"), what=f"{role} of the new pair")
        fake_ref = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"llama-{role}-{new}",
                    "uid": "made-up", "controller": True}
        await kube.put("v1/pods", NAMESPACE, forged_pod(f"llama-{role}-{new}-0", role, new, "10.9.0.1"))
        await kube.put("v1/pods", NAMESPACE, forged_pod(f"llama-{role}-{new}-1", role, new, "10.9.0.2", fake_ref))
    await settle(driver)
    st = await wait_status(driver, "llama", lambda s: condition(s, "Progressing")["reason"] == "RollingOut",
                           "still rolling out")
    assert st["revision"] == old, "forged pods switched the router"
    assert {e["revision"] for e in st["endpoints"]["prefill"]} == {old}
    assert kube.get(STS, NAMESPACE, f"llama-decode-{old}") is not None
    metrics = driver.operator.runtime["metrics"]
    assert metrics.registry.get_sample_value("pdfleet_operator_unowned_objects_ignored_total", {"kind": "Pod"}) == 4

    # The fleet's own pods (the StatefulSet controller replaces the forged ones of its pods' names).
    await kube.simulate_deployment(NAMESPACE, "llama-router")  # whatever the spec change did to it
    for role in ("prefill", "decode"):
        await kube.simulate_statefulset(NAMESPACE, f"llama-{role}-{new}", ip_prefix="10.2")
    st = await wait_status(driver, "llama", lambda s: s["revision"] == new, "the switch, on the fleet's pods")
    assert all(e["ip"].startswith("10.2.") for e in st["endpoints"]["prefill"])


async def test_a_services_labels_are_restored_on_drift(driver: FakeDriver, kube):
    """Issue 30: someone who may patch the fleet's Services edits the serving label and adds a
    canary weight (the router obeys both through the EndpointSlices); the applied-hash annotation is
    untouched, and the next reconcile puts the labels back as the plan has them."""
    await driver.create_cr(fleet())
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "a revision")
    name = f"llama-decode-{st['rollout']['targetRevision']}"
    svc = await eventually(lambda: kube.get(SERVICES, NAMESPACE, name), what="the decode Service")
    want = dict(svc["metadata"]["labels"])
    assert want.get("pdfleet.io/serving") == "true" and "pdfleet.io/canary-weight" not in want
    await settle(driver)
    drifted = {**want, "pdfleet.io/serving": "false", "pdfleet.io/canary-weight": "100"}
    await kube.put(SERVICES, NAMESPACE, {**svc, "metadata": {**svc["metadata"], "labels": drifted}})
    await eventually(lambda: kube.get(SERVICES, NAMESPACE, name)["metadata"]["labels"].get("pdfleet.io/serving")
                     == "true", what="the serving label restored")
    # a label of the fleet's keys that the plan does not set (a canary weight on a pair with no
    # canary, which the router would obey) comes off too; anybody else's label stays
    await eventually(lambda: "pdfleet.io/canary-weight" not in kube.get(SERVICES, NAMESPACE, name)["metadata"]["labels"],
                     what="the hand-added canary weight removed")
    svc = kube.get(SERVICES, NAMESPACE, name)
    await kube.put(SERVICES, NAMESPACE, {**svc, "metadata": {**svc["metadata"],
                                                             "labels": {**svc["metadata"]["labels"], "team": "a"}}})
    await settle(driver)
    assert kube.get(SERVICES, NAMESPACE, name)["metadata"]["labels"] == {**want, "team": "a"}
    writes = [c for c in kube.writes() if c.name == name]
    await asyncio.sleep(1.0)
    assert [c for c in kube.writes() if c.name == name] == writes, "the reconcile keeps rewriting the Service"


async def test_no_switch_to_a_new_pair_while_a_router_pod_runs_an_older_template(driver: FakeDriver, kube):
    """Issue 30's upgrade window: the new pair's engines ask the engine API token of every caller; a
    router pod of an older template (e.g. from before the token) would get 401s from them, so the
    switch waits in RollingOut until the router's Deployment has rolled out, then happens."""
    old = await serving_fleet(driver, kube)
    await driver.patch_cr("llama", {"spec": {"image": "registry.example/pdfleet-runtime:v2"}})
    st = await wait_status(driver, "llama", lambda s: s["rollout"]["targetRevision"] != old, "a new target")
    new = st["rollout"]["targetRevision"]
    router = await eventually(lambda: (kube.get(DEPLOY, NAMESPACE, "llama-router") or {}).get("metadata", {})
                              .get("generation", 1) > 1 and kube.get(DEPLOY, NAMESPACE, "llama-router"),
                              what="the router's new template")
    assert router["status"]["observedGeneration"] < router["metadata"]["generation"]
    for role in ("prefill", "decode"):
        await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-{role}-{new}"), what=f"{role} of the new pair")
        await kube.simulate_statefulset(NAMESPACE, f"llama-{role}-{new}", ip_prefix="10.2")
    await settle(driver)
    st = await wait_status(driver, "llama", lambda s: condition(s, "Progressing")["reason"] == "RollingOut",
                           "waiting for the router")
    assert st["revision"] == old, "switched while a router pod of the old template runs"
    await kube.simulate_deployment(NAMESPACE, "llama-router")
    await wait_status(driver, "llama", lambda s: s["revision"] == new, "the switch, once the router rolled out")
