"""The Endpoint Picker's front door (issue 38), table-tested: only the fleet's gateway may call it.

The EPP pod gets the fleet's caller token from the generated Secret <fleet>-epp-caller (secretKeyRef, never
a literal) and binds its pod IP (downward API), not 0.0.0.0; a NetworkPolicy selecting the EPP's pods
admits only allowFrom to the gRPC port (its HTTP port, /health and /metrics, stays open); the operator
creates that Secret once per fleet behind a gateway, and no other pod names it."""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdfleet.contract import gateway as gw
from pdfleet.contract.env import EPP_CALLER_TOKEN
from pdfleet.contract.routing import GENERATE_ROUTES, PASSTHROUGH_ROUTES, SERVED_ROUTES
from pdfleet.operator.api import parse
from pdfleet.operator.api.types import NetworkPolicyPeer
from pdfleet.operator.plan import PlanOptions, auth, context, gateway, plan
from pdfleet.operator.reconcile.auth_secret import AuthSecrets
from pdfleet.operator.plan.gateway import POD_IP_VAR

from test_plan_gateway import GW_NAMESPACE, OWNER, ROOT, children, cr, one, pod_labels  # noqa: E402

REF = {"secretKeyRef": {"name": "tiny-epp-caller", "key": auth.EPP_CALLER_KEY}}
PEERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}},
         {"podSelector": {"matchLabels": {"app": "proxy"}}, "namespaceSelector": {}}]


def epp_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(objs, "Deployment", "tiny-epp")["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in container.get("env") or []}


# ---- the token ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pool, holders", [
    (None, []),
    ({"enabled": False}, []),
    ({"enabled": True}, ["tiny-epp"]),
    ({"enabled": True, "callerAuth": gw.CALLER_AUTH_NONE}, []),  # a gateway that cannot send it: no token at all
])
def test_only_the_epp_gets_the_caller_token_and_only_from_its_secret(pool, holders) -> None:
    objs = children(cr(pool))
    found = []
    for obj in objs:
        pod = (obj.get("spec") or {}).get("template", {}).get("spec") or {}
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            if EPP_CALLER_TOKEN in env_of(c):
                assert env_of(c)[EPP_CALLER_TOKEN] == REF, "from the Secret, never a literal"
                found.append(obj["metadata"]["name"])
            elif obj["kind"] != "Deployment" or obj["metadata"]["name"] != "tiny-epp":
                assert "tiny-epp-caller" not in json.dumps(c), (obj["kind"], c["name"])
    assert found == holders
    # the Secret itself is the reconciler's (AuthSecrets), never part of the plan
    assert not [o for o in objs if o["kind"] == "Secret"]


def test_the_generated_secret_is_valid_and_holds_a_hex_token() -> None:
    secret = auth.generated_epp_caller_secret("tiny", "ml", bytes(range(32)), dict(OWNER))
    kubernetes_validate.validate(secret, "1.33.0", strict=True)
    assert secret["metadata"]["name"] == "tiny-epp-caller"
    token = base64.b64decode(secret["data"][auth.EPP_CALLER_KEY]).decode()
    assert token == bytes(range(32)).hex() and len(token) == 64
    from pdfleet.connector.epp.caller_auth import caller_token
    assert caller_token(token, any_caller=False) == token  # what the EPP accepts
    with pytest.raises(ValueError, match="at least 16 bytes"):
        auth.generated_epp_caller_secret("tiny", "ml", b"short", None)


class FakeSecrets:
    """KubeClient's create/get_metadata for Secrets: records what was created."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create(self, kind, body) -> Any:
        self.created.append(copy.deepcopy(body))
        return body

    async def get_metadata(self, kind, namespace, name):
        return None


@pytest.mark.parametrize("pool, want", [
    (None, ["tiny-kv-auth", "tiny-engine-api"]),
    ({"enabled": False}, ["tiny-kv-auth", "tiny-engine-api"]),
    ({"enabled": True}, ["tiny-kv-auth", "tiny-engine-api", "tiny-epp-caller"]),
    ({"enabled": True, "callerAuth": gw.CALLER_AUTH_NONE}, ["tiny-kv-auth", "tiny-engine-api"]),
])
def test_the_operator_creates_the_caller_secret_behind_a_gateway(pool, want) -> None:
    client = FakeSecrets()
    keys = iter([b"a" * 32, b"b" * 32, b"c" * 32])
    secrets = AuthSecrets(client, keygen=lambda: next(keys))
    spec = parse(cr(pool)).spec
    assert asyncio.run(secrets.ensure("ml", "tiny", spec, OWNER)) == (None, None)
    assert [s["metadata"]["name"] for s in client.created] == want
    for s in client.created:
        kubernetes_validate.validate(s, "1.33.0", strict=True)
    if pool and pool["enabled"] and "callerAuth" not in pool:  # its own random token, not another Secret's
        assert base64.b64decode(client.created[-1]["data"]["token"]).decode() == (b"c" * 32).hex()


@pytest.mark.parametrize("caller_auth, network_policy, flag, refused", [
    (gw.CALLER_AUTH_TOKEN, True, False, False),
    (gw.CALLER_AUTH_TOKEN, False, False, False),  # the token guards it without a policy
    (gw.CALLER_AUTH_NONE, True, True, False),  # agentgateway: the NetworkPolicy is the guard
    (gw.CALLER_AUTH_NONE, False, None, True),  # no token and no policy: refused, the field named
])
def test_caller_auth_none_runs_the_epp_open_only_behind_its_network_policy(caller_auth, network_policy, flag,
                                                                           refused) -> None:
    from pdfleet.operator.api import errors_of

    resource = cr({"enabled": True, "callerAuth": caller_auth}, network={"networkPolicy": network_policy})
    problems = [str(e) for e in errors_of(resource)]
    assert any(p.startswith("spec.gateway.inferencePool.callerAuth") for p in problems) == refused, problems
    if not refused:
        assert (gw.INSECURE_ANY_CALLER_FLAG in epp_container(children(resource))["args"]) == flag


# ---- the bind address ----------------------------------------------------------------------------


def test_the_epp_binds_its_pod_ip() -> None:
    from pdfleet.connector.epp import command
    from pdfleet.contract import router_config

    container = epp_container(children(cr({"enabled": True})))
    assert env_of(container)[POD_IP_VAR] == {"fieldRef": {"fieldPath": "status.podIP"}}
    parser = argparse.ArgumentParser(exit_on_error=False)
    command.add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    # the kubelet expands $(VAR) from the container's env: the EPP's gRPC and HTTP ports bind the pod IP
    assert router_config.from_args(args).host == f"$({POD_IP_VAR})"
    assert "0.0.0.0" not in container["args"]
    assert not args.any_caller  # the operator never serves any caller


# ---- the NetworkPolicy ---------------------------------------------------------------------------

# case, allowFrom, the gRPC rule's `from` (None: no gRPC rule: nobody reaches the port)
POLICIES = [
    ("the gateway's namespace", GW_NAMESPACE, GW_NAMESPACE),
    ("two peers", PEERS, PEERS),
    ("a cidr", [{"ipBlock": {"cidr": "10.0.0.0/8"}}], [{"ipBlock": {"cidr": "10.0.0.0/8"}}]),
    ("no peers (validation refuses it)", [], None),
]


@pytest.mark.parametrize("case, allow, want", POLICIES, ids=[p[0] for p in POLICIES])
def test_only_allow_from_reaches_the_epps_grpc_port(case, allow, want) -> None:
    resource = parse(cr({"enabled": True, "eppPort": 19002}))
    spec = resource.spec.model_copy(deep=True)
    spec.gateway.inference_pool.allow_from = [NetworkPolicyPeer.model_validate(p) for p in allow]
    objs = plan(resource, PlanOptions(owner=OWNER))
    policy = one(gateway.children(context(resource), spec), "NetworkPolicy", "tiny-epp")
    kubernetes_validate.validate(policy, "1.33.0", strict=True)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    (epp_pod,) = pod_labels(objs, "Deployment", "epp")
    assert selector.items() <= epp_pod.items()
    for role in ("decode", "prefill"):
        assert not selector.items() <= pod_labels(objs, "StatefulSet", role)[0].items()
    assert not selector.items() <= pod_labels(objs, "Deployment", "router")[0].items()
    rules = policy["spec"]["ingress"]
    grpc_rules = [r for r in rules if r["ports"] == [{"protocol": "TCP", "port": 19002}]]
    assert [r["from"] for r in grpc_rules] == ([want] if want is not None else [])
    # /health and /metrics, and grpc.health.v1 alone (plaintext): the kubelet's probes and Prometheus, from
    # anywhere; nothing else
    assert [r for r in rules if r not in grpc_rules] == [{"ports": [{"protocol": "TCP", "port": gw.EPP_METRICS},
                                                                    {"protocol": "TCP", "port": gw.EPP_GRPC_HEALTH}]}]


@pytest.mark.parametrize("network_policy, want", [(True, True), (False, False)])
def test_the_epp_policy_follows_network_policy(network_policy, want) -> None:
    objs = children(cr({"enabled": True}, network={"networkPolicy": network_policy}))
    assert bool([o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "tiny-epp"]) is want


# ---- the shipped HTTPRoutes ----------------------------------------------------------------------


def example_routes() -> list[tuple[str, dict[str, Any]]]:
    return [(f.name, d) for f in sorted((ROOT / "examples" / "gateway").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "HTTPRoute"]


@pytest.mark.parametrize("name, route", example_routes(), ids=[n for n, _ in example_routes()])
def test_the_shipped_routes_send_only_the_routes_served(name, route) -> None:
    """Exactly contract.routing's served routes, each with its method; nothing by prefix (was all of /v1/).
    Validity against the Gateway API CRDs: test_plan_gateway.py."""
    want = {**{path: "POST" for path in GENERATE_ROUTES}, **PASSTHROUGH_ROUTES}
    matches = [m for rule in route["spec"]["rules"] for m in rule["matches"]]
    assert all(m["path"]["type"] == "Exact" for m in matches), name
    assert {m["path"]["value"]: m.get("method") for m in matches} == want
    assert len(matches) == len(want) == len(SERVED_ROUTES)
