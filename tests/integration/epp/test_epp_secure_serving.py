"""Secure serving (connector/epp/tls.py) with raw gRPC clients: a secure EPP serves ext_proc over TLS only (a
plaintext client, even with the caller token, gets nothing and no leg runs), still behind the caller token, and
grpc.health.v1 in plaintext on its health port, which serves nothing else. Controls: the same TLS client is
served; the same plaintext client is served by an EPP serving h2c (before secure serving)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdfleet.connector.epp import caller_auth, tls
from pdfleet.contract.gateway import CALLER_TOKEN_METADATA, HEALTH_LIVENESS, HEALTH_READINESS
from test_epp_caller_auth import ENGINE_TOKEN, _raw_call, _refused, fleet  # noqa: F401
from test_epp_envoy_ai_gateway_shape import secure_fleet  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def _tls_channel(gw) -> grpc.aio.Channel:
    """A client that trusts the EPP's own certificate (its SANs name 127.0.0.1 and localhost)."""
    cert_pem, _ = gw.tls_pair
    return grpc.aio.secure_channel(f"127.0.0.1:{gw.epp_port}", grpc.ssl_channel_credentials(root_certificates=cert_pem))


def _token(gw):
    return ((CALLER_TOKEN_METADATA, gw.caller_token),)


async def test_a_plaintext_client_gets_nothing_from_a_secure_epp(secure_fleet):
    gw, p, d = secure_fleet
    received, code = await _raw_call(gw.epp_port, _token(gw))
    assert code == grpc.StatusCode.UNAVAILABLE and received == []
    assert p.received == [] and d.received == []
    assert all(_refused(gw, reason) == 0 for reason in caller_auth.REASONS)  # no call reached the check


async def test_control_a_tls_client_with_the_token_is_served(secure_fleet):
    gw, p, d = secure_fleet
    received, code = await _raw_call(gw.epp_port, _token(gw), channel=_tls_channel(gw))
    assert code is None and len(received) == 2
    assert f"Bearer {ENGINE_TOKEN}".encode() in received[1]
    assert len(p.received) == 1


async def test_control_the_plaintext_client_is_served_by_an_h2c_epp(fleet):
    gw, p, d = fleet
    received, code = await _raw_call(gw.epp_port, _token(gw))
    assert code is None and len(received) == 2 and len(p.received) == 1


async def test_tls_is_no_way_around_the_caller_token(secure_fleet):
    gw, p, d = secure_fleet
    received, code = await _raw_call(gw.epp_port, (), channel=_tls_channel(gw))
    assert code == grpc.StatusCode.UNAUTHENTICATED and received == []
    assert p.received == [] and _refused(gw, caller_auth.MISSING) == 1


async def _check(channel, service: str) -> int:
    reply = await asyncio.wait_for(health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service)), 10)
    return reply.status


@pytest.mark.parametrize("service", ["", HEALTH_LIVENESS, HEALTH_READINESS])
async def test_the_health_port_answers_in_plaintext_and_the_tls_port_over_tls(secure_fleet, service):
    """What the kubelet's gRPC probes ask (no TLS, no metadata), and a gateway's health check over TLS."""
    gw, _, _ = secure_fleet
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.health_port}") as channel:
        assert await _check(channel, service) == health_pb2.HealthCheckResponse.SERVING
    async with _tls_channel(gw) as channel:
        assert await _check(channel, service) == health_pb2.HealthCheckResponse.SERVING


async def test_the_health_port_serves_no_ext_proc(secure_fleet):
    """Plaintext, so it must not be a way to the decision, token or not."""
    gw, p, _ = secure_fleet
    received, code = await _raw_call(gw.health_port, _token(gw))
    assert code == grpc.StatusCode.UNIMPLEMENTED and received == []
    assert p.received == []


async def test_the_served_certificate_is_the_one_made_at_start(secure_fleet):
    """A client trusting another self-signed certificate fails the handshake: the EPP serves its own pair."""
    gw, p, _ = secure_fleet
    other, _ = tls.self_signed(tls.alt_names("127.0.0.1", ""), datetime.now(timezone.utc))
    channel = grpc.aio.secure_channel(f"127.0.0.1:{gw.epp_port}", grpc.ssl_channel_credentials(root_certificates=other))
    received, code = await _raw_call(gw.epp_port, _token(gw), channel=channel)
    assert code == grpc.StatusCode.UNAVAILABLE and received == [] and p.received == []
