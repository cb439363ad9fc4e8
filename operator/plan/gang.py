"""Gang scheduling of multi-node replicas (pure): each replica's pods start together or not at all.

A gang is the pods of ONE replica (a LeaderWorkerSet group: nodesPerReplica pods). A shared
pod template cannot name a per-group PodGroup, so under a gang provider a multi-node role
renders one LeaderWorkerSet per replica (replicas: 1, see multinode.py), and each gets:

- kueue: the pod-group labels of Kueue's plain-pod groups (`kueue.x-k8s.io/pod-group-name`
  + annotation `kueue.x-k8s.io/pod-group-total-count`) and `kueue.x-k8s.io/queue-name`;
  no object (Kueue creates the Workload itself).
- volcano: a `scheduling.volcano.sh/v1beta1` PodGroup with minMember = nodesPerReplica
  (queue = scheduling.queueName), pods annotated `scheduling.k8s.io/group-name` and
  scheduled by `volcano`.
- coscheduling (kubernetes-sigs/scheduler-plugins): a `scheduling.x-k8s.io/v1alpha1`
  PodGroup with minMember = nodesPerReplica, pods labelled `scheduling.x-k8s.io/pod-group`.
  The scheduler that runs the plugin is a cluster choice (often the default scheduler
  reconfigured), so no schedulerName is set.

Single-pod replicas (nodesPerReplica 1) form no gang; under kueue they still carry the
queue-name label so the whole fleet is admitted through the one queue.
"""

from __future__ import annotations

from typing import Any

from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import kinds, naming
from pdfleet.operator.plan.meta import Context, metadata

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_API = kinds.VOLCANO_PODGROUP.api_version
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_API = kinds.COSCHEDULING_PODGROUP.api_version
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
# How long scheduler-plugins waits for a whole group before it gives the pods back.
COSCHEDULING_TIMEOUT_SECONDS = 600


def provider(spec: DisaggregatedInferenceSpec) -> str:
    return spec.scheduling.gang.provider


def per_group_workloads(spec: DisaggregatedInferenceSpec, role: str) -> bool:
    """One LeaderWorkerSet per replica: needed for a per-replica gang of a multi-node role."""
    return provider(spec) != "none" and spec.role(role).nodes_per_replica > 1


def decorate_pod(template: dict[str, Any], spec: DisaggregatedInferenceSpec, role: str, group: str | None) -> None:
    """Add the gang's pod metadata to a pod template (in place). `group`: the gang's name, or None (no gang)."""
    meta = template.setdefault("metadata", {})
    labels = meta.setdefault("labels", {})
    annotations = meta.setdefault("annotations", {})
    kind = provider(spec)
    if kind == "kueue":
        labels[KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name or ""
        if group:
            labels[KUEUE_GROUP_LABEL] = group
            annotations[KUEUE_COUNT_ANNOTATION] = str(spec.role(role).nodes_per_replica)
    elif kind == "volcano":
        template["spec"]["schedulerName"] = VOLCANO_SCHEDULER
        if group:
            annotations[VOLCANO_GROUP_ANNOTATION] = group
        if spec.scheduling.queue_name:
            annotations["scheduling.volcano.sh/queue-name"] = spec.scheduling.queue_name
    elif kind == "coscheduling" and group:
        labels[COSCHEDULING_GROUP_LABEL] = group
    if not annotations:
        meta.pop("annotations")


def pod_group(ctx: Context, spec: DisaggregatedInferenceSpec, role: str, group: str) -> dict[str, Any] | None:
    """The PodGroup object of one gang, or None when the provider needs none (kueue)."""
    labels = naming.revision_labels(ctx.fleet, role, ctx.revision)
    min_member = spec.role(role).nodes_per_replica
    kind = provider(spec)
    if kind == "volcano":
        body: dict[str, Any] = {"minMember": min_member}
        if spec.scheduling.queue_name:
            body["queue"] = spec.scheduling.queue_name
        return {"apiVersion": VOLCANO_API, "kind": kinds.VOLCANO_PODGROUP.kind, "metadata": metadata(ctx, group, labels), "spec": body}
    if kind == "coscheduling":
        return {
            "apiVersion": COSCHEDULING_API,
            "kind": kinds.COSCHEDULING_PODGROUP.kind,
            "metadata": metadata(ctx, group, labels),
            "spec": {"minMember": min_member, "scheduleTimeoutSeconds": COSCHEDULING_TIMEOUT_SECONDS},
        }
    return None
