"""The Endpoint Picker's pure rules (connector/epp/protocol.py) and its Envoy configs (envoy_config.py)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from pdfleet.connector.epp import protocol
from pdfleet.connector.epp.envoy_config import BUFFERED, FULL_DUPLEX, render
from pdfleet.connector.epp.envoy_process import envoy_binary
from pdfleet.connector.serving import lease_release
from pdfleet.contract.gateway import (
    CALLER_TOKEN_METADATA,
    DESTINATION_ENDPOINT_HEADER,
    FAIL_CLOSE,
    FAIL_OPEN,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
)


@pytest.mark.parametrize("url, address", [
    ("http://10.0.0.7:8000", "10.0.0.7:8000"),
    ("http://10.0.0.7:8000/", "10.0.0.7:8000"),
    ("http://[fd00::7]:8000", "[fd00::7]:8000"),
])
def test_endpoint_address(url, address):
    assert protocol.endpoint_address(url) == address


@pytest.mark.parametrize("url", ["http://10.0.0.7", "10.0.0.7:8000", "http://:80"])
def test_endpoint_address_needs_host_and_port(url):
    with pytest.raises(ValueError, match="host:port"):
        protocol.endpoint_address(url)


@pytest.mark.parametrize("metadata, subset", [
    ({}, None),
    ({SUBSET_HINT_NAMESPACE: {}}, None),
    ({"other": {SUBSET_HINT_KEY: ["1.1.1.1:80"]}}, None),
    ({SUBSET_HINT_NAMESPACE: {SUBSET_HINT_KEY: []}}, frozenset()),
    ({SUBSET_HINT_NAMESPACE: {SUBSET_HINT_KEY: ["1.1.1.1:80", " 2.2.2.2:80 "]}},
     frozenset({"1.1.1.1:80", "2.2.2.2:80"})),
    ({SUBSET_HINT_NAMESPACE: {SUBSET_HINT_KEY: "1.1.1.1:80,2.2.2.2:80"}}, frozenset({"1.1.1.1:80", "2.2.2.2:80"})),
    ({SUBSET_HINT_NAMESPACE: {SUBSET_HINT_KEY: ""}}, frozenset()),
])
def test_subset_hint(metadata, subset):
    assert protocol.subset_hint(metadata) == subset


@pytest.mark.parametrize("value", [7, {"a": 1}, ["1.1.1.1:80", 3]])
def test_a_bad_subset_names_the_key(value):
    with pytest.raises(protocol.BadSubset, match=SUBSET_HINT_KEY):
        protocol.subset_hint({SUBSET_HINT_NAMESPACE: {SUBSET_HINT_KEY: value}})


@pytest.mark.parametrize("subset, kept", [
    (None, ("http://1.1.1.1:80", "http://2.2.2.2:80")),
    (frozenset(), ()),
    (frozenset({"2.2.2.2:80"}), ("http://2.2.2.2:80",)),
    (frozenset({"9.9.9.9:80"}), ()),
])
def test_within_subset(subset, kept):
    assert protocol.within(("http://1.1.1.1:80", "http://2.2.2.2:80"), subset) == kept


def test_decode_body_adds_params_without_touching_the_request():
    """What the Endpoint Picker hands the proxy for decode (the pipeline's decode_body, the router's too)."""
    from pdfleet.connector.serving.router_state import RouterState
    from pdfleet.contract.router_config import RouterConfig

    pipeline = RouterState(RouterConfig(prefill=("http://p:1",), decode=("http://d:1",))).pipeline
    served = pipeline.read("/v1/completions", {}, b'{"prompt": "x", "max_tokens": 3}')
    body = served.request.body
    assert pipeline.decode_body(served) == body and "kv_transfer_params" not in body  # prefill failed or skipped
    served.kv_params = {"a": 1}
    assert pipeline.decode_body(served) == {"prompt": "x", "max_tokens": 3, "kv_transfer_params": {"a": 1}}
    assert "kv_transfer_params" not in body


@pytest.mark.parametrize("status, verdict", [
    (None, lease_release.CLIENT_GONE),
    (200, protocol.TAKEN),
    (399, protocol.TAKEN),
    (400, lease_release.DECODE_REFUSED),
    (429, lease_release.DECODE_REFUSED),
    (500, lease_release.DECODE_FAILED),
    (503, lease_release.DECODE_FAILED),
])
def test_lease_verdict(status, verdict):
    assert protocol.lease_verdict(status) == verdict


def test_header_map_lowercases_and_decodes():
    assert protocol.header_map([("X-Request-Id", b"a"), (":path", "/v1/completions")]) == {
        "x-request-id": "a", ":path": "/v1/completions"}


TOKEN = "0123456789abcdef" * 4


def _config(mode=BUFFERED, **kw):
    args = dict(listen_port=10000, epp_port=9002, admin_port=9901, decode_only=("http://10.0.0.8:8000",),
                caller_token=TOKEN)
    args.update(kw)
    return yaml.safe_load(render(mode, **args))


def _ext_proc(cfg):
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm, {f["name"]: f["typed_config"] for f in hcm["http_filters"]}


@pytest.mark.parametrize("mode, body_mode", [(BUFFERED, "BUFFERED"), (FULL_DUPLEX, "FULL_DUPLEX_STREAMED")])
def test_configs_are_gaie_reference_shape(mode, body_mode):
    cfg = _config(mode)
    hcm, filters = _ext_proc(cfg)
    names = [f["name"] for f in hcm["http_filters"]]
    # the client's destination header is removed before ext_proc names one; the router runs last
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    ext = filters["envoy.filters.http.ext_proc"]
    assert ext["processing_mode"]["request_body_mode"] == body_mode
    assert ext["processing_mode"]["response_header_mode"] == "SEND"
    pool = {c["name"]: c for c in cfg["static_resources"]["clusters"]}["pool"]
    assert pool["type"] == "ORIGINAL_DST" and pool["original_dst_lb_config"] == {
        "use_http_header": True, "http_header_name": DESTINATION_ENDPOINT_HEADER}
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    assert route["route"] == {"cluster": "pool", "timeout": "0s"}  # no route timeout cuts a long answer


@pytest.mark.parametrize("failure_mode, allow, fallback", [(FAIL_OPEN, True, 1), (FAIL_CLOSE, False, 0)])
def test_failure_mode(failure_mode, allow, fallback):
    hcm, filters = _ext_proc(_config(failure_mode=failure_mode))
    assert filters["envoy.filters.http.ext_proc"]["failure_mode_allow"] is allow
    assert len(hcm["route_config"]["virtual_hosts"][0]["routes"][1]["response_headers_to_add"]) == fallback


def test_message_timeout_and_decode_only_endpoints():
    cfg = _config(message_timeout_s=300)
    assert _ext_proc(cfg)[1]["envoy.filters.http.ext_proc"]["message_timeout"] == "300.000s"
    decode_only = {c["name"]: c for c in cfg["static_resources"]["clusters"]}["decode_only"]
    assert decode_only["load_assignment"]["endpoints"][0]["lb_endpoints"] == [
        {"endpoint": {"address": {"socket_address": {"address": "10.0.0.8", "port_value": 8000}}}}]


def _keepalive(cfg):
    epp = {c["name"]: c for c in cfg["static_resources"]["clusters"]}["epp"]
    options = epp["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    return options["explicit_http_config"]["http2_protocol_options"]["connection_keepalive"]


@pytest.mark.parametrize("mode", [BUFFERED, FULL_DUPLEX])
def test_the_epp_connection_is_pinged(mode):
    """Shipped: 10 s + 5 s, far under message_timeout (300 s), which would otherwise be the wait on an
    EPP gone silent (tests/integration/epp/test_epp_failures.py shows it with a real Envoy)."""
    assert _keepalive(_config(mode)) == {"interval": "10.000s", "timeout": "5.000s"}
    assert _keepalive(_config(mode, keepalive_interval_s=1, keepalive_timeout_s=0.5)) == {
        "interval": "1.000s", "timeout": "0.500s"}


@pytest.mark.parametrize("kw, match", [
    (dict(mode="streamed"), "gateway mode"),
    (dict(failure_mode="Open"), "failureMode"),
    (dict(message_timeout_s=0), "message_timeout_s"),
    (dict(keepalive_interval_s=0), "keepalive_interval_s"),
    (dict(keepalive_timeout_s=0.0001), "keepalive_timeout_s"),
    (dict(keepalive_timeout_s=float("nan")), "keepalive_timeout_s"),
    (dict(caller_token="short"), "PDFLEET_EPP_CALLER_TOKEN must be at least 32"),
    (dict(caller_token=TOKEN[:-1] + '"'), "a letter, a digit"),  # not a char that would break the YAML either
])
def test_bad_arguments_name_the_field(kw, match):
    mode = kw.pop("mode", BUFFERED)
    with pytest.raises(ValueError, match=match):
        _config(mode, **kw)


@pytest.mark.parametrize("mode", [BUFFERED, FULL_DUPLEX])
def test_every_ext_proc_stream_carries_the_caller_token(mode):
    """The EPP serves only callers that send the fleet's token (connector/epp/caller_auth.py)."""
    grpc_service = _ext_proc(_config(mode))[1]["envoy.filters.http.ext_proc"]["grpc_service"]
    assert grpc_service["initial_metadata"] == [{"key": CALLER_TOKEN_METADATA, "value": TOKEN}]


@pytest.mark.parametrize("mode", [BUFFERED, FULL_DUPLEX])
def test_envoy_accepts_the_rendered_config(mode, tmp_path):
    """Envoy's own check of the whole bootstrap (--mode validate), initial_metadata included."""
    path = tmp_path / "envoy.yaml"
    path.write_text(render(mode, listen_port=10000, epp_port=9002, admin_port=9901, caller_token=TOKEN,
                           decode_only=("http://10.0.0.8:8000",)))
    proc = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
