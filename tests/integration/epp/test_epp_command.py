"""`pdfleet epp` as a real process behind a real Envoy, in front of fake engines; clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from pdfleet.connector.epp.envoy_process import free_port
from pdfleet.contract.env import EPP_CALLER_TOKEN
from pdfleet.contract.gateway import CERT_PATH_FLAG, HEALTH_LIVENESS, INSECURE_ANY_CALLER_FLAG, NO_SECURE_SERVING_FLAG
from grpc_health.v1 import health_pb2, health_pb2_grpc
import grpc

pytestmark = pytest.mark.timeout(60)


GOOD = ["--prefill", "http://a:1", "--decode", "http://c:3"]
TOKEN = "t" * 64


@pytest.mark.parametrize("argv, token, needle", [
    (["--grpc-port", "0", *GOOD], TOKEN, "--grpc-port must be 1..65535"),
    (["--grpc-port", "8000", "--port", "8000", *GOOD], TOKEN, "must differ"),
    (["--prefill", "a:1", "--decode", "http://c:3"], TOKEN, "must start with http://"),
    # the caller token (connector/epp/caller_auth.py): none and no flag saying every caller is served,
    # one too short to be the operator's, or both
    (GOOD, None, f"{EPP_CALLER_TOKEN} is not set"),
    (GOOD, "", f"{EPP_CALLER_TOKEN} is not set"),
    (GOOD, "t" * 31, "at least 32 characters"),
    (GOOD, "t" * 31 + " ", "at least 32 characters"),
    ([*GOOD, INSECURE_ANY_CALLER_FLAG], TOKEN, "exclude each other"),
    # secure serving (connector/epp/tls.py): the health port apart from the others, a folder with a pair
    (["--grpc-health-port", "9002", *GOOD], TOKEN, "--grpc-port and --grpc-health-port must differ"),
    ([CERT_PATH_FLAG, "/nonexistent", *GOOD], TOKEN, "--cert-path /nonexistent: cannot read tls.crt"),
    ([CERT_PATH_FLAG, "/tmp", NO_SECURE_SERVING_FLAG, *GOOD], TOKEN, f"{CERT_PATH_FLAG} needs"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, token, needle):
    env = {k: v for k, v in os.environ.items() if k != EPP_CALLER_TOKEN}
    if token is not None:
        env[EPP_CALLER_TOKEN] = token
    proc = subprocess.run([sys.executable, "-m", "pdfleet.operator.cli", "epp", *argv], capture_output=True,
                          text=True, timeout=30, env=env)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


async def test_epp_process_serves_p_d_through_envoy(gw):
    """By default over TLS (a self-signed certificate made at start), Envoy speaking it without verification, and
    grpc.health.v1 in plaintext on the health port."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    grpc_port, http_port, health_port = free_port(), free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdfleet.operator.cli", "epp", "--prefill", p.url, "--decode", d.url,
        "--grpc-port", str(grpc_port), "--port", str(http_port), "--grpc-health-port", str(health_port),
        "--log-level", "WARNING", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, EPP_CALLER_TOKEN: gw.caller_token})
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"epp: ext_proc on" in line and b"(TLS)" in line, line
        await gw.start([p], [d], epp=False, epp_port=grpc_port, envoy={"epp_tls": True})  # Envoy dials its port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            reply = await asyncio.wait_for(health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=HEALTH_LIVENESS)), 10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200
            assert (await r.json())["kv_seen"]["remote_engine_id"] == "p1"
        async with gw.session.get(f"http://127.0.0.1:{http_port}/health") as r:
            assert r.status == 200 and (await r.json())["decode_ready"] == 1
        async with gw.session.get(f"http://127.0.0.1:{http_port}/metrics") as r:
            assert "pdfleet_epp_decision_seconds_count 1.0" in await r.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
    assert rc == 0
