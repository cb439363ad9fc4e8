"""spec.gateway.inferencePool: the InferencePool and its Endpoint Picker (issue 29), table-tested.

Every rendered InferencePool is validated against GAIE's released v1 CRD (vendored in tests/crds,
its CEL rules included); every built-in child against kubernetes-validate strict."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import third_party_crds  # noqa: E402
from pod_security import violated_controls  # noqa: E402
from pdfleet.contract import gateway as gw  # noqa: E402
from pdfleet.contract.router_config import parse_argv  # noqa: E402
from pdfleet.operator.api import parse  # noqa: E402
from pdfleet.operator.plan import PlanOptions, plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "tiny", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip


GW_NAMESPACE = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}}]


def cr(pool: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["metadata"]["namespace"] = "ml"
    if pool is not None:
        out["spec"]["gateway"] = {"inferencePool": {"allowFrom": GW_NAMESPACE, **copy.deepcopy(pool)}}
    out["spec"].update(copy.deepcopy(spec))
    return out


def children(resource: dict[str, Any]) -> list[dict[str, Any]]:
    return plan(resource, PlanOptions(owner=OWNER))


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def gateway_children(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objs
            if o["kind"] == "InferencePool" or o["metadata"]["name"] in ("tiny-epp", "tiny-gateway")}


ALL = {("InferencePool", "tiny"), ("Deployment", "tiny-epp"), ("Service", "tiny-epp"), ("ServiceAccount", "tiny-epp"),
       ("Role", "tiny-epp"), ("RoleBinding", "tiny-epp"), ("PodDisruptionBudget", "tiny-epp"),
       ("NetworkPolicy", "tiny-gateway"), ("NetworkPolicy", "tiny-epp")}

# case, pool spec (None: not set), other spec, gateway children expected
CHILDREN = [
    ("not set", None, {}, set()),
    ("disabled", {"enabled": False, "failureMode": "FailOpen"}, {}, set()),
    ("enabled", {"enabled": True}, {}, ALL),
    ("no disruption budgets", {"enabled": True}, {"disruption": {"enabled": False}}, ALL - {("PodDisruptionBudget", "tiny-epp")}),
    ("no network policy", {"enabled": True}, {"network": {"networkPolicy": False}},
     ALL - {("NetworkPolicy", "tiny-gateway"), ("NetworkPolicy", "tiny-epp")}),
    ("without the router", {"enabled": True}, {"router": {"enabled": False}}, ALL),
]


@pytest.mark.parametrize("case,pool,spec,want", CHILDREN, ids=[c[0] for c in CHILDREN])
def test_the_pool_and_its_picker_are_rendered_only_when_enabled(case, pool, spec, want) -> None:
    objs = children(cr(pool, **spec))
    assert gateway_children(objs) == want
    for kind, name in want:
        assert one(objs, kind, name)["metadata"]["ownerReferences"] == [OWNER], (kind, name)


# case, pool spec, engine port, (failureMode, EPP port, targetPorts, EPP replicas)
POOLS = [
    ("defaults", {"enabled": True}, 8000, ("FailClose", 9002, [{"number": 8000}], 2)),
    ("fail open", {"enabled": True, "failureMode": "FailOpen", "failOpenWithoutEngineToken": True}, 8000, ("FailOpen", 9002, [{"number": 8000}], 2)),
    ("own ports", {"enabled": True, "eppPort": 19002, "eppReplicas": 3}, 8080, ("FailClose", 19002, [{"number": 8080}], 3)),
]


@pytest.mark.parametrize("case,pool,engine_port,want", POOLS, ids=[p[0] for p in POOLS])
def test_the_pool_names_the_picker_service_and_the_decode_port(case, pool, engine_port, want) -> None:
    failure_mode, epp_port, target_ports, replicas = want
    objs = children(cr(pool, engine={"port": engine_port, "blockSize": 32}))
    p = one(objs, "InferencePool", "tiny")
    assert p["apiVersion"] == "inference.networking.k8s.io/v1"
    assert third_party_crds.errors(p) == []
    assert p["spec"]["targetPorts"] == target_ports
    ref = p["spec"]["endpointPickerRef"]
    assert (ref["failureMode"], ref["port"]["number"]) == (failure_mode, epp_port)
    # the reference resolves: a Service of that name and port, whose selector finds the EPP's pods
    svc = one(objs, ref["kind"], ref["name"])
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["port"] == epp_port
    dep = one(objs, "Deployment", "tiny-epp")
    assert dep["spec"]["replicas"] == replicas
    pod = dep["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[svc_port["targetPort"]] == epp_port
    assert container["args"][container["args"].index(gw.GRPC_PORT_FLAG) + 1] == str(epp_port)


def pod_labels(objs: list[dict[str, Any]], kind: str, role: str) -> list[dict[str, str]]:
    return [o["spec"]["template"]["metadata"]["labels"] for o in objs
            if o["kind"] == kind and o["metadata"]["labels"].get("pdfleet.io/role") == role]


def test_the_pool_selects_the_decode_pods_of_every_revision_and_nothing_else() -> None:
    objs = children(cr({"enabled": True}))
    selector = one(objs, "InferencePool", "tiny")["spec"]["selector"]["matchLabels"]
    assert "pdfleet.io/revision" not in selector  # a rollout's new decodes join without an edit
    (decode,) = pod_labels(objs, "StatefulSet", "decode")
    assert selector.items() <= decode.items()
    others = pod_labels(objs, "StatefulSet", "prefill") + pod_labels(objs, "Deployment", "router") + \
        pod_labels(objs, "Deployment", "epp")
    assert len(others) == 3
    assert not any(selector.items() <= labels.items() for labels in others)
    # and the pods of a newer revision too
    newer = children(cr({"enabled": True}, model={"name": "/models/other"}))
    (decode2,) = pod_labels(newer, "StatefulSet", "decode")
    assert decode2["pdfleet.io/revision"] != decode["pdfleet.io/revision"]
    assert selector.items() <= decode2.items()


def test_the_picker_runs_with_the_routers_discovery_and_picking() -> None:
    resource = cr({"enabled": True}, router={"prefillPolicy": "leastOutstanding",
                                             "flowControl": {"enabled": True, "priorities": [{"name": "a"}]}})
    objs = children(resource)
    epp = one(objs, "Deployment", "tiny-epp")["spec"]["template"]["spec"]["containers"][0]
    rtr = one(objs, "Deployment", "tiny-router")["spec"]["template"]["spec"]["containers"][0]
    assert epp["command"] == ["pdfleet"] and epp["args"][0] == "epp"
    flag = epp["args"].index(gw.GRPC_PORT_FLAG)  # the router's flags, then the EPP's own (test_plan_epp_secure_serving)
    epp_config = parse_argv(epp["args"][1:flag])
    router_config = parse_argv(rtr["args"][1:])
    assert epp_config.port == gw.EPP_METRICS
    assert epp_config.kubernetes_fleet == "tiny" and epp_config.kubernetes_namespace == "ml"
    assert epp_config.flow_control.enabled and epp_config.prefill_policy == "leastOutstanding"
    assert epp_config == router_config.__class__(**{**router_config.__dict__, "port": gw.EPP_METRICS,
                                                     "host": "$(EPP_POD_IP)"})  # the pod IP (downward API)
    # the fleet's uid (only its own Services are trusted) and the engine token, as the router; then the EPP's
    # caller token and pod IP (test_plan_epp_front_door.py)
    assert epp["env"][:len(rtr["env"])] == rtr["env"]
    # the probes: gRPC on the plaintext health port (test_plan_epp_secure_serving.py)
    assert epp["readinessProbe"]["grpc"]["port"] in {p["containerPort"] for p in epp["ports"]}


def test_the_pickers_rights_are_the_routers_and_no_wildcards() -> None:
    objs = children(cr({"enabled": True}))
    role = one(objs, "Role", "tiny-epp")
    assert role["rules"] == one(objs, "Role", "tiny-router")["rules"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
    binding = one(objs, "RoleBinding", "tiny-epp")
    assert binding["roleRef"]["name"] == "tiny-epp"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tiny-epp", "namespace": "ml"}]
    dep = one(objs, "Deployment", "tiny-epp")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "tiny-epp"


def test_the_picker_pod_is_restricted_and_drains_like_the_router() -> None:
    objs = children(cr({"enabled": True}))
    pod = one(objs, "Deployment", "tiny-epp")["spec"]["template"]["spec"]
    assert violated_controls(pod) == set()
    router_pod = one(objs, "Deployment", "tiny-router")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == router_pod["terminationGracePeriodSeconds"]
    pdb = one(objs, "PodDisruptionBudget", "tiny-epp")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= \
        one(objs, "Deployment", "tiny-epp")["spec"]["template"]["metadata"]["labels"].items()


# case, allowFrom, the ingress rule's from (None: any source)
PEERS = [
    ("every namespace", [{"namespaceSelector": {}}], [{"namespaceSelector": {}}]),
    ("the gateway's namespace", [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}}],
     [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}}]),
    ("a cidr", [{"ipBlock": {"cidr": "10.0.0.0/8"}}], [{"ipBlock": {"cidr": "10.0.0.0/8"}}]),
]


@pytest.mark.parametrize("case,allow,want", PEERS, ids=[p[0] for p in PEERS])
def test_the_gateway_reaches_only_the_decode_engine_port(case, allow, want) -> None:
    objs = children(cr({"enabled": True, "allowFrom": allow}, engine={"port": 8080, "blockSize": 32}))
    policy = one(objs, "NetworkPolicy", "tiny-gateway")
    (decode,) = pod_labels(objs, "StatefulSet", "decode")
    (prefill,) = pod_labels(objs, "StatefulSet", "prefill")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= decode.items() and not selector.items() <= prefill.items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert rule["from"] == want


def test_no_peers_no_opening() -> None:
    """Validation refuses enabled + networkPolicy without allowFrom; the plan, given one anyway, opens nothing
    (an empty `from` would admit every source) and decode stays the fleet's alone."""
    from pdfleet.operator.plan import context, gateway

    resource = parse(cr({"enabled": True}))
    spec = resource.spec.model_copy(deep=True)
    spec.gateway.inference_pool.allow_from = []
    objs = gateway.children(context(resource), spec)
    # the EPP's own policy stays (its gRPC port then admits nobody: test_plan_epp_front_door.py)
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "NetworkPolicy"] == ["tiny-epp"]
    assert [o for o in gateway.children(context(resource), resource.spec) if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
def test_every_gateway_child_validates_strictly(version: str) -> None:
    resource = cr({"enabled": True, "allowFrom": PEERS[1][1]})
    for obj in children(resource):
        if obj["kind"] == "InferencePool":
            assert third_party_crds.errors(obj) == []
        else:
            kubernetes_validate.validate(obj, version, strict=True)


BROKEN = [
    ("unknown failure mode", lambda p: p["spec"]["endpointPickerRef"].update(failureMode="Open")),
    ("no target port", lambda p: p["spec"].update(targetPorts=[])),
    ("a target port twice (CEL)", lambda p: p["spec"].update(targetPorts=[{"number": 80}, {"number": 80}])),
    ("a Service reference without a port (CEL)", lambda p: p["spec"]["endpointPickerRef"].pop("port")),
    ("an unknown field", lambda p: p["spec"].update(endpointPicker={"name": "x"})),
    ("a selector with expressions", lambda p: p["spec"]["selector"].update(matchExpressions=[])),
]


@pytest.mark.parametrize("case,breaks", BROKEN, ids=[b[0] for b in BROKEN])
def test_the_crd_check_refuses_a_broken_pool(case, breaks) -> None:
    """Negative controls: the validation above does refuse what GAIE's CRD refuses."""
    pool = copy.deepcopy(one(children(cr({"enabled": True})), "InferencePool", "tiny"))
    breaks(pool)
    assert third_party_crds.errors(pool), case


def test_the_example_routes_its_httproute_to_the_pool() -> None:
    """examples/gateway.yaml renders the pool that examples/gateway/*.yaml's HTTPRoutes name."""
    fleet = parse(yaml.safe_load((ROOT / "examples" / "gateway.yaml").read_text()))
    objs = plan(fleet, PlanOptions(owner=OWNER))
    (pool,) = [o for o in objs if o["kind"] == "InferencePool"]
    assert third_party_crds.errors(pool) == []
    files = sorted((ROOT / "examples" / "gateway").glob("*.yaml"))
    routes = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "HTTPRoute"]
    assert routes, "examples/gateway/ holds no HTTPRoute"
    for route in routes:
        assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]  # a pool is referenced in-namespace
        refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
        assert refs == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                         "name": pool["metadata"]["name"]}], route["metadata"]["name"]


def test_pdfleet_epp_parses_the_args_the_plan_renders() -> None:
    """The operator's args through `pdfleet epp`'s own parser (connector/epp/command.py): the gRPC port
    the pool names, the metrics port the probes use, the fleet's discovery."""
    import argparse

    from pdfleet.connector.epp import command
    from pdfleet.contract import router_config

    objs = children(cr({"enabled": True, "eppPort": 19002}))
    (container,) = one(objs, "Deployment", "tiny-epp")["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "epp"
    parser = argparse.ArgumentParser(exit_on_error=False)
    command.add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    config = router_config.from_args(args)
    assert args.grpc_port == 19002 == one(objs, "InferencePool", "tiny")["spec"]["endpointPickerRef"]["port"]["number"]
    assert config.port == gw.EPP_METRICS and config.host == "$(EPP_POD_IP)"  # the pod IP, from the downward API
    assert (config.kubernetes_fleet, config.kubernetes_namespace) == ("tiny", "ml")


def example_gateway_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{f.name}:{d['kind']}", d) for f in sorted((ROOT / "examples" / "gateway").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]


@pytest.mark.parametrize("name,doc", example_gateway_docs(), ids=[n for n, _ in example_gateway_docs()])
def test_the_example_gateways_and_routes_validate_against_gateway_api(name, doc) -> None:
    """Against the Gateway API's standard-channel CRDs (vendored in tests/crds), CEL rules included."""
    assert third_party_crds.errors(doc) == [], name


ROUTE_BROKEN = [
    ("a backendRef without a name", lambda r: r["spec"]["rules"][0]["backendRefs"][0].pop("name")),
    ("a timeout that is no duration", lambda r: r["spec"]["rules"][0]["timeouts"].update(request="15 minutes")),
    ("a path prefix without a slash (CEL)", lambda r: r["spec"]["rules"][0]["matches"][0]["path"].update(value="v1")),
    ("an unknown field", lambda r: r["spec"]["rules"][0].update(backends=[])),
]


@pytest.mark.parametrize("case,breaks", ROUTE_BROKEN, ids=[b[0] for b in ROUTE_BROKEN])
def test_the_route_check_refuses_a_broken_route(case, breaks) -> None:
    """Negative controls for the check above."""
    (route,) = [d for n, d in example_gateway_docs() if n == "envoy-gateway.yaml:HTTPRoute"]
    route = copy.deepcopy(route)
    breaks(route)
    assert third_party_crds.errors(route), case
