"""The Endpoint Picker behind a real Envoy configured like GAIE's own test Envoy (gaie_shapes/envoy.yaml),
not pdfleet's rendered configs: every request and response body mode Envoy 1.40 accepts, completions and
chat, streamed and not; the response-headers-skipped shape; gRPC health as the gateway checks it.

One EPP and one pair of fake engines serve the whole body-mode matrix (one Envoy per combination); tests
whose point is what the EPP learns of its gateway get an EPP of their own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from pathlib import Path
from string import Template

import aiohttp
import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from router_fakes import FakeEngine

from pdfleet.connector.epp.envoy_process import Envoy, envoy_binary
from pdfleet.connector.epp.server import EndpointPicker
from pdfleet.connector.serving.router_state import static_groups
from pdfleet.contract.gateway import EXT_PROC_SERVICE, HEALTH_LIVENESS, HEALTH_READINESS
from pdfleet.contract.router_config import RouterConfig

pytestmark = pytest.mark.asyncio(loop_scope="module")

SHAPE = Template((Path(__file__).parent / "gaie_shapes" / "envoy.yaml").read_text())
BODY_MODES = ("BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED")
FD = "FULL_DUPLEX_STREAMED"
FAST = dict(connect_timeout_s=1.0, prefill_timeout_s=2.0, decode_first_byte_timeout_s=2.0,
            decode_idle_timeout_s=2.0, eject_s=0.0)


def shape(epp_port: int, request_body_mode: str, response_body_mode: str, *, response_header_mode: str = "SEND",
          allow_mode_override: bool = False) -> str:
    """GAIE's test Envoy with these modes; trailers SEND where Envoy requires it (FULL_DUPLEX_STREAMED)."""
    return SHAPE.substitute(
        epp_port=epp_port, request_body_mode=request_body_mode, response_body_mode=response_body_mode,
        response_header_mode=response_header_mode, allow_mode_override=str(allow_mode_override).lower(),
        request_trailer_mode="SEND" if request_body_mode == FD else "SKIP",
        response_trailer_mode="SEND" if response_body_mode == FD else "SKIP")


class Fleet:
    def __init__(self) -> None:
        self.prefill = FakeEngine(name="p1", role="prefill")
        self.decode = FakeEngine(name="d1", role="decode")
        self.epps: list[EndpointPicker] = []
        self.envoys: list[Envoy] = []
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await self.prefill.start()
        await self.decode.start()
        self.session = aiohttp.ClientSession()

    async def epp(self) -> EndpointPicker:
        epp = EndpointPicker(RouterConfig(prefill=(self.prefill.url,), decode=(self.decode.url,), **FAST),
                             any_caller=True)  # GAIE's Envoy sends no caller token
        epp.port = await epp.start("127.0.0.1", 0)
        self.epps.append(epp)
        return epp

    async def envoy(self, config: str) -> str:
        envoy = Envoy(config)
        await asyncio.to_thread(envoy.start)
        self.envoys.append(envoy)
        return f"http://127.0.0.1:{envoy.listener_port('vllm')}"

    async def close(self) -> None:
        for envoy in self.envoys:
            await asyncio.to_thread(envoy.stop)
        for epp in self.epps:
            await epp.stop(grace=0)
        await self.session.close()
        await self.prefill.stop()
        await self.decode.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet():
    f = Fleet()
    await f.start()
    try:
        yield f
    finally:
        await f.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_epp(fleet):
    return await fleet.epp()


def client_gone(epp: EndpointPicker) -> float:
    return sum(s.value for m in epp.router.metrics.registry.collect() for s in m.samples
               if s.name.endswith("kv_releases_total") and s.labels.get("reason") == "client_gone")


def _two_pieces(data: bytes):
    """A request body the proxy receives in two pieces (a STREAMED body then arrives as two messages)."""
    async def gen():
        yield data[:12]
        await asyncio.sleep(0.05)
        yield data[12:]
    return gen()


async def _ask(session, url: str, *, chat: bool, stream: bool, pieces: bool) -> tuple[int, list]:
    """One generation request; the texts it got back (stream: one per event, then [DONE])."""
    body = {"model": "tiny", "max_tokens": 3, "stream": stream}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    data = json.dumps(body).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with asyncio.timeout(10):
        async with session.post(url + path, data=_two_pieces(data) if pieces else data,
                                headers={"content-type": "application/json"}) as r:
            raw = await r.read()
    if r.status != 200:
        return r.status, [raw.decode(errors="replace")]
    if not stream:
        answer = json.loads(raw)
        return 200, [answer["kv_seen"]["remote_engine_id"], answer["choices"][0]]
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    return 200, [e.decode() if e == b"[DONE]" else json.loads(e)["choices"][0] for e in events]


# Every pair but one: a STREAMED request beside a FULL_DUPLEX_STREAMED response cannot carry the EPP's
# choice (Envoy takes no mode_override there; test_streamed_request_body_without_override...).
PAIRS = [(rq, rs) for rq in BODY_MODES for rs in BODY_MODES if (rq, rs) != ("STREAMED", FD)]


@pytest.mark.parametrize("request_mode, response_mode", PAIRS)
async def test_every_body_mode_pair_serves_completions_and_chat(fleet, shared_epp, request_mode, response_mode):
    """Negative control: the EPP's old answer to a response body chunk (an empty BodyResponse, right only
    for STREAMED) fails every FULL_DUPLEX_STREAMED response with 500 here (Envoy: "Spurious response
    message"), and a STREAMED request body in two pieces went to no destination (503)."""
    # STREAMED request bodies need the EPP's BUFFERED override: GAIE-shaped configs that stream request
    # bodies let it (allow_mode_override); test_streamed_request_body_without_override covers the rest.
    url = await fleet.envoy(shape(shared_epp.port, request_mode, response_mode,
                                  allow_mode_override=request_mode == "STREAMED"))
    before = (len(fleet.prefill.received), len(fleet.decode.received), client_gone(shared_epp))
    for chat in (False, True):
        for stream in (False, True):
            status, got = await _ask(fleet.session, url, chat=chat, stream=stream, pieces=request_mode == "STREAMED")
            assert status == 200, (chat, stream, got)
            if stream:
                texts = [g if g == "[DONE]" else (g["delta"]["content"] if chat else g["text"]) for g in got]
                assert texts == ["t0", "t1", "t2", "[DONE]"], (chat, texts)
            else:
                assert got[0] == "p1"  # decode read prefill's kv_transfer_params
                assert (got[1]["message"]["content"] if chat else got[1]["text"]) == "hello world"
    assert (len(fleet.prefill.received), len(fleet.decode.received), client_gone(shared_epp)) == (
        before[0] + 4, before[1] + 4, before[2])  # one prefill leg each: no release after the answer
    for _ in range(50):  # every exchange gave its decode back
        if not shared_epp.router.picker.outstanding.counts:
            break
        await asyncio.sleep(0.02)
    assert shared_epp.router.picker.outstanding.counts == {}


@pytest.mark.parametrize("direction", ["request", "response"])
async def test_envoy_refuses_full_duplex_without_trailers(direction):
    """The only body-mode combinations Envoy 1.40 refuses: FULL_DUPLEX_STREAMED with that direction's
    trailer mode SKIP (every BUFFERED / STREAMED / FULL_DUPLEX_STREAMED pair loads with trailers SEND)."""
    config = shape(9, FD, FD).replace(f"{direction}_trailer_mode: SEND", f"{direction}_trailer_mode: SKIP")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(config)
        f.flush()
        done = await asyncio.to_thread(subprocess.run, [envoy_binary(), "--mode", "validate", "-c", f.name],
                                       capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"{direction}_body_mode set to FULL_DUPLEX_STREAMED" in done.stdout + done.stderr


@pytest.mark.parametrize("response_mode, allow_mode_override", [("STREAMED", False), (FD, True)],
                         ids=["not_allowed", "beside_full_duplex"])
async def test_streamed_request_body_without_override_is_refused_naming_the_setting(fleet, shared_epp, response_mode,
                                                                                     allow_mode_override):
    """Where Envoy takes no mode_override (allow_mode_override unset, or a FULL_DUPLEX_STREAMED response) the
    proxy sends a STREAMED request's headers on before the body: the EPP cannot name a decode any more, and
    says why instead of letting it go nowhere. Negative control: the old EPP ran no check, and GAIE's shape
    answered 503 "no healthy upstream" (the ORIGINAL_DST cluster had no destination header)."""
    url = await fleet.envoy(shape(shared_epp.port, "STREAMED", response_mode, allow_mode_override=allow_mode_override))
    before = len(fleet.prefill.received)
    status, got = await _ask(fleet.session, url, chat=False, stream=False, pieces=True)
    assert status == 500 and "allow_mode_override" in got[0]
    assert len(fleet.prefill.received) == before  # nothing ran for it


@pytest.mark.parametrize("allow_mode_override", [False, True], ids=["skip", "override"])
async def test_response_headers_skipped_costs_no_release(fleet, allow_mode_override):
    """GAIE's earlier test Envoy: BUFFERED, response_header_mode SKIP. Negative control: the EPP took each
    exchange's end for a client that left and released the lease: 2 prefill calls per request and
    kv_releases{reason="client_gone"} 3. With allow_mode_override the EPP asks for response headers
    (mode_override) and gets decode's status."""
    epp = await fleet.epp()  # its own: what it learns of the gateway is the point
    url = await fleet.envoy(shape(epp.port, "BUFFERED", "NONE", response_header_mode="SKIP",
                                  allow_mode_override=allow_mode_override))
    before = len(fleet.prefill.received)
    for _ in range(3):
        assert (await _ask(fleet.session, url, chat=False, stream=False, pieces=False))[0] == 200
    await asyncio.sleep(0.2)  # a release would be on its way by now
    assert len(fleet.prefill.received) - before == 3
    assert client_gone(epp) == 0
    assert epp.modes.responds("BUFFERED", "NONE") is allow_mode_override


async def _health(port: int, name: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=name),
                                                                 timeout=5)
        return reply.status


async def test_grpc_health_as_the_gateway_and_kubelet_ask(fleet, shared_epp):
    """GAIE's test Envoy health-checks the EPP cluster over gRPC on the ext_proc service's name. Negative
    control: before grpc.health.v1, Check answered UNIMPLEMENTED and Envoy counted a failure."""
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in ("", HEALTH_LIVENESS, HEALTH_READINESS, EXT_PROC_SERVICE):
        assert await _health(shared_epp.port, name) == serving, name
    await fleet.envoy(shape(shared_epp.port, FD, FD))  # it checks at start (no traffic yet: once)
    envoy = fleet.envoys[-1]
    for _ in range(50):
        stats = await asyncio.to_thread(envoy.stats)
        if stats.get("cluster.ext_proc.health_check.success", 0) >= 1:
            break
        await asyncio.sleep(0.1)
    assert stats.get("cluster.ext_proc.health_check.success", 0) >= 1
    assert stats.get("cluster.ext_proc.health_check.failure", 0) == 0


async def test_readiness_waits_for_ready_endpoints():
    """No serving revision with ready endpoints yet: alive, not ready; ready once discovery finds one."""
    found = asyncio.Event()

    async def discovery(router):  # finds the fleet only when told to
        await found.wait()
        router.set_endpoints(static_groups(router.config))
        await asyncio.Event().wait()

    epp = EndpointPicker(RouterConfig(prefill=("http://127.0.0.1:9",), decode=("http://127.0.0.1:10",), **FAST),
                         discovery=discovery, any_caller=True)
    port = await epp.start("127.0.0.1", 0)
    try:
        not_serving, serving = health_pb2.HealthCheckResponse.NOT_SERVING, health_pb2.HealthCheckResponse.SERVING
        assert await _health(port, HEALTH_LIVENESS) == serving and await _health(port, "") == serving
        assert await _health(port, HEALTH_READINESS) == not_serving
        assert await _health(port, EXT_PROC_SERVICE) == not_serving
        found.set()
        for _ in range(40):
            if await _health(port, HEALTH_READINESS) == serving:
                break
            await asyncio.sleep(0.1)
        assert await _health(port, HEALTH_READINESS) == serving
        assert await _health(port, EXT_PROC_SERVICE) == serving
    finally:
        await epp.stop(grace=0)
