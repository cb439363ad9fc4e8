"""Every Kubernetes kind the operator renders, owns, watches or writes: one list (pure).

The plan renders objects of these kinds, the reconciler watches and owns them, the scalers'
edge writes StatefulSets; each spells a kind through this module, never again by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def path(self, namespace: Optional[str], name: Optional[str] = None, subresource: Optional[str] = None) -> str:
        root = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        out = f"{root}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{root}/{self.plural}"
        if name:
            out += f"/{name}"
        if subresource:
            out += f"/{subresource}"
        return out


STATEFULSET = Kind("apps/v1", "StatefulSet", "statefulsets")
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
SERVICE = Kind("v1", "Service", "services")
CONFIGMAP = Kind("v1", "ConfigMap", "configmaps")
SERVICEACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
PDB = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLEBINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
NETWORKPOLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
# Multi-node roles (issue 12): LeaderWorkerSets are watched like StatefulSets.
LWS = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
# Behind a Gateway (issue 29): GAIE's InferencePool, watched like LeaderWorkerSets (kopf skips a
# kind whose CRD the cluster lacks).
INFERENCE_POOL = Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools")
# A gang provider's PodGroups, only when the operator is told the provider is installed (the
# chart's values grant RBAC for exactly those), see plan/gang.py and
# ReconcileOptions.gang_providers.
VOLCANO_PODGROUP = Kind("scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups")
COSCHEDULING_PODGROUP = Kind("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups")
POD_GROUP_KINDS = (VOLCANO_PODGROUP, COSCHEDULING_PODGROUP)  # which provider writes which: plan/gang.py
# Not owned: read or written beside the children.
POD = Kind("v1", "Pod", "pods")
# The Deployment controller's ReplicaSets: a router pod is the fleet's only through one (kube/owned.py).
REPLICASET = Kind("apps/v1", "ReplicaSet", "replicasets")
SECRET = Kind("v1", "Secret", "secrets")
EVENT = Kind("v1", "Event", "events")

# Every kind the plan may produce (gang PodGroups aside). The operator watches all of them
# (label-selected) so that it notices drift and deletions, and owns them through ownerReferences.
OWNED_KINDS: tuple[Kind, ...] = (
    STATEFULSET, DEPLOYMENT, SERVICE, CONFIGMAP, SERVICEACCOUNT, PDB, ROLE, ROLEBINDING, NETWORKPOLICY, LWS,
    INFERENCE_POOL,
)
WORKLOAD_KINDS = (STATEFULSET.kind, DEPLOYMENT.kind, LWS.kind)
ENGINE_WORKLOAD_KINDS = (STATEFULSET.kind, LWS.kind)  # what runs engines (the router is a Deployment)
