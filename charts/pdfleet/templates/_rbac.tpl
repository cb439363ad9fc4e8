{{/*
The operator's permissions: exactly the verbs it uses, no wildcards.
tests/unit/chart/test_chart_rbac.py compares these rules with the API calls the
operator's integration tests record (tests/integration/operator/recorded_api_calls.json).

Rules on namespaced resources: granted by the ClusterRole when the operator
watches every namespace, by a Role in each watched namespace otherwise.
*/}}
{{- define "pdfleet.namespacedRules" -}}
# The custom resource: watched, and its status written.
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferences"]
  verbs: ["list", "watch"]
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferences/status"]
  verbs: ["patch"]
# Per-role scale targets: created when a role has autoscaling, recreated when deleted,
# deleted when autoscaling is removed; their status written (.spec is the autoscaler's).
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferencescalers"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferencescalers/status"]
  verbs: ["patch"]
# The SLO planner scales the scalers as an HPA does, and stands down while an HPA
# (or KEDA's) targets one of them; scale to zero applies 0 <-> 1 to both (server-side apply is a patch).
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferencescalers/scale"]
  verbs: ["patch"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch"]
# Not an API call: children's ownerReferences set blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin checks against this.
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferences/finalizers"]
  verbs: ["update"]
# Children: watched, server-side applied (a PATCH that creates is also authorized
# as create), and pruned when the plan drops them. `get` (metadata only) checks the
# owner of an object of a child's name before the first write: never taken over.
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Roles whose replicas span several nodes (nodesPerReplica > 1).
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Fleets behind a Gateway (spec.gateway.inferencePool): the Gateway API Inference
# Extension's InferencePool over the decode pods.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.gangScheduling.volcano }}
# Volcano gangs: one PodGroup per multi-node replica.
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
{{- if .Values.gangScheduling.coscheduling }}
# scheduler-plugins coscheduling gangs: one PodGroup per multi-node replica.
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
# Each fleet's generated Secrets (<fleet>-kv-auth, <fleet>-engine-api): created once; on
# AlreadyExists its metadata only (PartialObjectMetadata) is read to check that the
# fleet owns it (a Secret someone else made may be known to them). The Secrets a fleet
# names (kvTransfer.authSecretRef, model.source.hf.tokenSecretRef), in its namespace: read
# before its pods are made, to check they exist and hold the key (only the key names are
# kept). Never listed, patched or watched. `get` gives no power the operator lacks: it
# creates pods, and a pod may mount any Secret of its namespace (docs/install.md).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "get"]
# Fleet pods: readiness and the prefill pods' IPs for the handshake endpoints.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# The router Deployment's ReplicaSets: a router pod counts only through one its Deployment
# controls (the canary's and the planner's scrapes; issue 30). Read only.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list", "watch"]
# Never called by the operator: the router's Role grants it, and RBAC lets the
# operator grant only what it holds itself.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# Events about the fleets.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
# Namespaced kopf peering: one KopfPeering per watched namespace.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end -}}

{{/* Rules on cluster-scoped resources: always in a ClusterRole. */}}
{{- define "pdfleet.clusterRules" -}}
# kopf discovers and follows the custom resource definition.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if not .Values.watchNamespaces }}
# kopf follows namespaces when it serves all of them.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- if .Values.peering.enabled }}
# Cluster-wide kopf peering.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
{{- end -}}
