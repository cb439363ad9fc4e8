"""Issue 20 row 3, in kopf's real loop: an object of a child's name that the fleet does not own
(a user's own Deployment, a Service carrying the fleet's labels) is never taken over: no write to it,
a NotOwned condition and event naming it; the rest of the fleet is written; once it is gone, the
operator makes its own."""

from __future__ import annotations

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
