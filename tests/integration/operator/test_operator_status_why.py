"""A status that says why (issue 39), in kopf's real loop over FakeKube: pods in each failing state put
their cause in the fleet's Ready condition and one Warning event; the progress deadline makes the fleet
Stalled; a Secret the spec names that is missing holds the workloads and is named. Each with a
negative control."""

from __future__ import annotations

import base64

import pod_states as ps
import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import eventually
from operator_scenarios import CR_RESOURCE, STS, condition, fleet, make_fleet_ready, settle, status_of, wait_status

pytestmark = pytest.mark.timeout(90)
SECRETS = "v1/secrets"
PODS = "v1/pods"


def warnings(kube, reason: str) -> list[dict]:
    return [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == reason and e["type"] == "Warning"]


async def decode_pods(driver: FakeDriver, kube) -> list[dict]:
    """The fleet's StatefulSets' pods as their controller makes them, none ready; the decode ones."""
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the StatefulSets")
    for sts in kube.list(STS, NAMESPACE):
        await kube.simulate_statefulset(NAMESPACE, sts["metadata"]["name"], ready=0)
    return [p for p in kube.list(PODS, NAMESPACE) if p["metadata"]["labels"].get("pdfleet.io/role") == "decode"]


@pytest.mark.parametrize("state", sorted(ps.FAILING))
async def test_a_failing_pod_is_named_in_ready_and_one_warning(driver: FakeDriver, kube, state):
    await driver.create_cr(fleet())
    (pod,) = await decode_pods(driver, kube)
    runs = driver.operator_runs()
    await kube.set_status(PODS, NAMESPACE, pod["metadata"]["name"], ps.FAILING[state]())
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == state, state)
    message = condition(st, "Ready")["message"]
    want = {"Unschedulable": "0/3 nodes are available: 3 Insufficient rdma/ib",
            "ImagePullBackOff": f"image {ps.IMAGE}",
            "CreateContainerConfigError": 'container vllm: secret "hf-token" not found',
            "CrashLoopBackOff": "container vllm exited 1 (Error): Traceback"}[state]
    assert f"decode {state} (1 pod): {want}" in message, message
    assert state != "CrashLoopBackOff" or message.endswith("ValueError: max_model_len 131072 exceeds the KV cache")
    (event,) = await eventually(lambda: warnings(kube, state), what=f"a {state} event")
    assert event["message"].startswith(f"decode pod {pod['metadata']['name']}: {want}"), event["message"]
    assert driver.operator_runs() > runs
    # More reconciles with the same cause: no second event.
    await driver.patch_cr("llama", {"metadata": {"annotations": {"touched": "1"}}})
    await driver.patch_cr("llama", {"spec": {"prefill": {"replicas": 1}, "router": {"replicas": 1}}})
    await eventually(lambda: driver.operator_runs() >= runs + 3, what="more reconciles")
    await settle(driver)
    assert len(warnings(kube, state)) == 1


async def test_negative_controls_a_starting_pod_and_a_lookalike_pod_say_nothing(driver: FakeDriver, kube):
    await driver.create_cr(fleet())
    (pod,) = await decode_pods(driver, kube)
    await kube.set_status(PODS, NAMESPACE, pod["metadata"]["name"], ps.starting())
    # A pod anyone could make with the fleet's labels, failing: not the fleet's, so not its cause.
    fake = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "llama-decode-lookalike", "labels": dict(pod["metadata"]["labels"])},
            "spec": pod["spec"], "status": ps.image_pull_back_off("evil.example/x:1")}
    await kube.put(PODS, NAMESPACE, fake)
    await settle(driver)
    st = await status_of(driver, "llama")
    assert condition(st, "Ready")["reason"] == "Waiting", st
    assert "evil" not in condition(st, "Ready")["message"]
    assert not [e for e in kube.list("v1/events", NAMESPACE) if e["type"] == "Warning"]


async def test_past_the_progress_deadline_the_fleet_is_stalled_until_ready(driver: FakeDriver, kube):
    await driver.create_cr(fleet("slow", progressDeadlineSeconds=1))
    await driver.create_cr(fleet("patient"))  # negative control: the default deadline (1800 s)
    st = await wait_status(driver, "slow", lambda s: condition(s, "Stalled")["status"] == "True", "Stalled",
                           timeout=20)
    stalled = condition(st, "Stalled")
    assert stalled["reason"] == "ProgressDeadlineExceeded" and "spec.progressDeadlineSeconds" in stalled["message"]
    assert condition(st, "Reconciling")["status"] == "False"  # kstatus reads Reconciling before Stalled
    assert st["progressingSince"]
    await eventually(lambda: warnings(kube, "ProgressDeadlineExceeded"), what="the deadline's event")
    patient = await status_of(driver, "patient")
    assert condition(patient, "Stalled")["status"] == "False" and condition(patient, "Reconciling")["status"] == "True"
    # Ready clears it.
    await make_fleet_ready(driver, "slow")
    st = await wait_status(driver, "slow", lambda s: condition(s, "Ready")["reason"] == "Ready", "Ready", timeout=20)
    assert condition(st, "Stalled")["status"] == "False" and "progressingSince" not in st


async def test_a_missing_secret_is_named_and_holds_the_pods_until_it_exists(driver: FakeDriver, kube):
    hf = {"name": "meta-llama/Llama-3.1-8B", "source": {"hf": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}}}
    await driver.create_cr(fleet(model=hf))
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == "SecretMissing",
                           "SecretMissing")
    message = condition(st, "Ready")["message"]
    assert "Secret hf-token (key token, named by spec.model.source.hf.tokenSecretRef) does not exist" in message
    await eventually(lambda: warnings(kube, "SecretMissing"), what="a SecretMissing event")
    assert kube.list(STS, NAMESPACE) == []  # no pod that could not start
    # Negative control: the Secret without the key is still missing, and says so.
    await kube.put(SECRETS, NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"},
                                        "data": {"tokn": base64.b64encode(b"hf_x").decode()}})
    await wait_status(driver, "llama", lambda s: "has no key token" in condition(s, "Ready")["message"],
                      "the missing key", timeout=30)
    assert kube.list(STS, NAMESPACE) == []
    # With the key, the engines come.
    await kube.put(SECRETS, NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"},
                                        "data": {"token": base64.b64encode(b"hf_x").decode()}})
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, timeout=30, what="the engines")
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] != "SecretMissing", "cleared")
    assert "hf_x" not in str(kube.get(CR_RESOURCE, NAMESPACE, "llama")) and "aGZfeA" not in str(
        kube.list("v1/events", NAMESPACE))  # the value is nowhere
