"""The chart's RBAC grants exactly what the operator uses.

Source of truth: the API calls the operator's integration tests record
(tests/integration/operator/recorded_api_calls.json: verb, group, resource,
namespaced). Every recorded call must be allowed, and every granted
(group, resource, verb) must have been recorded, save the few that no test can
record, listed in NOT_RECORDABLE with the reason.
"""

from __future__ import annotations

import json

import pytest

from chart_render import REPO, SCENARIOS, by_kind, one, render_docs

RECORDED_CALLS = REPO / "tests" / "integration" / "operator" / "recorded_api_calls.json"

Triple = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# The operator's calls as designed, used only while the recording does not exist yet.
DESIGN_CALLS: set[Triple] = {
    *{("pdfleet.io", "disaggregatedinferences", v) for v in ("get", "list", "watch", "patch", "update")},
    *{("pdfleet.io", "disaggregatedinferences/status", v) for v in ("get", "patch", "update")},
    *{(g, r, v) for g, r in [("apps", "statefulsets"), ("apps", "deployments"), ("", "services"), ("", "configmaps"),
                             ("", "serviceaccounts"), ("policy", "poddisruptionbudgets"),
                             ("rbac.authorization.k8s.io", "roles"), ("rbac.authorization.k8s.io", "rolebindings"),
                             ("networking.k8s.io", "networkpolicies")]
      for v in ("get", "list", "watch", "patch", "delete")},
    *{("", "pods", v) for v in ("get", "list", "watch")},
    *{("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")},
    ("", "events", "create"), ("events.k8s.io", "events", "create"),
    *{("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")},
    ("", "namespaces", "list"), ("", "namespaces", "watch"),
}

_APPLIED = [("apps", "statefulsets"), ("apps", "deployments"), ("", "services"), ("", "configmaps"),
            ("", "serviceaccounts"), ("policy", "poddisruptionbudgets"), ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"), ("networking.k8s.io", "networkpolicies")]

# Granted although no test can record them. Each entry says why.
NOT_RECORDABLE: dict[Triple, str] = {
    # A server-side apply (PATCH) that creates the object is authorized as `create` as well.
    **{(g, r, "create"): "server-side apply of a new object is also checked against create" for g, r in _APPLIED},
    # No request: the OwnerReferencesPermissionEnforcement admission plugin checks it when a child's
    # ownerReference sets blockOwnerDeletion=true.
    ("pdfleet.io", "disaggregatedinferences/finalizers", "update"): "blockOwnerDeletion on children",
}
# Peering: the integration tests run the operator standalone, so kopf's peering calls are never recorded.
PEERING: dict[Triple, str] = {
    **{("kopf.dev", "clusterkopfpeerings", v): "kopf peering, cluster-wide" for v in ("get", "list", "watch", "patch")},
    **{("kopf.dev", "kopfpeerings", v): "kopf peering, per namespace" for v in ("get", "list", "watch", "patch")},
}
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces"),
                  ("kopf.dev", "clusterkopfpeerings")}


def recorded_calls() -> tuple[set[Triple], str]:
    if not RECORDED_CALLS.exists():
        return set(DESIGN_CALLS), "design"
    data = json.loads(RECORDED_CALLS.read_text())
    calls = data["calls"] if isinstance(data, dict) else data
    triples = {(c["group"] or "", c["resource"], c["verb"]) for c in calls}
    assert triples, f"{RECORDED_CALLS} holds no calls"
    return triples, str(RECORDED_CALLS.relative_to(REPO))


def grants(roles) -> set[Triple]:
    out = set()
    for role in roles:
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add((group, resource, verb))
    return out


def missing(calls: set[Triple], granted: set[Triple]) -> set[Triple]:
    return calls - granted


def excess(granted: set[Triple], calls: set[Triple], allowed: dict[Triple, str]) -> set[Triple]:
    return granted - calls - set(allowed)


@pytest.fixture(scope="module")
def calls():
    return recorded_calls()[0]


@pytest.fixture(scope="module")
def rendered():
    return {name: render_docs(SCENARIOS[name]) for name in ("default", "peering", "namespaced", "namespaced-peering")}


def test_every_recorded_call_is_allowed_cluster_wide(rendered, calls):
    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    assert missing(calls, granted) == set()


def test_nothing_is_granted_that_the_operator_does_not_use(rendered, calls):
    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    assert excess(granted, calls, NOT_RECORDABLE) == set()


def test_peering_adds_only_peering_rules(rendered, calls):
    granted = grants(by_kind(rendered["peering"], "ClusterRole"))
    assert missing(calls, granted) == set()
    assert excess(granted, calls, {**NOT_RECORDABLE, **PEERING}) == set()
    assert {t for t in granted if t[0] == "kopf.dev"} == {t for t in PEERING if t[1] == "clusterkopfpeerings"}


@pytest.mark.parametrize("scenario", ["namespaced", "namespaced-peering"])
def test_watched_namespaces_allow_every_namespaced_call(rendered, calls, scenario):
    docs = rendered[scenario]
    cluster = grants(by_kind(docs, "ClusterRole"))
    for role in by_kind(docs, "Role"):
        namespaced = grants([role])
        # kopf follows namespaces only when it serves all of them.
        needed = {c for c in calls if (c[0], c[1].split("/")[0]) not in CLUSTER_SCOPED}
        assert missing(needed, namespaced) == set(), role["metadata"]["namespace"]
        assert excess(namespaced, calls, {**NOT_RECORDABLE, **PEERING}) == set()
        assert not {(g, r.split("/")[0]) for g, r, _ in namespaced} & CLUSTER_SCOPED
    assert {(g, r) for g, r, _ in cluster} == {("apiextensions.k8s.io", "customresourcedefinitions")}
    assert missing({c for c in calls if c[1] == "customresourcedefinitions"}, cluster) == set()


def test_comparison_catches_a_missing_and_an_extra_grant(rendered, calls):
    # Negative controls for the comparisons above.
    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    some_call = sorted(calls)[0]
    assert missing(calls, granted - {some_call}) == {some_call}
    extra = ("", "secrets", "get")
    assert excess(granted | {extra}, calls, NOT_RECORDABLE) == {extra}


def test_the_operator_may_apply_every_kind_it_owns(rendered):
    from pdfleet.operator.reconcile.children import OWNED_KINDS, POD

    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    for kind in OWNED_KINDS:
        for verb in ("get", "list", "watch", "patch", "create"):
            assert (kind.group, kind.plural, verb) in granted, (kind.kind, verb)
    for verb in ("get", "list", "watch"):
        assert (POD.group, POD.plural, verb) in granted


def test_the_operator_holds_what_it_grants_fleet_pods(rendered):
    # RBAC refuses to create a Role granting more than its creator holds (no escalate verb here).
    from pdfleet.operator.plan import plan

    resource = {
        "apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "network": {"networkPolicy": True}},
    }
    children = plan(resource)
    fleet_roles = by_kind(children, "Role")
    assert fleet_roles, "the plan no longer creates Roles: drop or adapt this test"
    kinds = {c["kind"] for c in children}
    assert {"StatefulSet", "Deployment", "Role", "NetworkPolicy"} <= kinds
    for scenario in ("default", "namespaced"):
        docs = rendered[scenario]
        operator = grants(by_kind(docs, "ClusterRole") + [r for r in by_kind(docs, "Role")
                                                           if r["metadata"]["namespace"] == "team-a"])
        assert grants(fleet_roles) <= operator, scenario


def test_service_account_is_bound(rendered):
    docs = rendered["default"]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "pdfleet-system"}]
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa
