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

_APPLIED = [("apps", "statefulsets"), ("apps", "deployments"), ("", "services"), ("", "configmaps"),
            ("", "serviceaccounts"), ("policy", "poddisruptionbudgets"), ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"), ("networking.k8s.io", "networkpolicies"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"), ("inference.networking.k8s.io", "inferencepools")]

# Granted although the recording cannot show them. Each entry says why.
NOT_RECORDABLE: dict[Triple, str] = {
    # A server-side apply (PATCH) that creates the object is authorized as `create` as well.
    **{(g, r, "create"): "server-side apply of a new object is also checked against create" for g, r in _APPLIED},
    # KubeClient.delete prunes children the plan drops. The recording tests that prune run
    # against an in-process driver, not the HTTP server, so no DELETE reaches the recording.
    **{(g, r, "delete"): "pruning (operator/kube/client.py KubeClient.delete); not yet recorded"
       for g, r in _APPLIED},
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


def recorded_calls() -> set[Triple]:
    assert RECORDED_CALLS.exists(), f"{RECORDED_CALLS} is missing: run tests/integration/operator"
    data = json.loads(RECORDED_CALLS.read_text())
    calls = data["calls"] if isinstance(data, dict) else data
    triples = {(c["group"] or "", c["resource"], c["verb"]) for c in calls}
    assert triples, f"{RECORDED_CALLS} holds no calls"
    return triples


def fleet_roles() -> list[dict]:
    """The Roles the operator creates for a fleet with every optional part switched on."""
    from pdfleet.operator.plan import plan

    resource = {
        "apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "network": {"networkPolicy": True},
                 "gateway": {"inferencePool": {"enabled": True, "allowFrom": [{"namespaceSelector": {}}]}}},
    }
    return by_kind(plan(resource), "Role")


def onward_grants() -> dict[Triple, str]:
    # RBAC lets a subject create a Role only with permissions it holds itself (no escalate verb here).
    return {t: "granted onward to a fleet Role" for t in grants(fleet_roles())}


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


# PodGroup calls are recorded by the gang tests, whose operator runs with --gang-provider: the chart
# grants them only with gangScheduling values (test_podgroup_rbac_and_flag_only_for_the_gang_providers_enabled).
GANG_GROUPS = {"scheduling.volcano.sh", "scheduling.x-k8s.io"}


@pytest.fixture(scope="module")
def calls():
    return {c for c in recorded_calls() if c[0] not in GANG_GROUPS}


@pytest.fixture(scope="module")
def allowed():
    return {**NOT_RECORDABLE, **onward_grants()}


@pytest.fixture(scope="module")
def rendered():
    return {name: render_docs(SCENARIOS[name]) for name in ("default", "peering", "namespaced", "namespaced-peering")}


def test_every_recorded_call_is_allowed_cluster_wide(rendered, calls):
    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    assert missing(calls, granted) == set()


def test_nothing_is_granted_that_the_operator_does_not_use(rendered, calls, allowed):
    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    assert excess(granted, calls, allowed) == set()


def test_peering_adds_only_peering_rules(rendered, calls, allowed):
    granted = grants(by_kind(rendered["peering"], "ClusterRole"))
    assert missing(calls, granted) == set()
    assert excess(granted, calls, {**allowed, **PEERING}) == set()
    assert {t for t in granted if t[0] == "kopf.dev"} == {t for t in PEERING if t[1] == "clusterkopfpeerings"}


@pytest.mark.parametrize("scenario", ["namespaced", "namespaced-peering"])
def test_watched_namespaces_allow_every_namespaced_call(rendered, calls, allowed, scenario):
    docs = rendered[scenario]
    cluster = grants(by_kind(docs, "ClusterRole"))
    for role in by_kind(docs, "Role"):
        namespaced = grants([role])
        # kopf follows namespaces only when it serves all of them.
        needed = {c for c in calls if (c[0], c[1].split("/")[0]) not in CLUSTER_SCOPED}
        assert missing(needed, namespaced) == set(), role["metadata"]["namespace"]
        assert excess(namespaced, calls, {**allowed, **PEERING}) == set()
        assert not {(g, r.split("/")[0]) for g, r, _ in namespaced} & CLUSTER_SCOPED
    assert {(g, r) for g, r, _ in cluster} == {("apiextensions.k8s.io", "customresourcedefinitions")}
    assert missing({c for c in calls if c[1] == "customresourcedefinitions"}, cluster) == set()


def test_comparison_catches_a_missing_and_an_extra_grant(rendered, calls, allowed):
    # Negative controls for the comparisons above.
    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    some_call = sorted(calls)[0]
    assert missing(calls, granted - {some_call}) == {some_call}
    extra = ("", "secrets", "list")
    assert excess(granted | {extra}, calls, allowed) == {extra}


def test_the_operator_may_apply_every_kind_it_owns(rendered):
    # Independent of the recording: every kind the reconciler owns can be watched, applied and pruned.
    from pdfleet.operator.reconcile_plan.children import OWNED_KINDS, POD

    granted = grants(by_kind(rendered["default"], "ClusterRole"))
    for kind in OWNED_KINDS:
        for verb in ("list", "watch", "patch", "create", "delete"):
            assert (kind.group, kind.plural, verb) in granted, (kind.kind, verb)
    for verb in ("list", "watch"):
        assert (POD.group, POD.plural, verb) in granted


def test_the_operator_holds_what_it_grants_fleet_pods(rendered):
    # RBAC refuses to create a Role granting more than its creator holds (no escalate verb here).
    roles = fleet_roles()
    assert roles, "the plan no longer creates Roles: drop or adapt this test"
    for scenario in ("default", "namespaced"):
        docs = rendered[scenario]
        operator = grants(by_kind(docs, "ClusterRole") + [r for r in by_kind(docs, "Role")
                                                           if r["metadata"]["namespace"] == "team-a"])
        assert grants(roles) <= operator, scenario


def test_service_account_is_bound(rendered):
    docs = rendered["default"]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "pdfleet-system"}]
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa


@pytest.mark.parametrize("provider,group", [("volcano", "scheduling.volcano.sh"), ("coscheduling", "scheduling.x-k8s.io")])
def test_podgroup_rbac_and_flag_only_for_the_gang_providers_enabled(rendered, provider, group):
    # The chart cannot know which gang scheduler a cluster runs: values say so, and only then
    # does the operator get RBAC for that provider's PodGroups (and the flag that makes it watch them).
    def podgroup_grants(docs):
        return {t for t in grants(by_kind(docs, "ClusterRole")) if t[1] == "podgroups"}

    def args(docs):
        return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]

    assert podgroup_grants(rendered["default"]) == set()
    assert not [a for a in args(rendered["default"]) if a.startswith("--gang-provider")]
    docs = render_docs({"gangScheduling": {provider: True}})
    assert podgroup_grants(docs) == {(group, "podgroups", v) for v in ("get", "list", "watch", "create", "patch", "delete")}
    recorded = {c for c in recorded_calls() if c[0] == group}
    assert recorded <= podgroup_grants(docs), "every PodGroup call the gang tests made is granted"
    assert f"--gang-provider={provider}" in args(docs)
    from pdfleet.operator.reconcile_plan.children import GANG_KINDS

    assert GANG_KINDS[provider].group == group
