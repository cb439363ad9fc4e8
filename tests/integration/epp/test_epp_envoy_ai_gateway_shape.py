"""The walkthrough's EnvoyPatchPolicy (examples/quickstart-gateway/envoy-patch-policy.yaml) through a real Envoy
configured as Envoy AI Gateway configures an InferencePool (envoyproxy/ai-gateway internal/extensionserver/
inferencepool.go): the pool's ext_proc filter named .../endpointpicker/<pool>_<namespace>_ext_proc, both body modes
FULL_DUPLEX_STREAMED, trailers SEND, 300 s message timeout, FailClose, no metadata, and the picker's cluster over
TLS (no verification, no ALPN). Envoy Gateway applies EnvoyPatchPolicies before AI Gateway adds that filter and
cluster, so the policy cannot touch them; it adds its own cluster (TLS, no verification) and a per-route ext_proc
override that sends the caller token instead.

The picker serves TLS (secure serving, as GAIE's EPP and as the operator runs it): as generated, the gateway reaches
it and is refused only for want of the token; the same shape with the token is served P/D; with the policy's two
patches applied as Envoy Gateway applies them, requests are served P/D, and without the token refused. Negative
control: against a picker serving h2c (before secure serving), the generated shape reaches nothing."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.connector.epp import caller_auth
from pdfleet.connector.epp.envoy_config import FULL_DUPLEX, render
from pdfleet.connector.epp.envoy_process import Envoy
from pdfleet.contract.env import ENGINE_API_KEY
from pdfleet.contract.gateway import CALLER_TOKEN_METADATA
# the fleet (an EPP, one prefill, one decode, the engine token set) and the refusal counter, as there; each test
# below runs its own Envoy in the shape under test beside the fixture's
from test_epp_caller_auth import ENGINE_TOKEN, _refused, fleet  # noqa: F401

pytestmark = pytest.mark.timeout(90)

POLICY = Path(__file__).resolve().parents[3] / "examples" / "quickstart-gateway" / "envoy-patch-policy.yaml"
POOL, NAMESPACE = "quickstart-gw", "pdfleet-demo"
# Envoy AI Gateway's names for the pool's filter and the picker's cluster
FILTER = f"envoy.filters.http.ext_proc/endpointpicker/{POOL}_{NAMESPACE}_ext_proc"
AIGW_CLUSTER = f"envoy.clusters.endpointpicker_{POOL}_{NAMESPACE}_ext_proc"
FD = "FULL_DUPLEX_STREAMED"


def _hcm(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def ai_gateway_shape(epp_port: int, decode: str, caller_token: str) -> dict[str, Any]:
    """pdfleet's full-duplex config, its ext_proc filter and picker cluster replaced by Envoy AI Gateway's."""
    cfg = yaml.safe_load(render(FULL_DUPLEX, listen_port=0, epp_port=epp_port, admin_port=0,
                                caller_token=caller_token, decode_only=(decode,)))
    hcm = _hcm(cfg)
    (ext,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
    ext["name"] = FILTER
    ext["typed_config"] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": AIGW_CLUSTER,
                                        "authority": f"{POOL}-epp.{NAMESPACE}.svc:9002"}},
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": FD, "response_body_mode": FD,
                            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
        "allow_mode_override": False, "message_timeout": "300s", "failure_mode_allow": False}
    clusters = cfg["static_resources"]["clusters"]
    (epp,) = [c for c in clusters if c["name"] == "epp"]
    clusters.remove(epp)
    tls = {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {"validation_context": {}}}}
    clusters.append({**epp, "name": AIGW_CLUSTER, "transport_socket": tls,
                     "load_assignment": {**epp["load_assignment"], "cluster_name": AIGW_CLUSTER}})
    return cfg


def policy_patches(epp_port: int, token: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy's new cluster (its Service address replaced by this EPP's) and its routes' override."""
    doc = yaml.safe_load(POLICY.read_text())
    cluster_patch, route_patch = doc["spec"]["jsonPatches"]
    assert cluster_patch["type"].endswith("cluster.v3.Cluster") and "path" not in cluster_patch["operation"]
    assert route_patch["operation"]["path"] == "typed_per_filter_config"
    cluster = copy.deepcopy(cluster_patch["operation"]["value"])
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    endpoint["endpoint"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": epp_port}
    per_route = copy.deepcopy(route_patch["operation"]["value"])
    assert list(per_route) == [FILTER]  # the name Envoy AI Gateway gives the pool's filter
    service = per_route[FILTER]["overrides"]["grpc_service"]
    (meta,) = service["initial_metadata"]
    if token is None:
        del service["initial_metadata"]
    else:
        meta["value"] = meta["value"].replace("EPP_CALLER_TOKEN", token)
    return cluster, per_route


def patched(cfg: dict[str, Any], epp_port: int, token: str | None) -> dict[str, Any]:
    """The policy applied as Envoy Gateway applies it: a whole cluster added; typed_per_filter_config set on the
    HTTPRoute's routes (here every route of the gateway's one virtual host)."""
    cfg = copy.deepcopy(cfg)
    cluster, per_route = policy_patches(epp_port, token)
    cfg["static_resources"]["clusters"].append(cluster)
    for route in _hcm(cfg)["route_config"]["virtual_hosts"][0]["routes"]:
        route["typed_per_filter_config"] = per_route
    return cfg


async def _serve(gw, cfg: dict[str, Any], requests: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, str]]:
    envoy = Envoy(yaml.safe_dump(cfg))
    await asyncio.to_thread(envoy.start)
    out = []
    try:
        url = f"http://127.0.0.1:{envoy.listener_port()}"
        for path, body in requests:
            async with gw.session.post(url + path, json=body) as r:
                out.append((r.status, await r.text()))
    finally:
        await asyncio.to_thread(envoy.stop)
    return out


COMPLETION = ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True})


@pytest.fixture
async def secure_fleet(gw, monkeypatch):
    """The fleet of test_epp_caller_auth, its EPP serving TLS with a self-signed certificate."""
    monkeypatch.setenv(ENGINE_API_KEY, ENGINE_TOKEN)
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], secure=True)
    return gw, p, d


def _with_token(cfg: dict[str, Any], token: str) -> dict[str, Any]:
    """The generated filter, sending the caller token itself (what the policy's override adds)."""
    (ext,) = [f for f in _hcm(cfg)["http_filters"] if f["name"] == FILTER]
    ext["typed_config"]["grpc_service"]["initial_metadata"] = [{"key": CALLER_TOKEN_METADATA, "value": token}]
    return cfg


async def test_as_ai_gateway_generates_it_the_gateway_reaches_the_picker_and_lacks_only_the_token(secure_fleet):
    """Its TLS cluster (no verification, no ALPN) completes the handshake; the call is refused for want of the
    caller token (AI Gateway sends no metadata): FailClose 5xx, no leg ran."""
    gw, p, d = secure_fleet
    cfg = ai_gateway_shape(gw.epp_port, d.url, gw.caller_token)
    [(status, text)] = await _serve(gw, cfg, [COMPLETION])
    assert status >= 500, text
    assert p.received == [] and d.received == []
    assert _refused(gw, caller_auth.MISSING) >= 1  # the call got through TLS to the caller check


async def test_as_ai_gateway_generates_it_with_the_token_both_routes_are_served_pd(secure_fleet):
    gw, p, d = secure_fleet
    cfg = _with_token(ai_gateway_shape(gw.epp_port, d.url, gw.caller_token), gw.caller_token)
    (s1, completion), (s2, chat) = await _serve(gw, cfg, [COMPLETION, CHAT])
    assert (s1, s2) == (200, 200), (completion, chat)
    assert json.loads(completion)["kv_seen"]["remote_engine_id"] == "p1"  # decode read prefill's KV
    assert "data: [DONE]" in chat
    assert len(p.received) == 2 and len(d.received) == 2
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)


async def test_control_a_picker_serving_h2c_is_out_of_reach_of_the_generated_shape(fleet):
    """Negative control (the picker before secure serving): the same shape and token, 5xx, no gRPC call reached it."""
    gw, p, d = fleet
    cfg = _with_token(ai_gateway_shape(gw.epp_port, d.url, gw.caller_token), gw.caller_token)
    [(status, text)] = await _serve(gw, cfg, [COMPLETION])
    assert status >= 500, text
    assert p.received == [] and d.received == []
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)


async def test_with_the_patch_policy_both_routes_are_served_pd(secure_fleet):
    gw, p, d = secure_fleet
    cfg = patched(ai_gateway_shape(gw.epp_port, d.url, gw.caller_token), gw.epp_port, gw.caller_token)
    (s1, completion), (s2, chat) = await _serve(gw, cfg, [COMPLETION, CHAT])
    assert (s1, s2) == (200, 200), (completion, chat)
    assert json.loads(completion)["kv_seen"]["remote_engine_id"] == "p1"  # decode read prefill's KV
    assert "data: [DONE]" in chat
    assert len(p.received) == 2 and len(d.received) == 2
    assert all(r.headers["Authorization"] == f"Bearer {ENGINE_TOKEN}" for r in d.received)
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)


async def test_control_the_patch_without_the_token_is_refused(secure_fleet):
    gw, p, d = secure_fleet
    cfg = patched(ai_gateway_shape(gw.epp_port, d.url, gw.caller_token), gw.epp_port, None)
    [(status, text)] = await _serve(gw, cfg, [COMPLETION])
    assert status >= 500, text
    assert p.received == [] and d.received == []
    assert _refused(gw, caller_auth.MISSING) >= 1
