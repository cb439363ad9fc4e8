"""The engines answer only the fleet (issue 30): the plan gives every engine vLLM's API key
(VLLM_API_KEY, vLLM's --api-key) from the fleet's generated Secret through secretKeyRef, never as a
literal or an argument; the router (and the EPP) get the same Secret's token to send; no other pod
template names that Secret; a spec cannot set or override the key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdfleet.contract.env import ENGINE_API_KEY, VLLM_API_KEY
from pdfleet.operator.api import errors_of
from pdfleet.operator.plan import plan
from pdfleet.operator.plan.auth import API_TOKEN_KEY, api_secret_name

REF = {"secretKeyRef": {"name": "t-engine-api", "key": API_TOKEN_KEY}}


def resource(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u-1"},
            "spec": {"model": {"name": "m"}, **spec}}


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    out = []
    for t in [spec.get("template"), *((spec.get("leaderWorkerTemplate") or {}).get(k) for k in
                                      ("leaderTemplate", "workerTemplate"))]:
        pod = (t or {}).get("spec") or {}
        out += [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]
    return out


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in c.get("env") or []}


@pytest.mark.parametrize("spec", [
    {},
    {"decode": {"nodesPerReplica": 2, "tensorParallelSize": 2}},   # a LeaderWorkerSet
    {"gateway": {"inferencePool": {"enabled": True, "allowFrom": [{"namespaceSelector": {}}]}}},  # the EPP too
])
def test_only_engines_router_and_epp_get_the_token_from_the_secret(spec: dict[str, Any]) -> None:
    assert api_secret_name("t") == REF["secretKeyRef"]["name"]
    objs = plan(resource(**spec))
    holders = []
    for obj in objs:
        for c in containers(obj):
            env = env_of(c)
            if VLLM_API_KEY in env:
                assert env[VLLM_API_KEY] == REF, "from the Secret, never a literal"
                holders.append(("engine", c["name"]))
            if ENGINE_API_KEY in env:
                assert env[ENGINE_API_KEY] == REF
                holders.append((obj["metadata"]["name"], c["name"]))
            assert "--api-key" not in " ".join(c.get("args") or []) + " ".join(c.get("command") or [])
    engines = [o for o in objs if o["kind"] in ("StatefulSet", "LeaderWorkerSet")]
    assert sum(1 for h in holders if h[0] == "engine") >= len(engines) == 2
    clients = sorted(h[0] for h in holders if h[0] != "engine")
    assert clients == sorted(["t-router"] + (["t-epp"] if spec.get("gateway") else []))
    # negative control: nothing else (the fabric preflight, ConfigMaps, Services...) names the Secret
    for obj in objs:
        if obj["kind"] not in ("StatefulSet", "LeaderWorkerSet", "Deployment"):
            assert "t-engine-api" not in json.dumps(obj), obj["kind"]
        for c in containers(obj):
            if VLLM_API_KEY not in env_of(c) and ENGINE_API_KEY not in env_of(c):
                assert "t-engine-api" not in json.dumps(c), c["name"]


def test_a_spec_cannot_set_or_override_the_key() -> None:
    env_case = resource(engine={"env": [{"name": VLLM_API_KEY, "value": "guessable"}]})
    assert [e.field for e in errors_of(env_case)] == ["spec.engine.env[0].name"]
    flag_case = resource(decode={"extraArgs": ["--api-key=guessable"]})
    assert [e.field for e in errors_of(flag_case)] == ["spec.decode.extraArgs[0]"]
    # past validation, the plan still renders only the Secret's key
    from pdfleet.operator.api import DisaggregatedInference
    objs = plan(DisaggregatedInference.model_validate(env_case, strict=True))
    for obj in objs:
        for c in containers(obj):
            assert "guessable" not in json.dumps(c)
