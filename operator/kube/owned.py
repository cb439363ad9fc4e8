"""Whether a pod belongs to a fleet: its controller chain, never its labels (pure).

Anyone who may create a pod in the namespace can copy the fleet's labels; a decision (rollout
readiness and the paired switch, the canary's and the planner's scrape of router pods, the router's
endpoints in status) counts a pod only when the fleet's own workloads run it:

- a StatefulSet pod: its controller ownerReference names, by uid, a StatefulSet the fleet controls
  (controller ownerReference to the fleet's uid); its name is ``<statefulset>-<ordinal>`` with the
  ordinal below the StatefulSet's replicas; and its ``controller-revision-hash`` is the
  StatefulSet's current or update revision (when the StatefulSet reports them);
- a Deployment pod (the router): its controller is, by uid, a ReplicaSet whose controller is, by
  uid, a Deployment the fleet controls, and its ``pod-template-hash`` is that ReplicaSet's;
- a LeaderWorkerSet pod: its ``leaderworkerset.sigs.k8s.io/name`` names an LWS the fleet controls,
  and its controller is, by uid, one of that LWS's StatefulSets as the LWS controller makes them:
  a leader's is ``<lws>``, controlled by the LWS (by uid), with the pod's ordinal in range; a
  worker's is ``<lws>-<group>``, controlled by (the uid of) that group's leader pod, which must
  count itself, with the worker's ordinal in ``1..replicas``. Those StatefulSets carry no pdfleet
  label, so the reconcile lists them by the LWS's own label (reconcile/observe step).

Services and EndpointSlices: the operator reads only children whose controller is the fleet (by
uid); the router keeps the same rule for Services and slices in connector/serving/ownership.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from pdfleet.operator.kube.observed import ObservedChild, ObservedPod, ObservedReplicaSet
from pdfleet.operator.plan.kinds import DEPLOYMENT, LWS, REPLICASET, STATEFULSET


@dataclass(frozen=True)
class FleetWorkloads:
    """The workloads a fleet controls (by uid), and the ReplicaSets its Deployments control."""

    statefulsets: Mapping[str, ObservedChild] = field(default_factory=dict)     # uid ->
    replicasets: Mapping[str, ObservedReplicaSet] = field(default_factory=dict)  # uid ->
    leaderworkersets: Mapping[str, ObservedChild] = field(default_factory=dict)  # name ->
    lws_statefulsets: Mapping[str, ObservedChild] = field(default_factory=dict)  # uid -> (made by the LWS controller)


def fleet_workloads(fleet_uid: str, children: Iterable[ObservedChild],
                    replicasets: Iterable[ObservedReplicaSet] = (),
                    lws_statefulsets: Iterable[ObservedChild] = ()) -> FleetWorkloads:
    """From what the watches saw: only objects whose controller is the fleet (by uid); the LWS
    controller's StatefulSets as listed (each is judged per pod, by its own controller)."""
    sts: dict[str, ObservedChild] = {}
    deployments: set[str] = set()
    lws: dict[str, ObservedChild] = {}
    for c in children:
        if not fleet_uid or c.controller_uid != fleet_uid or not c.uid:
            continue
        if (c.ref.api_version, c.ref.kind) == (STATEFULSET.api_version, STATEFULSET.kind):
            sts[c.uid] = c
        elif (c.ref.api_version, c.ref.kind) == (DEPLOYMENT.api_version, DEPLOYMENT.kind):
            deployments.add(c.uid)
        elif (c.ref.api_version, c.ref.kind) == (LWS.api_version, LWS.kind):
            lws[c.ref.name] = c
    rs = {r.uid: r for r in replicasets if r.uid and r.controller_uid in deployments}
    return FleetWorkloads(sts, rs, lws, {s.uid: s for s in lws_statefulsets if s.uid})


def _ordinal(pod_name: str, parent: str) -> Optional[int]:
    prefix = f"{parent}-"
    if not pod_name.startswith(prefix):
        return None
    rest = pod_name[len(prefix):]
    return int(rest) if rest.isdigit() and (rest == "0" or not rest.startswith("0")) else None


def pod_problem(pod: ObservedPod, fleet: FleetWorkloads, leaders: Mapping[str, str] = {}) -> Optional[str]:
    """None when the fleet's workloads run this pod, else why it does not count.

    ``leaders``: uid -> name of the LWS leader pods that count (a worker's chain runs through one)."""
    ref = pod.controller
    if ref is None:
        return "no controller ownerReference"
    kind, name, uid = ref
    if kind == STATEFULSET.kind and uid in fleet.statefulsets:
        sts = fleet.statefulsets[uid]
        if sts.ref.name != name:
            return f"ownerReference names StatefulSet {name} with the uid of {sts.ref.name}"
        return _set_pod_problem(pod, name, sts, f"pod StatefulSet {name}", "replicas")
    if kind == REPLICASET.kind and uid in fleet.replicasets:
        rs = fleet.replicasets[uid]
        if rs.name != name:
            return f"ownerReference names ReplicaSet {name} with the uid of {rs.name}"
        if not rs.template_hash or pod.template_hash != rs.template_hash:
            return f"pod-template-hash {pod.template_hash!r} is not ReplicaSet {name}'s"
        return None
    if kind == STATEFULSET.kind and pod.lws_name and pod.lws_name in fleet.leaderworkersets:
        return _lws_pod_problem(pod, name, uid, fleet, leaders)
    return f"controlled by {kind}/{name} (uid {uid}), which is not the fleet's"


def _set_pod_problem(pod: ObservedPod, name: str, sts: ObservedChild, runner: str, counted: str) -> Optional[str]:
    """A pod StatefulSet ``name`` runs: its ordinal below the set's size (spec or status, the larger)
    and its controller-revision-hash one of the set's revisions."""
    ordinal = _ordinal(pod.name, name)
    if ordinal is None or ordinal >= max(sts.replicas, sts.status_replicas):
        return f"not a {runner} runs (name {pod.name}, {counted} {sts.replicas})"
    if sts.revisions and pod.revision_hash not in sts.revisions:
        return f"controller-revision-hash {pod.revision_hash!r} is not one of {name}'s revisions"
    return None


def _lws_pod_problem(pod: ObservedPod, name: str, uid: str, fleet: FleetWorkloads,
                     leaders: Mapping[str, str]) -> Optional[str]:
    lws = fleet.leaderworkersets[pod.lws_name or ""]
    sts = fleet.lws_statefulsets.get(uid)
    if sts is None:
        return f"StatefulSet {name} (uid {uid}) is not one LeaderWorkerSet {lws.ref.name} runs"
    if sts.ref.name != name:
        return f"ownerReference names StatefulSet {name} with the uid of {sts.ref.name}"
    if sts.controller_uid == lws.uid and name == lws.ref.name:       # the leaders' StatefulSet
        return _set_pod_problem(pod, name, sts, f"leader LeaderWorkerSet {name}", "groups")
    if leaders.get(sts.controller_uid) == name:                      # a group's workers' StatefulSet
        ordinal = _ordinal(pod.name, name)                           # LWS numbers workers from 1
        if ordinal is None or not 1 <= ordinal <= max(sts.replicas, sts.status_replicas):
            return f"not a worker of group {name} (name {pod.name}, workers {sts.replicas})"
        return None
    return f"StatefulSet {name} is controlled by neither LeaderWorkerSet {lws.ref.name} nor its leader pod"


def owned_pods(pods: Sequence[ObservedPod], fleet: FleetWorkloads
               ) -> tuple[list[ObservedPod], list[tuple[ObservedPod, str]]]:
    """(the pods the fleet runs, [(pod, why not)] of the others), in the given order."""
    kept, ignored = [], []
    # LWS leaders first: a worker's StatefulSet is controlled by its group's leader pod.
    leaders = {p.uid: p.name for p in pods
               if p.lws_name and not p.worker and p.uid and pod_problem(p, fleet) is None}
    for pod in pods:
        problem = pod_problem(pod, fleet, leaders)
        if problem is None:
            kept.append(pod)
        else:
            ignored.append((pod, problem))
    return kept, ignored
