{{/*
The operator's permissions: exactly the verbs it uses, no wildcards.
tests/unit/chart/test_chart_rbac.py compares these rules with the API calls the
operator's integration tests record (tests/integration/operator/recorded_api_calls.json).

Rules on namespaced resources: granted by the ClusterRole when the operator
watches every namespace, by a Role in each watched namespace otherwise.
*/}}
{{- define "pdfleet.namespacedRules" -}}
# The custom resource, its status and finalizers.
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferences"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferences/status"]
  verbs: ["get", "patch", "update"]
# Not an API call: setting ownerReferences with blockOwnerDeletion on children
# needs update on the owner's finalizers where OwnerReferencesPermissionEnforcement is on.
- apiGroups: ["pdfleet.io"]
  resources: ["disaggregatedinferences/finalizers"]
  verbs: ["update"]
# Children, server-side applied.
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
# Observed only: prefill pods' IPs and readiness for the handshake endpoints.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# Events about the custom resources.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["events.k8s.io"]
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
  verbs: ["get", "list", "watch"]
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
