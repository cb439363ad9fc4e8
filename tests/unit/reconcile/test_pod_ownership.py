"""Which pods count for a fleet (issue 30): the controller chain up to the fleet's own workloads,
with the workload's revision or template hash; labels alone count for nothing (pure table)."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from pdfleet.operator.kube.observed import observe_child, observe_pod, observe_replicaset
from pdfleet.operator.kube.owned import fleet_workloads, owned_pods, pod_problem

FLEET_UID = "fleet-uid"
LABELS = {"pdfleet.io/fleet": "llama", "pdfleet.io/role": "prefill", "pdfleet.io/revision": "r1"}


def ref(kind: str, name: str, uid: str, controller: bool = True, api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller}


def workload(kind: str, name: str, uid: str, owner: str = FLEET_UID, replicas: int = 2,
             status: Optional[dict] = None, controller: bool = True) -> dict[str, Any]:
    api_version = "leaderworkerset.x-k8s.io/v1" if kind == "LeaderWorkerSet" else "apps/v1"
    spec = {"replicas": replicas, **({"leaderWorkerTemplate": {}} if kind == "LeaderWorkerSet" else {"template": {}})}
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": LABELS,
                         "ownerReferences": [ref("DisaggregatedInference", "llama", owner, controller,
                                                 "pdfleet.io/v1alpha1")]},
            "spec": spec, "status": status or {}}


CHILDREN = [observe_child(o) for o in (
    workload("StatefulSet", "llama-prefill-r1", "sts-uid", status={"currentRevision": "llama-prefill-r1-aaa",
                                                                    "updateRevision": "llama-prefill-r1-bbb"}),
    workload("StatefulSet", "llama-decode-r1", "sts2-uid"),              # no revisions reported yet
    workload("StatefulSet", "other-prefill", "sts3-uid", owner="someone-else"),
    workload("StatefulSet", "weak-prefill", "sts4-uid", controller=False),   # owner, but not controller
    workload("Deployment", "llama-router", "dep-uid"),
    workload("Deployment", "other-router", "dep2-uid", owner="someone-else"),
    workload("LeaderWorkerSet", "llama-decode-r2", "lws-uid"),
)]
REPLICASETS = [observe_replicaset({"metadata": {"name": n, "namespace": "ns", "uid": u, "labels": {
    **LABELS, "pod-template-hash": h}, "ownerReferences": [ref("Deployment", d, du)]}})
    for n, u, h, d, du in (("llama-router-5d9c", "rs-uid", "5d9c", "llama-router", "dep-uid"),
                           ("other-router-77aa", "rs2-uid", "77aa", "other-router", "dep2-uid"))]
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def lws_sts(name: str, uid: str, controller: dict, replicas: int) -> dict[str, Any]:
    """A StatefulSet as the LWS controller makes it: its own label only, no pdfleet label."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {LWS_NAME: "llama-decode-r2"},
                         "ownerReferences": [controller]},
            "spec": {"replicas": replicas, "template": {}}, "status": {}}


LWS_STATEFULSETS = [observe_child(o) for o in (
    lws_sts("llama-decode-r2", "leader-sts-uid",
            ref("LeaderWorkerSet", "llama-decode-r2", "lws-uid", api_version="leaderworkerset.x-k8s.io/v1"), 2),
    lws_sts("llama-decode-r2-0", "worker-sts-uid", ref("Pod", "llama-decode-r2-0", "llama-decode-r2-0-uid", api_version="v1"), 1),
    # made by hand in the namespace, wearing the LWS's label: controlled by a pod that is no leader
    lws_sts("llama-decode-r2-5", "evil-sts-uid", ref("Pod", "evil-0", "evil-0-uid", api_version="v1"), 3),
    # a second "leader" StatefulSet of the LWS's name, controlled by somebody else
    lws_sts("llama-decode-r2", "evil-leader-sts-uid", ref("LeaderWorkerSet", "llama-decode-r2", "forged-lws-uid",
                                                          api_version="leaderworkerset.x-k8s.io/v1"), 2),
)]
FLEET = fleet_workloads(FLEET_UID, CHILDREN, REPLICASETS, LWS_STATEFULSETS)
LEADERS = {"llama-decode-r2-0-uid": "llama-decode-r2-0"}   # the lws-leader row's pod, which counts


def pod(name: str, owner: Optional[dict] = None, **labels: str):
    meta = {"name": name, "namespace": "ns", "uid": f"{name}-uid", "labels": {**LABELS, **labels}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return observe_pod({"metadata": meta, "status": {"phase": "Running", "podIP": "10.0.0.1",
                                                     "conditions": [{"type": "Ready", "status": "True"}]}})


STS = ref("StatefulSet", "llama-prefill-r1", "sts-uid")
RS = ref("ReplicaSet", "llama-router-5d9c", "rs-uid")
LWS_LEADER = ref("StatefulSet", "llama-decode-r2", "leader-sts-uid")
LWS_WORKER = ref("StatefulSet", "llama-decode-r2-0", "worker-sts-uid")
LWS_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
CRH, PTH = "controller-revision-hash", "pod-template-hash"
CASES = [
    # (case, pod, counts?, a word of the reason)
    ("sts-pod-current-revision", pod("llama-prefill-r1-0", STS, **{CRH: "llama-prefill-r1-aaa"}), True, None),
    ("sts-pod-update-revision", pod("llama-prefill-r1-1", STS, **{CRH: "llama-prefill-r1-bbb"}), True, None),
    ("sts-no-revisions-reported", pod("llama-decode-r1-0", ref("StatefulSet", "llama-decode-r1", "sts2-uid")),
     True, None),
    ("router-pod-of-fleet-rs", pod("llama-router-5d9c-x1", RS, **{PTH: "5d9c"}), True, None),
    ("lws-leader", pod("llama-decode-r2-0", LWS_LEADER, **{LWS_NAME: "llama-decode-r2"}), True, None),
    ("lws-worker", pod("llama-decode-r2-0-1", LWS_WORKER, **{LWS_NAME: "llama-decode-r2", LWS_INDEX: "1"}),
     True, None),
    # LWS pods made by hand: the names are right, the chain is not
    ("lws-leader-forged-sts-uid", pod("llama-decode-r2-1", {**LWS_LEADER, "uid": "forged"},
                                      **{LWS_NAME: "llama-decode-r2"}), False, "is not one"),
    ("lws-leader-sts-of-another-lws-uid", pod("llama-decode-r2-1", {**LWS_LEADER, "uid": "evil-leader-sts-uid"},
                                              **{LWS_NAME: "llama-decode-r2"}), False, "neither"),
    ("lws-leader-group-out-of-range", pod("llama-decode-r2-2", LWS_LEADER, **{LWS_NAME: "llama-decode-r2"}),
     False, "not a leader"),
    ("lws-worker-of-hand-made-sts", pod("llama-decode-r2-5-1", ref("StatefulSet", "llama-decode-r2-5", "evil-sts-uid"),
                                        **{LWS_NAME: "llama-decode-r2", LWS_INDEX: "1"}), False, "neither"),
    ("lws-worker-ordinal-0", pod("llama-decode-r2-0-0", LWS_WORKER, **{LWS_NAME: "llama-decode-r2", LWS_INDEX: "1"}),
     False, "not a worker"),
    ("lws-worker-ordinal-beyond-size", pod("llama-decode-r2-0-2", LWS_WORKER,
                                           **{LWS_NAME: "llama-decode-r2", LWS_INDEX: "2"}), False, "not a worker"),
    # hand-made pods with the fleet's labels
    ("no-owner", pod("llama-router-fake"), False, "no controller"),
    ("owner-not-controller", pod("llama-prefill-r1-0", {**STS, "controller": False}), False, "no controller"),
    ("made-up-sts-uid", pod("llama-prefill-r1-0", {**STS, "uid": "forged"}), False, "not the fleet's"),
    ("other-fleets-sts", pod("other-prefill-0", ref("StatefulSet", "other-prefill", "sts3-uid")), False,
     "not the fleet's"),
    ("sts-owner-not-controller-of-fleet", pod("weak-prefill-0", ref("StatefulSet", "weak-prefill", "sts4-uid")),
     False, "not the fleet's"),
    ("uid-copied-name-differs", pod("llama-prefill-rX-0", {**STS, "name": "llama-prefill-rX"}), False,
     "with the uid of"),
    ("ordinal-out-of-range", pod("llama-prefill-r1-7", STS, **{CRH: "llama-prefill-r1-aaa"}), False,
     "not a pod"),
    ("not-an-ordinal", pod("llama-prefill-r1-evil", STS, **{CRH: "llama-prefill-r1-aaa"}), False, "not a pod"),
    ("leading-zero-ordinal", pod("llama-prefill-r1-01", STS, **{CRH: "llama-prefill-r1-aaa"}), False, "not a pod"),
    ("stale-revision-hash", pod("llama-prefill-r1-0", STS, **{CRH: "llama-prefill-r1-old"}), False, "revision"),
    ("no-revision-hash", pod("llama-prefill-r1-0", STS), False, "revision"),
    ("rs-template-hash-differs", pod("llama-router-5d9c-x1", RS, **{PTH: "0000"}), False, "pod-template-hash"),
    ("rs-of-another-deployment", pod("other-router-77aa-x", ref("ReplicaSet", "other-router-77aa", "rs2-uid"),
                                     **{PTH: "77aa"}), False, "not the fleet's"),
    ("made-up-rs", pod("llama-router-abc-x", ref("ReplicaSet", "llama-router-abc", "rs-forged"), **{PTH: "abc"}),
     False, "not the fleet's"),
    ("lws-label-of-unknown-lws", pod("x-0", ref("StatefulSet", "x", "u"), **{"leaderworkerset.sigs.k8s.io/name": "x"}),
     False, "not the fleet's"),
    ("lws-label-sts-of-another-name", pod("evil-0", ref("StatefulSet", "evil", "u"),
                                          **{"leaderworkerset.sigs.k8s.io/name": "llama-decode-r2"}), False,
     "is not one"),
]


@pytest.mark.parametrize("case,p,counts,why", CASES, ids=[c[0] for c in CASES])
def test_pod_problem(case: str, p, counts: bool, why: Optional[str]) -> None:
    problem = pod_problem(p, FLEET, LEADERS)
    assert (problem is None) == counts, f"{case}: {problem}"
    if why:
        assert why in problem


def test_owned_pods_splits_in_order_and_an_empty_fleet_owns_nothing() -> None:
    pods = [c[1] for c in CASES]
    kept, ignored = owned_pods(pods, FLEET)
    assert [p.name for p in kept] == [c[1].name for c in CASES if c[2]]
    assert len(ignored) == sum(1 for c in CASES if not c[2])
    # negative control: with no fleet uid (or another fleet's) nothing counts, whatever the labels
    assert owned_pods(pods, fleet_workloads("", CHILDREN, REPLICASETS))[0] == []
    assert owned_pods(pods, fleet_workloads("someone-else", CHILDREN, REPLICASETS))[0][0].name == "other-prefill-0"


def test_lws_worker_counts_only_through_a_leader_that_counts() -> None:
    worker = pod("llama-decode-r2-0-1", LWS_WORKER, **{LWS_NAME: "llama-decode-r2", LWS_INDEX: "1"})
    leader = pod("llama-decode-r2-0", LWS_LEADER, **{LWS_NAME: "llama-decode-r2"})
    assert [p.name for p in owned_pods([worker, leader], FLEET)[0]] == ["llama-decode-r2-0-1", "llama-decode-r2-0"]
    # negative controls: without its leader pod, or without the listed StatefulSets, nothing counts
    assert owned_pods([worker], FLEET)[0] == []
    assert owned_pods([worker, leader], fleet_workloads(FLEET_UID, CHILDREN, REPLICASETS))[0] == []
