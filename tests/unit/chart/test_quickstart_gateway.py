"""docs/gateway.md's walkthrough, offline (issue 39 part 1): examples/quickstart-gateway.yaml validates and its
rendered objects validate strictly for Kubernetes 1.30 and 1.37 (the InferencePool against GAIE's vendored CRD);
the HTTPRoute names the pool the plan renders and sends only SERVED_ROUTES; the EnvoyPatchPolicy names what the
plan renders and what Envoy AI Gateway generates; the doc shows the example files verbatim; and
docs/quickstart-gateway.sh (tests/k8s/test_quickstart_gateway_k8s.py runs it) names the same objects."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import third_party_crds
from pdfleet.contract.gateway import CALLER_AUTH_TOKEN, CALLER_TOKEN_METADATA, SECURE_SERVING_FLAG
from pdfleet.contract.routing import GENERATE_ROUTES, PASSTHROUGH_ROUTES
from pdfleet.operator.api import parse
from pdfleet.operator.kube.pool_status import CONDITION_TYPE
from pdfleet.operator.plan import PlanOptions, plan
from pdfleet.operator.plan.auth import epp_caller_secret_name
from test_quickstart import APP_VERSION, OWNER, REGISTRY, bare_cluster_problems

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "quickstart-gateway.yaml"
ROUTES = REPO / "examples" / "quickstart-gateway" / "envoy-gateway.yaml"
POLICY = REPO / "examples" / "quickstart-gateway" / "envoy-patch-policy.yaml"
DOC = (REPO / "docs" / "gateway.md").read_text()
SCRIPT = (REPO / "docs" / "quickstart-gateway.sh").read_text()
KUBE = ["1.30.0", "1.37.0"]
CR = yaml.safe_load(EXAMPLE.read_text())
NAME, NAMESPACE = CR["metadata"]["name"], CR["metadata"]["namespace"]


def fleet() -> list[dict[str, Any]]:
    options = PlanOptions(owner={**OWNER, "name": NAME},
                          default_image=f"{REGISTRY}/pdfleet-runtime-cpu:{APP_VERSION}")
    return plan(parse(CR), options)


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def gateway_docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(ROUTES.read_text()) if d}


def test_the_example_validates() -> None:
    result = subprocess.run([sys.executable, "-m", "pdfleet.operator.cli", "validate", "-f", str(EXAMPLE)],
                            capture_output=True, text=True, cwd=REPO)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, f"{EXAMPLE}: valid", "")


@pytest.mark.parametrize("kube", KUBE)
def test_the_fleet_validates_strictly(kube) -> None:
    objs = fleet()
    assert {o["kind"] for o in objs} >= {"InferencePool", "StatefulSet", "Deployment", "NetworkPolicy"}
    for obj in objs:
        if obj["kind"] == "InferencePool":
            assert third_party_crds.errors(obj) == []
        else:
            kubernetes_validate.validate(obj, kube, strict=True)


def test_the_fleet_is_the_quickstarts_behind_the_pool() -> None:
    """examples/quickstart-cpu.yaml's model, engines and roles; only the name, the router and the pool differ."""
    cpu = yaml.safe_load((REPO / "examples" / "quickstart-cpu.yaml").read_text())
    ours = copy.deepcopy(CR)
    assert ours["spec"].pop("gateway")["inferencePool"]["enabled"] is True
    assert ours["spec"].pop("router") == {"enabled": False}
    assert ours["spec"] == cpu["spec"] and NAMESPACE == cpu["metadata"]["namespace"]


def test_the_fleet_needs_nothing_a_bare_cluster_lacks() -> None:
    generated = {f"{NAME}-kv-auth", f"{NAME}-engine-api", epp_caller_secret_name(NAME)}
    assert bare_cluster_problems(fleet(), generated) == []
    assert parse(CR).spec.gateway.inference_pool.caller_auth == CALLER_AUTH_TOKEN  # the Secret the policy reads


# ---- the HTTPRoute ---------------------------------------------------------------------------------------------


def route_problems(route: dict[str, Any], gateway: dict[str, Any], pool: dict[str, Any]) -> list[str]:
    """What would keep the route from sending exactly the served routes to this pool through this Gateway."""
    problems = []
    if route["metadata"]["namespace"] != pool["metadata"]["namespace"]:
        problems.append("not in the pool's namespace")
    refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    if refs != [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}]:
        problems.append(f"backendRefs {refs}")
    matches = {(m["path"]["type"], m["path"]["value"], m.get("method"))
               for rule in route["spec"]["rules"] for m in rule["matches"]}
    want = {("Exact", p, "POST") for p in GENERATE_ROUTES} | {("Exact", p, m) for p, m in PASSTHROUGH_ROUTES.items()}
    if matches != want:
        problems.append(f"matches {sorted(matches)}")
    if [p["name"] for p in route["spec"]["parentRefs"]] != [gateway["metadata"]["name"]]:
        problems.append("parentRefs")
    return problems


BROKEN_ROUTES = [
    ("all of /v1/ (the old shape)", lambda r: r["spec"]["rules"][0].update(
        matches=[{"path": {"type": "PathPrefix", "value": "/v1/"}}])),
    ("another pool", lambda r: r["spec"]["rules"][0]["backendRefs"][0].update(name="llama-8b-gw")),
    ("one served route missing", lambda r: r["spec"]["rules"][0]["matches"].pop()),
    ("another namespace", lambda r: r["metadata"].update(namespace="inference")),
]


def test_the_route_sends_only_the_served_routes_to_the_rendered_pool() -> None:
    docs = gateway_docs()
    pool = one(fleet(), "InferencePool")
    assert route_problems(docs["HTTPRoute"], docs["Gateway"], pool) == []
    for doc in docs.values():
        assert third_party_crds.errors(doc) == [], doc["kind"]


@pytest.mark.parametrize("case, breaks", BROKEN_ROUTES, ids=[b[0] for b in BROKEN_ROUTES])
def test_the_route_check_sees_a_broken_route(case, breaks) -> None:
    """Negative controls for the check above."""
    docs = gateway_docs()
    route = copy.deepcopy(docs["HTTPRoute"])
    breaks(route)
    assert route_problems(route, docs["Gateway"], one(fleet(), "InferencePool")), case


# ---- the EnvoyPatchPolicy --------------------------------------------------------------------------------------


def ai_gateway_filter(pool: dict[str, Any]) -> str:
    """The name Envoy AI Gateway gives a pool's ext_proc filter (ai-gateway internal/extensionserver/inferencepool.go,
    httpFilterNameForInferencePool)."""
    return f"envoy.filters.http.ext_proc/endpointpicker/{pool['metadata']['name']}_{pool['metadata']['namespace']}_ext_proc"


def test_the_policy_names_what_the_plan_and_the_gateway_render() -> None:
    objs, docs = fleet(), gateway_docs()
    pool, gateway, route = one(objs, "InferencePool"), docs["Gateway"], docs["HTTPRoute"]
    service = one(objs, "Service", pool["spec"]["endpointPickerRef"]["name"])
    policy = yaml.safe_load(POLICY.read_text())
    assert policy["metadata"]["namespace"] == gateway["metadata"]["namespace"]
    assert policy["spec"]["targetRef"] == {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                           "name": gateway["metadata"]["name"]}
    cluster_patch, route_patch = policy["spec"]["jsonPatches"]
    cluster = cluster_patch["operation"]["value"]
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    assert address == {"address": f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local",
                       "port_value": service["spec"]["ports"][0]["port"]}
    assert service["spec"]["ports"][0]["port"] == pool["spec"]["endpointPickerRef"]["port"]["number"]
    assert cluster_patch["name"] == cluster["name"] == cluster["load_assignment"]["cluster_name"]
    # TLS without verification, as the picker serves it (the plan runs it with --secure-serving) and as AI Gateway's
    # own cluster speaks it
    assert SECURE_SERVING_FLAG in one(objs, "Deployment", service["metadata"]["name"])["spec"]["template"]["spec"][
        "containers"][0]["args"]
    tls_context = cluster["transport_socket"]["typed_config"]
    assert tls_context["@type"].endswith("tls.v3.UpstreamTlsContext")
    assert "validation_context" not in tls_context["common_tls_context"]
    (listener,) = gateway["spec"]["listeners"]
    assert route_patch["name"] == f"{gateway['metadata']['namespace']}/{gateway['metadata']['name']}/{listener['name']}"
    assert f"'httproute/{route['metadata']['namespace']}/{route['metadata']['name']}/.*'" in \
        route_patch["operation"]["jsonPath"]
    (name, per_route), = route_patch["operation"]["value"].items()
    assert name == ai_gateway_filter(pool)
    service_override = per_route["overrides"]["grpc_service"]
    assert service_override["envoy_grpc"] == {"cluster_name": cluster["name"]}
    assert service_override["initial_metadata"] == [{"key": CALLER_TOKEN_METADATA, "value": "EPP_CALLER_TOKEN"}]


# ---- the doc and the script -------------------------------------------------------------------------------------


def walkthrough() -> str:
    start = DOC.index("## Walkthrough: a first answer through the Gateway")
    return DOC[start:DOC.index("\n## ", start + 1)]


def test_the_doc_shows_the_example_files_verbatim() -> None:
    """Every YAML block of the walkthrough is cut from examples/ as it is; the Gateway's objects and the policy whole."""
    text = walkthrough()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    files = [EXAMPLE.read_text(), ROUTES.read_text(), POLICY.read_text()]
    assert ROUTES.read_text() in blocks and POLICY.read_text() in blocks
    callerauth_none = [b for b in blocks if "callerAuth: None" in b]
    assert len(callerauth_none) == 1  # the agentgateway stanza: checked against the API below, not a file
    for block in blocks:
        if block not in callerauth_none:
            assert any(block in f for f in files), block


def test_the_doc_s_caller_auth_none_stanza_is_valid() -> None:
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", walkthrough(), re.S) if "callerAuth: None" in b]
    cr = copy.deepcopy(CR)
    cr["spec"].update(yaml.safe_load(block))
    assert parse(cr).spec.gateway.inference_pool.caller_auth == "None"
    assert not [o for o in plan(parse(cr), PlanOptions(owner=OWNER)) if o["metadata"]["name"].endswith("-epp-caller")]


def _script_var(name: str) -> str:
    (value,) = re.findall(rf"^{name}=(\S+)", SCRIPT, re.M)
    return value


def test_the_doc_and_the_script_name_what_the_plan_renders() -> None:
    spec = parse(CR).spec
    gateway = gateway_docs()["Gateway"]
    assert (_script_var("NAMESPACE"), _script_var("FLEET"), _script_var("MODEL"), _script_var("GATEWAY")) == (
        NAMESPACE, NAME, spec.model.served_model_name or spec.model.name, gateway["metadata"]["name"])
    assert _script_var("CALLER_SECRET") == "$FLEET-epp-caller" and epp_caller_secret_name(NAME) == f"{NAME}-epp-caller"
    text = walkthrough()
    for needle in (f"wait --for=condition={CONDITION_TYPE} dinf/{NAME}", f"wait --for=condition=Ready dinf/{NAME}",
                   f"secret {epp_caller_secret_name(NAME)} -o jsonpath='{{.data.token}}'",
                   f"gateway {gateway['metadata']['name']} -o jsonpath='{{.status.addresses[0].value}}'",
                   "/v1/completions", "/v1/chat/completions", f"-n {NAMESPACE}", spec.model.name):
        assert needle in text, needle
    for needle in (f"wait --for=condition={CONDITION_TYPE}", "sed \"s/EPP_CALLER_TOKEN/$TOKEN/\"",
                   "examples/quickstart-gateway/envoy-patch-policy.yaml", "/v1/chat/completions"):
        assert needle in SCRIPT, needle


def test_the_gaie_crd_installed_is_the_vendored_version() -> None:
    crd = yaml.safe_load((REPO / "tests" / "crds" / "inference.networking.k8s.io_inferencepools.yaml").read_text())
    version = crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"]
    url = ("https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/"
           f"{version}/v1-manifests.yaml")
    assert f"kubectl apply -f {url}" in walkthrough()
    assert _script_var("GAIE_CRD") == url


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "docs" / "quickstart-gateway.sh")], check=True)
