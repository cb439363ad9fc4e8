"""Plan table tests for multi-node roles, gang scheduling, placement and the fabric preflight.

Every LeaderWorkerSet and PodGroup is validated against its project's own CRD schema (vendored
under tests/crds, see its README); every built-in object, and every pod template embedded in a
LeaderWorkerSet, against kubernetes-validate strict for 1.30 and 1.33."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest


import third_party_crds  # noqa: E402
from pdfleet.operator.plan import PlanOptions, plan, revision_of  # noqa: E402
from pdfleet.operator.api import parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "big", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def cr(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "prefill": {"replicas": 2, "tensorParallelSize": 8},
        "decode": {"replicas": 2, "tensorParallelSize": 16, "nodesPerReplica": 2},
        "network": {"rdma": {"resourceName": "rdma/ib", "devices": ["mlx5_0:1"]}, "ucxTransports": ["rc", "cuda_copy"]},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) and key in ("prefill", "decode") else value
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
            "metadata": {"name": "big", "namespace": "ml"}, "spec": copy.deepcopy(base)}


def kinds(objs: list[dict[str, Any]], kind: str, role: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (role is None or o["metadata"]["labels"].get("pdfleet.io/role") == role)]


def templates(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    t = lws["spec"]["leaderWorkerTemplate"]
    return t["leaderTemplate"], t["workerTemplate"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# case, spec changes, decode LWS count, LWS replicas each, PodGroup (apiVersion or None)
GANG_TABLE = [
    ("no-gang", {}, 1, 2, None),
    ("kueue", {"scheduling": {"gang": {"provider": "kueue"}, "queueName": "gpu-team-a"}}, 2, 1, None),
    ("volcano", {"scheduling": {"gang": {"provider": "volcano"}, "queueName": "research"}}, 2, 1,
     "scheduling.volcano.sh/v1beta1"),
    ("coscheduling", {"scheduling": {"gang": {"provider": "coscheduling"}}}, 2, 1, "scheduling.x-k8s.io/v1alpha1"),
]


@pytest.mark.parametrize("case,change,count,replicas,pg_api", GANG_TABLE, ids=[g[0] for g in GANG_TABLE])
def test_multi_node_role_is_a_leaderworkerset(case, change, count, replicas, pg_api) -> None:
    objs = plan(cr(**change))
    assert len(kinds(objs, "StatefulSet", "decode")) == 0 and len(kinds(objs, "StatefulSet", "prefill")) == 1
    lwss = kinds(objs, "LeaderWorkerSet", "decode")
    assert len(lwss) == count
    for lws in lwss:
        assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        assert lws["spec"]["replicas"] == replicas
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert lws["spec"]["startupPolicy"] == "LeaderCreated"
        leader, worker = templates(lws)
        for t in (leader, worker):
            c = t["spec"]["containers"][0]
            assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "rdma/ib": 1}, "TP 16 over 2 nodes: 8 GPUs a pod"
            assert flag(c["args"], "--tensor-parallel-size") == "16"
            assert flag(c["args"], "--nnodes") == "2" and flag(c["args"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        lc, wc = leader["spec"]["containers"][0], worker["spec"]["containers"][0]
        assert lc["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        assert flag(lc["args"], "--node-rank") == "0" and "--headless" not in lc["args"]
        assert wc["command"] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]
        assert "--headless" in wc["args"] and flag(wc["args"], "--node-rank") == "$(LWS_WORKER_INDEX)"
        assert "readinessProbe" in lc and "readinessProbe" not in wc
        assert [p["containerPort"] for p in lc["ports"] if p["name"].startswith("nixl-side")] == list(range(5600, 5608))
        assert [p["containerPort"] for p in wc["ports"]] == list(range(5608, 5616))
    pgs = kinds(objs, "PodGroup", "decode")
    if pg_api is None:
        assert pgs == []
    else:
        assert [p["apiVersion"] for p in pgs] == [pg_api] * count
        assert [p["spec"]["minMember"] for p in pgs] == [2] * count
        assert sorted(p["metadata"]["name"] for p in pgs) == sorted(l["metadata"]["name"] for l in lwss)


def test_gang_metadata_names_each_replicas_group() -> None:
    objs = plan(cr(scheduling={"gang": {"provider": "volcano"}, "queueName": "research"}))
    for lws in kinds(objs, "LeaderWorkerSet"):
        for t in templates(lws):
            assert t["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == lws["metadata"]["name"]
            assert t["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "research"
            assert t["spec"]["schedulerName"] == "volcano"
    (pg, *_) = kinds(objs, "PodGroup")
    assert pg["spec"]["queue"] == "research"
    # single-node prefill: no group, still the volcano scheduler
    (prefill,) = kinds(objs, "StatefulSet", "prefill")
    assert prefill["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    assert "scheduling.k8s.io/group-name" not in prefill["spec"]["template"]["metadata"].get("annotations", {})

    objs = plan(cr(scheduling={"gang": {"provider": "kueue"}, "queueName": "gpu-team-a"}))
    for lws in kinds(objs, "LeaderWorkerSet"):
        assert lws["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team-a"
        for t in templates(lws):
            assert t["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team-a"
            assert t["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == lws["metadata"]["name"]
            assert t["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    (prefill,) = kinds(objs, "StatefulSet", "prefill")
    assert prefill["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team-a"
    assert "kueue.x-k8s.io/pod-group-name" not in prefill["spec"]["template"]["metadata"]["labels"]

    objs = plan(cr(scheduling={"gang": {"provider": "coscheduling"}}))
    for lws in kinds(objs, "LeaderWorkerSet"):
        for t in templates(lws):
            assert t["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == lws["metadata"]["name"]
            assert "schedulerName" not in t["spec"]


def test_headless_service_selects_leaders_only() -> None:
    objs = plan(cr())
    (svc,) = [s for s in kinds(objs, "Service", "decode")]
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in svc["spec"]["ports"] if p["name"].startswith("nixl-side")] == list(range(5600, 5608))
    (psvc,) = kinds(objs, "Service", "prefill")
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in psvc["spec"]["selector"]


# mode, decode affinity key expected
PLACEMENT = [
    ({}, None),
    ({"topologyKey": "nvidia.com/gpu.clique", "mode": "preferred"}, "preferredDuringSchedulingIgnoredDuringExecution"),
    ({"topologyKey": "nvidia.com/gpu.clique", "mode": "required"}, "requiredDuringSchedulingIgnoredDuringExecution"),
]


@pytest.mark.parametrize("placement,rule", PLACEMENT, ids=["none", "preferred", "required"])
def test_placement_puts_decode_beside_prefill(placement, rule) -> None:
    objs = plan(cr(placement=placement, decode={"nodesPerReplica": 1}))
    decode = kinds(objs, "StatefulSet", "decode")[0]["spec"]["template"]["spec"]
    prefill = kinds(objs, "StatefulSet", "prefill")[0]["spec"]["template"]["spec"]
    assert "affinity" not in prefill, "prefill is placed first; decode follows it"
    if rule is None:
        assert "affinity" not in decode and "topologySpreadConstraints" not in decode
        return
    (term,) = decode["affinity"]["podAffinity"][rule]
    term = term.get("podAffinityTerm", term)
    assert term == {"labelSelector": {"matchLabels": {"pdfleet.io/fleet": "big", "pdfleet.io/role": "prefill"}},
                    "topologyKey": "nvidia.com/gpu.clique"}
    for pod, role in ((decode, "decode"), (prefill, "prefill")):
        (spread,) = pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
        assert spread["labelSelector"]["matchLabels"]["pdfleet.io/role"] == role


def test_placement_keeps_the_roles_own_affinity() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}}
    objs = plan(cr(placement={"topologyKey": "rack"}, decode={"affinity": own}))
    for t in templates(kinds(objs, "LeaderWorkerSet", "decode")[0]):
        aff = t["spec"]["affinity"]
        assert aff["nodeAffinity"] == own["nodeAffinity"] and "podAffinity" in aff


@pytest.mark.parametrize("network,want", [
    ({"rdma": {"resourceName": "rdma/ib"}}, "rdma"),
    ({"ucxTransports": ["rc", "cuda_copy"]}, "rdma"),
    ({"ucxTransports": ["^rc"]}, "any"),
    ({"ucxTransports": ["tcp"]}, "any"),
    ({}, "any"),
])
def test_preflight_init_container_checks_what_was_asked(network, want) -> None:
    objs = plan(cr(network={**network, "preflight": {"minGBps": 10}}, decode={"nodesPerReplica": 1}))
    for role in ("prefill", "decode"):
        pod = kinds(objs, "StatefulSet", role)[0]["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["name"] == "kv-preflight" and init["command"] == ["python3", "-m", "pdfleet.connector.fabric"]
        assert flag(init["args"], "--want") == want and flag(init["args"], "--min-gbps") == "10"
        engine = pod["containers"][0]
        assert init["resources"] == engine.get("resources", init.get("resources"))
        env = {e["name"]: e.get("value") for e in init.get("env", [])}
        assert env == {k: v for k, v in {e["name"]: e.get("value") for e in engine["env"]}.items() if k.startswith("UCX_")}
        assert {"name": "PDFLEET_KV_TRANSPORT_FILE", "value": "/run/pdfleet/kv-transport.json"} in engine["env"]


def test_preflight_can_be_switched_off() -> None:
    objs = plan(cr(network={"preflight": {"enabled": False}}))
    for lws in kinds(objs, "LeaderWorkerSet"):
        for t in templates(lws):
            assert "initContainers" not in t["spec"]
    assert "initContainers" not in kinds(objs, "StatefulSet")[0]["spec"]["template"]["spec"]


def test_nodes_per_replica_changes_the_revision_but_placement_and_gang_do_not() -> None:
    base = revision_of(parse(cr()))
    assert revision_of(parse(cr(decode={"nodesPerReplica": 4}))) != base
    assert revision_of(parse(cr(placement={"topologyKey": "rack"}))) == base
    assert revision_of(parse(cr(scheduling={"gang": {"provider": "volcano"}}))) == base
    # single-node fleets keep the revisions they had before nodesPerReplica existed
    single = cr(decode={"nodesPerReplica": 1})
    assert revision_of(parse(single)) == revision_of(parse({**single, "spec": {
        k: ({kk: vv for kk, vv in v.items() if kk != "nodesPerReplica"} if k == "decode" else v)
        for k, v in single["spec"].items()}}))


ALL_CASES = [
    cr(),
    cr(scheduling={"gang": {"provider": "kueue"}, "queueName": "gpu-team-a"}, placement={"topologyKey": "zone"}),
    cr(scheduling={"gang": {"provider": "volcano"}, "queueName": "research"},
       placement={"topologyKey": "nvidia.com/gpu.clique", "mode": "required"}),
    cr(scheduling={"gang": {"provider": "coscheduling"}}, prefill={"nodesPerReplica": 2}),
    cr(network={"preflight": {"enabled": False}}, decode={"nodesPerReplica": 4}),
]
BUILTIN = {"Service", "StatefulSet", "Deployment", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
           "PodDisruptionBudget", "NetworkPolicy"}


@pytest.mark.parametrize("case", range(len(ALL_CASES)))
def test_third_party_objects_validate_against_their_own_crds(case: int) -> None:
    objs = plan(ALL_CASES[case], PlanOptions(owner=OWNER))
    third = [o for o in objs if o["kind"] not in BUILTIN]
    assert third, "every case renders at least one LeaderWorkerSet"
    for obj in third:
        assert third_party_crds.errors(obj) == [], (obj["kind"], obj["metadata"]["name"])


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
@pytest.mark.parametrize("case", range(len(ALL_CASES)))
def test_builtins_and_embedded_pod_templates_validate_strictly(case: int, version: str) -> None:
    for obj in plan(ALL_CASES[case], PlanOptions(owner=OWNER)):
        if obj["kind"] in BUILTIN:
            kubernetes_validate.validate(obj, version, strict=True)
        elif obj["kind"] == "LeaderWorkerSet":
            for t in templates(obj):
                kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                              "metadata": {"name": "t"}, "template": t}, version, strict=True)


def test_crd_validation_catches_bad_objects() -> None:
    """Negative controls: the CRD validators used above refuse broken objects."""
    objs = plan(cr(scheduling={"gang": {"provider": "volcano"}}))
    lws = copy.deepcopy(kinds(objs, "LeaderWorkerSet")[0])
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    assert any("sise" in e for e in third_party_crds.errors(lws))
    lws = copy.deepcopy(kinds(objs, "LeaderWorkerSet")[0])
    lws["spec"]["startupPolicy"] = "Whenever"
    assert third_party_crds.errors(lws)
    pg = copy.deepcopy(kinds(objs, "PodGroup")[0])
    pg["spec"]["minMember"] = "two"
    assert third_party_crds.errors(pg)
    t = copy.deepcopy(templates(kinds(objs, "LeaderWorkerSet")[0])[1])
    t["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": t}, "1.33.0", strict=True)
