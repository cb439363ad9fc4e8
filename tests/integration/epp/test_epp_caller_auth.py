"""Only the fleet's gateway may call the Endpoint Picker (connector/epp/caller_auth.py), through a real
Envoy and a raw gRPC client: the gateway that sends the caller token is served; a caller without it, with
another token or with one that differs in its last byte gets UNAUTHENTICATED before the EPP reads a
message, so it never sees the engine token or decode's address and no prefill leg runs for it.
Negative control: with the check switched off, the same raw client receives the engine token."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from pdfleet.connector.epp import caller_auth
from pdfleet.connector.epp.envoy_config import render
from pdfleet.connector.epp.envoy_process import Envoy
from pdfleet.contract.env import ENGINE_API_KEY
from pdfleet.contract.gateway import CALLER_TOKEN_METADATA
from pdfleet.contract.metrics import EPP_DROPPED_MESSAGES, EPP_UNAUTHENTICATED

pytestmark = pytest.mark.timeout(60)

ENGINE_TOKEN = "fleet-engine-token-0123456789"
BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 3}).encode()


def _requests():
    headers = [(":method", "POST"), (":path", "/v1/completions"), (":authority", "gw"),
               ("content-type", "application/json")]
    yield pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers])))
    yield pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))


async def _raw_call(port: int, metadata, channel=None) -> tuple[list[bytes], grpc.StatusCode | None]:
    """One ext_proc stream as any pod could open it, BUFFERED as Envoy drives it (headers, their ack, the
    body, the decision): what it received (serialized replies) and its status (None: the decision came and
    the stream was then cancelled). Each message waits for the previous reply: grpc.aio's client reports a
    write after the server's status as INTERNAL instead of that status. ``channel``: another than h2c to port."""
    received: list[bytes] = []
    async with channel or grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process(metadata=metadata)
        try:
            async with asyncio.timeout(10):
                for request in _requests():
                    await call.write(request)
                    reply = await call.read()
                    if reply is grpc.aio.EOF:
                        break
                    received.append(reply.SerializeToString())
        except grpc.aio.AioRpcError:
            pass  # the server ended the call: its status follows
        if len(received) == 2:
            call.cancel()
            return received, None
        return received, await asyncio.wait_for(call.code(), 10)


def _refused(gw, reason: str) -> float:
    return gw.epp.router.metrics.registry.get_sample_value(f"{EPP_UNAUTHENTICATED}_total", {"reason": reason}) or 0.0


def _last_byte_changed(token: str) -> str:
    return token[:-1] + ("1" if token[-1] == "0" else "0")


@pytest.fixture
async def fleet(gw, monkeypatch):
    monkeypatch.setenv(ENGINE_API_KEY, ENGINE_TOKEN)
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d])
    return gw, p, d


async def test_the_gateway_with_the_token_is_served(fleet):
    gw, p, d = fleet
    async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["kv_seen"]["remote_engine_id"] == "p1"
    assert d.received[0].headers["Authorization"] == f"Bearer {ENGINE_TOKEN}"
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)


@pytest.mark.parametrize("wrong", ["another", "last byte"])
async def test_a_gateway_with_another_token_is_refused(fleet, wrong):
    """Envoy configured with another fleet's token, or the fleet's with its last byte changed: the EPP
    refuses the stream, FailClose answers 5xx, no leg ran."""
    gw, p, d = fleet
    token = "another0fleets0token" * 4 if wrong == "another" else _last_byte_changed(gw.caller_token)
    await gw.close_envoy()
    await gw.start_envoy(caller_token=token)
    async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
        assert r.status >= 500
        assert ENGINE_TOKEN not in await r.text()
    assert p.received == [] and d.received == []
    assert _refused(gw, caller_auth.MISMATCH) >= 1


@pytest.mark.parametrize("how, reason", [
    ("none", caller_auth.MISSING),
    ("another", caller_auth.MISMATCH),
    ("last byte", caller_auth.MISMATCH),
    ("twice", caller_auth.REPEATED),
])
async def test_a_raw_client_without_the_token_gets_unauthenticated(fleet, how, reason):
    gw, p, d = fleet
    metadata = {"none": (), "another": ((CALLER_TOKEN_METADATA, "f" * 64),),
                "last byte": ((CALLER_TOKEN_METADATA, _last_byte_changed(gw.caller_token)),),
                "twice": ((CALLER_TOKEN_METADATA, "f" * 64), (CALLER_TOKEN_METADATA, gw.caller_token))}[how]
    received, code = await _raw_call(gw.epp_port, metadata)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert received == []  # nothing at all: no ack, no decode address, no engine token
    assert p.received == [] and d.received == []  # no prefill leg ran for it
    assert _refused(gw, reason) == 1


async def test_the_health_service_stays_open(fleet):
    """grpc.health.v1 is not behind the token (the kubelet's gRPC probes send no metadata): answered (or
    UNIMPLEMENTED where no health servicer is registered), never UNAUTHENTICATED."""
    gw, _, _ = fleet
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.epp_port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            await asyncio.wait_for(check(b""), 10)  # an empty HealthCheckRequest: the server's health
        except grpc.aio.AioRpcError as exc:
            assert exc.code() != grpc.StatusCode.UNAUTHENTICATED
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)


async def test_control_a_raw_client_with_the_token_sees_what_is_guarded(fleet):
    """Control for the test above: the same raw client, with the token, gets the decision (the engine
    token and decode's address) and prefill ran: the refusal is what keeps them from a caller without it."""
    gw, p, d = fleet
    received, code = await _raw_call(gw.epp_port, ((CALLER_TOKEN_METADATA, gw.caller_token),))
    assert code is None and len(received) == 2
    assert f"Bearer {ENGINE_TOKEN}".encode() in received[1] and d.url.removeprefix("http://").encode() in received[1]
    assert len(p.received) == 1


async def test_control_without_the_check_the_raw_client_gets_the_engine_token(fleet, monkeypatch):
    """Negative control: the check switched off (every verdict "allowed"), a raw client with no token
    receives `authorization: Bearer <engine token>` and has a prefill leg run: the old behaviour."""
    gw, p, d = fleet
    monkeypatch.setattr(caller_auth, "verdict", lambda metadata, expected: None)
    received, code = await _raw_call(gw.epp_port, ())
    assert code is None and len(received) == 2
    assert f"Bearer {ENGINE_TOKEN}".encode() in received[1]
    assert len(p.received) == 1


def _per_route_config(gw, token: str | None) -> str:
    """The shipped BUFFERED config as gateways that configure the EPP per route shape it (Istio and kgateway
    attach the InferencePool's ext_proc as a route's ExtProcPerRoute): no initial_metadata on the filter;
    the token, if any, in each route's overrides.grpc_initial_metadata."""
    cfg = yaml.safe_load(render("buffered", listen_port=0, epp_port=gw.epp_port, admin_port=0,
                                caller_token=gw.caller_token, decode_only=(gw.engines[1].url,)))
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (ext,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
    del ext["typed_config"]["grpc_service"]["initial_metadata"]
    if token is not None:
        for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
            route["typed_per_filter_config"] = {"envoy.filters.http.ext_proc": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
                "overrides": {"grpc_initial_metadata": [{"key": CALLER_TOKEN_METADATA, "value": token}]}}}
    return yaml.safe_dump(cfg)


@pytest.mark.parametrize("per_route", [True, False])
async def test_the_token_can_come_from_the_routes_ext_proc_override(fleet, per_route):
    """docs/gateway.md's setting for gateways that configure the EPP per route: ExtProcPerRoute
    overrides.grpc_initial_metadata carries the token, and the gateway is served. Control: the same config
    without the override is refused (5xx, no leg)."""
    gw, p, d = fleet
    await gw.close_envoy()
    envoy = Envoy(_per_route_config(gw, gw.caller_token if per_route else None))
    await asyncio.to_thread(envoy.start)
    try:
        url = f"http://127.0.0.1:{envoy.listener_port()}"
        async with gw.session.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
            assert (r.status == 200) is per_route, await r.text()
    finally:
        await asyncio.to_thread(envoy.stop)
    assert len(p.received) == (1 if per_route else 0)
    assert _refused(gw, caller_auth.MISSING) == (0 if per_route else 1)


async def test_a_key_holder_repeating_headers_on_one_stream_decides_once_and_leaves_nothing_held(fleet):
    """Even the gateway (it holds the token) is a peer to distrust: 1,000 request-headers messages (each a
    whole GET) on one stream are one request. The first decides; the rest are dropped and counted, and when
    the stream ends no decode stays held (issue 38). Negative control: before, each message took a decode
    slot, and a decode's in-flight count stayed at 999 after the stream ended."""
    gw, p, d = fleet
    headers = [(":method", "GET"), (":path", "/v1/models"), (":authority", "gw")]
    message = pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=True, headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers])))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.epp_port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process(metadata=((CALLER_TOKEN_METADATA, gw.caller_token),))
        for _ in range(1000):
            await call.write(message)
        await call.done_writing()
        replies = 0
        async with asyncio.timeout(10):
            while (await call.read()) is not grpc.aio.EOF:
                replies += 1
    picker = gw.epp.router.picker
    for _ in range(100):  # the stream's end gives back what it held
        if not picker.outstanding.counts:
            break
        await asyncio.sleep(0.02)
    assert replies == 1
    assert picker.outstanding.counts == {}
    dropped = gw.epp.router.metrics.registry.get_sample_value(f"{EPP_DROPPED_MESSAGES}_total",
                                                              {"reason": "repeated_request_headers"})
    assert dropped == 999
