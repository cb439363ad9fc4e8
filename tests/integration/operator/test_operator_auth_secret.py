"""Secure by default, end to end in kopf's real loop: the fleet's side-channel key Secret is created
once, kept across reconciles and an operator restart, mounted by the engines, and its key appears
nowhere else (status, events, other children, the rendered plan, the operator's logs)."""

from __future__ import annotations

import base64
import json
import logging

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import eventually
from operator_scenarios import CR_RESOURCE, DEPLOY, STS, condition, fleet, scenario_create, settle, wait_status

from pdfleet.operator.plan import plan

pytestmark = pytest.mark.timeout(60)
SECRETS = "v1/secrets"


def secret_creates(kube, since: int = 0) -> list:
    return [c for c in kube.operator_calls(since) if c.resource == "secrets"]


async def test_generated_key_secret_created_once_kept_and_never_leaked(kube, start_operator, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, kopf's included
    d = FakeDriver(kube)
    d.operator = await start_operator()
    cr = await scenario_create(d)
    secret = await eventually(lambda: kube.get(SECRETS, NAMESPACE, "llama-kv-auth"), what="the key Secret")
    key = base64.b64decode(secret["data"]["key"]).decode()
    assert len(key) == 64 and int(key, 16) >= 0  # 32 random bytes, hex
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "DisaggregatedInference", "llama", cr["metadata"]["uid"], True)
    version = secret["metadata"]["resourceVersion"]
    for sts in kube.list(STS, NAMESPACE):
        vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert vols["side-channel-secret"]["secret"]["secretName"] == "llama-kv-auth"

    # More reconciles (spec and metadata changes) leave the Secret alone: no further create.
    runs = d.operator_runs()
    await d.patch_cr("llama", {"spec": {"decode": {"replicas": 2}}})
    await d.patch_cr("llama", {"metadata": {"annotations": {"touched": "yes"}}})
    await eventually(lambda: d.operator_runs() >= runs + 2, what="two more reconciles")
    await settle(d)
    assert len(secret_creates(kube)) == 2  # this key and the engines' API token (issue 30)

    # An operator restart tries once, gets 409 AlreadyExists, and keeps the key.
    await d.operator.astop()
    mark = len(kube.calls)
    d.operator = await start_operator()
    await eventually(lambda: secret_creates(kube, mark), what="the restarted operator's check")
    await settle(d)
    again = kube.get(SECRETS, NAMESPACE, "llama-kv-auth")
    assert again["data"] == secret["data"] and again["metadata"]["resourceVersion"] == version
    # 409, then a metadata-only read of its owner: ours (never patched or listed); the same for the API token
    assert [(c.verb, c.status) for c in secret_creates(kube, mark)] == [("create", 409), ("get", 200)] * 2
    assert [c.verb for c in secret_creates(kube)] == ["create", "create"] + ["create", "get"] * 2

    # The key is nowhere but in the Secret.
    haystacks = {
        "status and metadata of the CR": json.dumps(kube.get(CR_RESOURCE, NAMESPACE, "llama")),
        "events": json.dumps(kube.list("v1/events", NAMESPACE)),
        "every other object": json.dumps([o for res in ("apps/v1/statefulsets", "apps/v1/deployments",
                                                        "v1/configmaps", "v1/services")
                                          for o in kube.list(res, NAMESPACE)]),
        "the rendered plan": json.dumps(plan(fleet())),
        "logs": "\n".join(r.getMessage() for r in caplog.records),
    }
    b64 = secret["data"]["key"]
    for where, text in haystacks.items():
        assert key not in text and b64 not in text, f"the key leaked into {where}"
    # Negative control: the same search finds the key where it is.
    assert key in base64.b64decode(json.dumps(again).split('"key": "')[1].split('"')[0]).decode()


async def test_user_secret_ref_is_mounted_and_no_secret_is_generated(driver: FakeDriver, kube):
    # the user's Secret exists first: the operator writes no engine while a Secret the spec names is missing
    await kube.put(SECRETS, NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "my-key"},
                                        "data": {"k": base64.b64encode(b"1" * 32).decode()}})
    await driver.create_cr(fleet("own", kvTransfer={"authSecretRef": {"name": "my-key", "key": "k"}}))
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the StatefulSets")
    await settle(driver)
    for sts in kube.list(STS, NAMESPACE):
        vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert vols["side-channel-secret"]["secret"] == {
            "secretName": "my-key", "items": [{"key": "k", "path": "side-channel-secret"}], "defaultMode": 0o400}
    assert kube.get(SECRETS, NAMESPACE, "own-kv-auth") is None
    # only the engines' API token is generated (issue 30)
    assert [s["metadata"]["name"] for s in kube.list(SECRETS, NAMESPACE)] == ["my-key", "own-engine-api"]
    assert [c.verb for c in secret_creates(kube)] == ["create", "get"]  # the token made; the user's key checked


async def test_two_fleets_get_different_keys(driver: FakeDriver, kube):
    await driver.create_cr(fleet("a"))
    await driver.create_cr(fleet("b"))
    a = await eventually(lambda: kube.get(SECRETS, NAMESPACE, "a-kv-auth"), what="a's Secret")
    b = await eventually(lambda: kube.get(SECRETS, NAMESPACE, "b-kv-auth"), what="b's Secret")
    assert a["data"]["key"] != b["data"]["key"]


async def test_squatted_key_secret_is_never_used(driver: FakeDriver, kube):
    """Issue 20 row 2: a Secret of the generated name made by someone else before the fleet (who then
    knows the key) is never used: no engine is written, the fleet is not Ready (NotOwned) and says what
    to do; once it is deleted the operator makes its own and the engines come up with it."""
    squat = await kube.put(SECRETS, NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                                "metadata": {"name": "llama-kv-auth", "namespace": NAMESPACE},
                                                "data": {"key": base64.b64encode(b"0" * 64).decode()}})
    await driver.create_cr(fleet())
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == "NotOwned",
                           "Ready=False NotOwned")
    message = condition(st, "Ready")["message"]
    assert "Secret/llama-kv-auth" in message and "spec.kvTransfer.authSecretRef" in message, message
    assert condition(st, "Ready")["status"] == "False" and condition(st, "Degraded")["reason"] == "NotOwned"
    events = await eventually(lambda: [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == "NotOwned"],
                              what="a NotOwned event")
    assert "Secret/llama-kv-auth" in events[0]["message"] and events[0]["type"] == "Warning"
    await settle(driver)
    assert kube.list(STS, NAMESPACE) == []  # no engine mounts the squatter's key
    assert kube.get(SECRETS, NAMESPACE, "llama-kv-auth") == squat  # and it is left as it is
    assert all(c.verb in ("create", "get") for c in secret_creates(kube))

    await kube.remove(SECRETS, NAMESPACE, "llama-kv-auth")
    ours = await eventually(lambda: kube.get(SECRETS, NAMESPACE, "llama-kv-auth"), timeout=20, what="our Secret")
    assert ours["metadata"]["ownerReferences"][0]["name"] == "llama" and ours["data"] != squat["data"]
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, timeout=20, what="the engines")


async def test_engine_api_token_is_generated_mounted_by_reference_and_a_squatted_one_is_never_used(driver, kube):
    """Issue 30: the engines' API token Secret is generated once per fleet and owned by it; the engines
    (VLLM_API_KEY) and the router (PDFLEET_ENGINE_API_KEY) take it through secretKeyRef. One of that name
    made by someone else (who knows the token) stops every workload, as the side-channel key does."""
    squat = await kube.put(SECRETS, NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                                "metadata": {"name": "llama-engine-api", "namespace": NAMESPACE},
                                                "data": {"token": base64.b64encode(b"0" * 64).decode()}})
    await driver.create_cr(fleet())
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == "NotOwned", "NotOwned")
    assert "Secret/llama-engine-api" in condition(st, "Ready")["message"]
    await settle(driver)
    assert kube.list(STS, NAMESPACE) == [] and kube.get(DEPLOY, NAMESPACE, "llama-router") is None
    assert kube.get(SECRETS, NAMESPACE, "llama-engine-api") == squat

    await kube.remove(SECRETS, NAMESPACE, "llama-engine-api")
    ours = await eventually(lambda: kube.get(SECRETS, NAMESPACE, "llama-engine-api"), timeout=20, what="ours")
    token = base64.b64decode(ours["data"]["token"]).decode()
    assert len(token) == 64 and ours["metadata"]["ownerReferences"][0]["name"] == "llama"
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, timeout=20, what="the engines")
    ref = {"secretKeyRef": {"name": "llama-engine-api", "key": "token"}}
    for sts in kube.list(STS, NAMESPACE):
        env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["VLLM_API_KEY"]["valueFrom"] == ref
    router = await eventually(lambda: kube.get(DEPLOY, NAMESPACE, "llama-router"), what="the router")
    env = {e["name"]: e for e in router["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PDFLEET_ENGINE_API_KEY"]["valueFrom"] == ref
    everything = json.dumps([o for res in ("apps/v1/statefulsets", "apps/v1/deployments", "v1/configmaps",
                                           "v1/services", "v1/events") for o in kube.list(res, NAMESPACE)])
    assert token not in everything and token not in json.dumps(kube.get(CR_RESOURCE, NAMESPACE, "llama"))
