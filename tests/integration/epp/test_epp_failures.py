"""Failure modes of the gateway path (issue 29): the EPP down (FailOpen / FailClose), restarted
under load, stuck, a slow prefill leg against the proxy's ext_proc timeouts, and the prefill lease
released when no decode will read it. Each test holds its own negative control or says which
removal makes it fail."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest

from pdfleet.connector.epp.exchange import Exchange
from pdfleet.connector.serving import lease_release
from pdfleet.contract.gateway import FAIL_CLOSE, FAIL_OPEN
from pdfleet.contract.routing import FALLBACK_DECODE_ONLY, FALLBACK_HEADER

BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 4}


def _releases(gw, reason: str) -> float:
    return gw.epp.router.metrics.registry.get_sample_value(
        "pdfleet_router_kv_releases_total", {"reason": reason, "outcome": lease_release.ACCEPTED}) or 0.0


async def _answered_per_failure_mode(gw, failure_mode: str, *, bound_s: float, within_s: float = 4.0) -> dict | None:
    """One request while the EPP cannot answer: FailClose a 5xx, FailOpen decode's own answer (returned),
    within ``within_s``; ``bound_s`` turns a hang into a failure (TimeoutError)."""
    started = time.monotonic()
    answer = None
    async with asyncio.timeout(bound_s):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
            if failure_mode == FAIL_CLOSE:
                assert r.status >= 500 and FALLBACK_HEADER not in r.headers
            else:
                assert r.status == 200 and r.headers[FALLBACK_HEADER] == FALLBACK_DECODE_ONLY
                answer = await r.json()
    assert time.monotonic() - started < within_s
    return answer


@pytest.mark.parametrize("mode, reason, status", [
    ("http500", lease_release.DECODE_FAILED, 500),
    ("http400", lease_release.DECODE_REFUSED, 400),
])
async def test_a_decode_that_fails_releases_the_prefill_lease(gw, mode, reason, status):
    """Checked by hand: with the verdict on decode's status removed from exchange._on_response, the
    lease is released only as client_gone when the exchange ends, and this test fails."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode", mode=mode)
    await gw.start([p], [d])
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
        assert r.status == status
    await gw.epp.router.releases.settle()
    assert len(p.released) == 1
    assert _releases(gw, reason) == 1


async def test_a_decode_that_answers_keeps_the_lease(gw):
    """Negative control of the above: a decode that took the request is never second-guessed."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d])
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
        assert r.status == 200
    await asyncio.sleep(0.2)
    await gw.epp.router.releases.settle()
    assert p.released == []


async def test_a_client_gone_before_decode_answered_releases_the_lease(gw):
    """Checked by hand: without the release in exchange.finish, this test fails."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode", delay_s=2.0)
    await gw.start([p], [d])
    with pytest.raises(asyncio.TimeoutError):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY,
                                   timeout=aiohttp.ClientTimeout(total=0.5)) as r:
            await r.read()
    for _ in range(100):  # the proxy resets the exchange; the EPP releases what no decode took
        if p.released:
            break
        await asyncio.sleep(0.02)
    await gw.epp.router.releases.settle()
    assert len(p.released) == 1 and _releases(gw, lease_release.CLIENT_GONE) == 1


async def test_a_client_gone_during_the_prefill_leg_hands_the_blocks_back(gw):
    """As the router (abandon.py): the prefill leg finishes under a grace and a one-token decode
    consumes its blocks. Checked by hand: with the hand-back in exchange.py replaced by a cancel, it fails."""
    p = await gw.engine("p1", "prefill", delay_s=0.6)
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d])
    with pytest.raises(asyncio.TimeoutError):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY,
                                   timeout=aiohttp.ClientTimeout(total=0.2)) as r:
            await r.read()
    for _ in range(150):
        if d.received:
            break
        await asyncio.sleep(0.02)
    assert len(d.received) == 1
    assert d.received[0].body["max_tokens"] == 1 and d.received[0].body["kv_transfer_params"]["remote_engine_id"] == "p1"


async def test_epp_down_fail_open_serves_decode_only_and_counts_it(gw):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], failure_mode=FAIL_OPEN, epp=False)
    for _ in range(3):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
            assert r.headers[FALLBACK_HEADER] == FALLBACK_DECODE_ONLY
            assert (await r.json())["served_by"] == "d1"
    assert not p.received and all("kv_transfer_params" not in x.body for x in d.received)
    stats = await asyncio.to_thread(gw.envoy.stats)
    assert stats["cluster.decode_only.upstream_rq_completed"] == 3
    assert stats["http.gateway.ext_proc.streams_failed"] >= 3 or stats.get(
        "http.gateway.ext_proc.failure_mode_allowed", 0) >= 3


async def test_fail_open_fallback_reaches_decode_without_the_engine_token(gw, monkeypatch):
    """Why FailOpen needs failOpenWithoutEngineToken (operator/api/rules.py): with the fleet's token set, the
    request the EPP routes carries it to decode (the negative control), the fallback request the proxy sends
    once the EPP is down carries only what the client sent, which an engine holding the token refuses (401)."""
    from pdfleet.contract.env import ENGINE_API_KEY

    monkeypatch.setenv(ENGINE_API_KEY, "fleet-token")
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], failure_mode=FAIL_OPEN)
    client = {"Authorization": "Bearer client"}
    async with gw.session.post(gw.url + "/v1/completions", json=BODY, headers=client) as r:
        assert r.status == 200 and FALLBACK_HEADER not in r.headers
    assert d.received[-1].headers.get("Authorization") == "Bearer fleet-token"
    await gw.stop_epp()
    async with gw.session.post(gw.url + "/v1/completions", json=BODY, headers=client) as r:
        assert r.status == 200 and r.headers[FALLBACK_HEADER] == FALLBACK_DECODE_ONLY
    assert d.received[-1].headers.get("Authorization") == "Bearer client"
    assert "kv_transfer_params" not in d.received[-1].body


async def test_epp_down_fail_close_is_a_fast_5xx(gw):
    """The negative control of FailOpen: the same proxy with failure_mode_allow false."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], failure_mode=FAIL_CLOSE, epp=False)
    started = time.monotonic()
    async with asyncio.timeout(5):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
            assert r.status >= 500
            assert FALLBACK_HEADER not in r.headers
    assert time.monotonic() - started < 2.0
    assert not p.received and not d.received


def _unreachable() -> tuple[socket.socket, list[socket.socket], int]:
    """A port whose SYNs go unanswered, as an EPP pod that is gone or partitioned: a listener that never
    accepts, its accept queue filled (Linux then drops further SYNs; the client retries until its
    connect timeout)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    return lsock, fillers, port


@pytest.mark.parametrize("failure_mode", [FAIL_CLOSE, FAIL_OPEN])
async def test_epp_unreachable_is_bounded_by_the_connect_timeout(gw, failure_mode):
    """An EPP that does not answer at all (no refusal: its address drops the connection): the epp
    cluster's connect_timeout bounds the wait (FailClose: a 5xx; FailOpen: decode-only), never a hang.
    Checked by hand: with Envoy started again with connect_timeout 60 s instead of 1 s, the request is
    still pending at the 5 s bound (TimeoutError), in both modes."""
    lsock, fillers, port = _unreachable()
    try:
        p = await gw.engine("p1", "prefill")
        d = await gw.engine("d1", "decode")
        await gw.start([p], [d], failure_mode=failure_mode, epp=False, epp_port=port)
        await _answered_per_failure_mode(gw, failure_mode, bound_s=5)
        assert not p.received
    finally:
        for s in (lsock, *fillers):
            s.close()


@pytest.mark.parametrize("failure_mode", [FAIL_CLOSE, FAIL_OPEN])
async def test_epp_restarted_under_load_no_request_hangs(gw, failure_mode):
    p = await gw.engine("p1", "prefill", delay_s=0.15)
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], failure_mode=failure_mode)
    port = gw.epp_port
    statuses: list[int] = []

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.025)  # arrivals spread over a second: before, during and after
        async with gw.session.post(gw.url + "/v1/completions", json=dict(BODY, prompt=f"p{i}")) as r:
            await r.read()
            statuses.append(r.status)

    async def load() -> None:
        await asyncio.gather(*(one(i) for i in range(40)))

    async with asyncio.timeout(15):  # a hung request fails the test here
        task = asyncio.create_task(load())
        await asyncio.sleep(0.25)
        await gw.stop_epp()  # streams in flight are cut
        await asyncio.sleep(0.3)
        await gw.start_epp(port)
        await task
    assert len(statuses) == 40
    ok = statuses.count(200)
    assert ok >= 10 and all(s == 200 or s >= 500 for s in statuses)
    if failure_mode == FAIL_OPEN:
        assert ok == 40  # the proxy routed on (decode-only) while the EPP was away
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:  # the proxy reconnected
        assert r.status == 200 and FALLBACK_HEADER not in r.headers


async def test_a_stuck_epp_is_cut_by_message_timeout(gw, monkeypatch):
    """An EPP that accepts the stream and never answers: the proxy's message_timeout bounds the wait
    (FailClose: 5xx). Negative control: with a long message_timeout the same request is still pending."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")

    async def stuck(self, msg):
        await asyncio.sleep(3600)

    monkeypatch.setattr(Exchange, "on_message", stuck)
    await gw.start([p], [d], message_timeout_s=0.5)
    started = time.monotonic()
    async with asyncio.timeout(5):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
            assert r.status >= 500
    assert time.monotonic() - started < 3.0
    await gw.close_envoy()
    await gw.start_envoy(message_timeout_s=30.0)
    with pytest.raises(asyncio.TimeoutError):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY,
                                   timeout=aiohttp.ClientTimeout(total=1.5)) as r:
            await r.read()


async def test_message_timeout_outlasts_a_slow_prefill_leg(gw):
    """BUFFERED: a prefill leg slower than Envoy's default message_timeout (200 ms) still serves P/D
    through the shipped config; negative control: the config with message_timeout 0.2 s cuts it."""
    p = await gw.engine("p1", "prefill", delay_s=0.8)
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], prefill_timeout_s=5.0)  # the conftest's message_timeout: 30 s
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
        assert r.status == 200 and FALLBACK_HEADER not in r.headers
        assert (await r.json())["kv_seen"]["remote_engine_id"] == "p1"
    await gw.close_envoy()
    await gw.start_envoy(message_timeout_s=0.2)
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
        assert r.status >= 500


async def test_full_duplex_waits_on_the_prefill_leg_and_the_idle_timeout_bounds_it(gw, monkeypatch):
    """FULL_DUPLEX_STREAMED: Envoy 1.40 applies no message_timeout (a 0.2 s one does not cut a 0.8 s
    prefill leg); what bounds a stuck EPP there is the stream idle timeout (shipped: 300 s, above a
    whole prefill leg). Negative control: a stuck EPP under a 1 s idle timeout is cut, not hung."""
    p = await gw.engine("p1", "prefill", delay_s=0.8)
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], mode="full-duplex", prefill_timeout_s=5.0, message_timeout_s=0.2)
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
        assert r.status == 200 and FALLBACK_HEADER not in r.headers

    async def stuck(self, msg):
        await asyncio.sleep(3600)

    monkeypatch.setattr(Exchange, "on_message", stuck)
    await gw.close_envoy()
    await gw.start_envoy(stream_idle_timeout_s=1.0)
    started = time.monotonic()
    async with asyncio.timeout(5):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
            assert r.status >= 400
    assert time.monotonic() - started < 3.0


class FreezableRelay:
    """A TCP relay between Envoy and the EPP that goes silent on ``freeze()``: it stops reading and
    forwarding in both directions and keeps every socket open, and connections made after the freeze
    are accepted and never answered, as an EPP pod that is frozen or whose node is lost (no FIN, no RST)."""

    def __init__(self) -> None:
        self.target_port = 0
        self.frozen = asyncio.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self.frozen.set()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self.frozen.is_set():
            return  # accepted by the kernel, never read
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.append(up_writer)
        for r, w in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(r, w))
            self._tasks.add(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self.frozen.is_set():
            data = await reader.read(65536)
            if self.frozen.is_set():
                break  # nothing more is forwarded, not even an end
            if not data:
                writer.close()  # not frozen yet: an end passes
                return
            writer.write(data)
            await writer.drain()
        await asyncio.Event().wait()  # silent until close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.transport.abort()
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def relay():
    r = FreezableRelay()
    try:
        yield r
    finally:
        await r.close()


async def _behind_relay(gw, relay, p, d, **start) -> None:
    """Envoy's epp cluster points at the relay, the relay at the EPP."""
    relay_port = await relay.start()
    await gw.start([p], [d], epp=False, epp_port=relay_port, **start)
    relay.target_port = await gw.start_epp()


@pytest.mark.parametrize("mode, failure_mode", [
    ("buffered", FAIL_CLOSE), ("buffered", FAIL_OPEN), ("full-duplex", FAIL_CLOSE)])
async def test_an_epp_gone_silent_is_noticed_by_the_keepalive(gw, relay, mode, failure_mode):
    """An EPP that goes silent without closing its connection (pod frozen, node lost, partition: no FIN,
    no RST): Envoy's HTTP/2 keepalive on the epp cluster (envoy_config: connection_keepalive; here 1 s +
    1 s) closes the dead connection, and the request waiting on it ends per the failure mode (FailClose:
    a 5xx; FailOpen: decode-only) within seconds, not after message_timeout (60 s here; FULL_DUPLEX has
    none, only stream_idle_timeout, 300 s). A second request, on a new connection that the frozen EPP
    accepts and never reads, is bounded the same way.
    Checked by hand: with connection_keepalive removed from both shipped YAMLs, every case is still
    pending at the 6 s bound (TimeoutError)."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await _behind_relay(gw, relay, p, d, mode=mode, failure_mode=failure_mode, message_timeout_s=60.0,
                        envoy=dict(keepalive_interval_s=1.0, keepalive_timeout_s=1.0))
    async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:  # through the relay: P/D
        assert r.status == 200 and FALLBACK_HEADER not in r.headers
    assert len(p.received) == 1
    relay.freeze()
    for _ in range(2):
        answer = await _answered_per_failure_mode(gw, failure_mode, bound_s=6)
        assert answer is None or answer["served_by"] == "d1"
    assert len(p.received) == 1  # nothing reached the EPP after the freeze
    stats = await asyncio.to_thread(gw.envoy.stats)
    assert stats["cluster.epp.http2.keepalive_timeout"] >= 1



async def test_the_epp_takes_the_gateway_pings_during_a_long_prefill_leg(gw):
    """The keepalive's other side: the gateway pings while the EPP runs a prefill leg and sends nothing,
    and while no request is in flight; the EPP's gRPC server (server.SERVER_OPTIONS) must not take that
    for abuse and close the connection (GOAWAY too_many_pings), which would cut the leg. Here pings
    every 0.1 s over a 1.5 s leg, then an idle second, twice: both served P/D on one connection.
    Checked by hand: with SERVER_OPTIONS back to gRPC's ping policy (grpc.http2.max_ping_strikes
    removed), the first request gets 500 (a probe with 0.2 s pings over 2.5 s legs: both requests 500,
    2 connections, 2 upstream_cx_close_notify)."""
    p = await gw.engine("p1", "prefill", delay_s=1.5)
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], prefill_timeout_s=10.0, envoy=dict(keepalive_interval_s=0.1, keepalive_timeout_s=1.0))
    for _ in range(2):
        async with gw.session.post(gw.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200 and (await r.json())["kv_seen"]["remote_engine_id"] == "p1"
        await asyncio.sleep(1.0)
    stats = await asyncio.to_thread(gw.envoy.stats)
    assert stats["cluster.epp.upstream_cx_total"] == 1
    assert stats.get("cluster.epp.upstream_cx_close_notify", 0) == 0
