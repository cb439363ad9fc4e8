"""The walkthrough's EnvoyPatchPolicy (examples/quickstart-gateway/envoy-patch-policy.yaml) through a real Envoy
configured as Envoy AI Gateway configures an InferencePool (envoyproxy/ai-gateway internal/extensionserver/
inferencepool.go): the pool's ext_proc filter named .../endpointpicker/<pool>_<namespace>_ext_proc, both body modes
FULL_DUPLEX_STREAMED, trailers SEND, 300 s message timeout, FailClose, no metadata, and the picker's cluster over
TLS (no verification). Envoy Gateway applies EnvoyPatchPolicies before AI Gateway adds that filter and cluster, so
the policy cannot touch them; it adds a plaintext cluster and a per-route ext_proc override instead.

As generated, the gateway cannot reach pdfleet's picker (h2c): every request is a 5xx and no engine is called.
With the policy's two patches applied as Envoy Gateway applies them, requests are served P/D; the same patches
without the token are refused by the picker (negative control)."""

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


async def test_as_ai_gateway_generates_it_the_gateway_cannot_reach_the_picker(fleet):
    """Its picker cluster speaks TLS; pdfleet's picker serves h2c: FailClose 5xx, no leg ran."""
    gw, p, d = fleet
    cfg = ai_gateway_shape(gw.epp_port, d.url, gw.caller_token)
    [(status, text)] = await _serve(gw, cfg, [COMPLETION])
    assert status >= 500, text
    assert p.received == [] and d.received == []
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)  # no gRPC call reached it


async def test_control_without_tls_the_same_shape_reaches_the_picker(fleet):
    """Control for the test above: its cluster without the TLS socket, the picker gets the call (and refuses
    it: AI Gateway sends no caller token), so TLS is what kept the gateway out."""
    gw, p, d = fleet
    cfg = ai_gateway_shape(gw.epp_port, d.url, gw.caller_token)
    for cluster in cfg["static_resources"]["clusters"]:
        cluster.pop("transport_socket", None)
    [(status, text)] = await _serve(gw, cfg, [COMPLETION])
    assert status >= 500, text
    assert _refused(gw, caller_auth.MISSING) >= 1


async def test_with_the_patch_policy_both_routes_are_served_pd(fleet):
    gw, p, d = fleet
    cfg = patched(ai_gateway_shape(gw.epp_port, d.url, gw.caller_token), gw.epp_port, gw.caller_token)
    (s1, completion), (s2, chat) = await _serve(gw, cfg, [COMPLETION, CHAT])
    assert (s1, s2) == (200, 200), (completion, chat)
    assert json.loads(completion)["kv_seen"]["remote_engine_id"] == "p1"  # decode read prefill's KV
    assert "data: [DONE]" in chat
    assert len(p.received) == 2 and len(d.received) == 2
    assert all(r.headers["Authorization"] == f"Bearer {ENGINE_TOKEN}" for r in d.received)
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)


async def test_control_the_patch_without_the_token_is_refused(fleet):
    gw, p, d = fleet
    cfg = patched(ai_gateway_shape(gw.epp_port, d.url, gw.caller_token), gw.epp_port, None)
    [(status, text)] = await _serve(gw, cfg, [COMPLETION])
    assert status >= 500, text
    assert p.received == [] and d.received == []
    assert _refused(gw, caller_auth.MISSING) >= 1
