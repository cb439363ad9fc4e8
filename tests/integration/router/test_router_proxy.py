"""The real router over real HTTP (loopback) in front of fake OpenAI engines."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

pytestmark = pytest.mark.timeout(30)

COMPLETION = {"model": "tiny", "prompt": "hello there", "max_tokens": 7, "temperature": 0}


async def post(fleet, url, body, headers=None, path="/v1/completions"):
    async with fleet.session.post(url + path, json=body, headers=headers or {}) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


def assert_openai_error(raw: bytes, code: int, needle: str) -> None:
    err = json.loads(raw)["error"]
    assert err["code"] == code
    assert needle in err["message"]
    assert isinstance(err["type"], str) and err["type"]


async def metrics(fleet, url) -> str:
    async with fleet.session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def metric_value(text: str, line_prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_prefix!r}")


async def test_two_legs_share_request_id_and_kv_params(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    body = dict(COMPLETION, kv_transfer_params={"do_remote_prefill": True, "remote_host": "evil"})

    status, headers, raw = await post(fleet, url, body, {"X-Request-Id": "client-id-1"})

    assert status == 200, raw
    assert headers["X-Request-Id"] == "client-id-1"
    assert "x-pdfleet-fallback" not in {k.lower() for k in headers}
    assert headers["x-pdfleet-revision"] == "static"
    [pr], [dr] = p.received, d.received
    assert pr.headers["X-Request-Id"] == dr.headers["X-Request-Id"] == "client-id-1"
    # prefill leg: one token, not streamed, KV kept for a remote decode; the client's params are gone
    assert pr.body == dict(COMPLETION, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    # decode leg: the original body plus exactly what prefill returned
    expected_kv = {k: v for k, v in dr.body["kv_transfer_params"].items()}
    assert expected_kv["remote_engine_id"] == "p0"
    assert expected_kv["remote_request_id"] == "client-id-1"
    assert dr.body == dict(COMPLETION, kv_transfer_params=expected_kv)
    answer = json.loads(raw)
    assert answer["served_by"] == "d0" and answer["kv_seen"] == expected_kv


async def test_request_id_generated_when_missing(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    ids = []
    for i in range(2):
        status, headers, _ = await post(fleet, url, COMPLETION)
        assert status == 200
        rid = headers["X-Request-Id"]
        assert len(rid) >= 16
        assert p.received[i].headers["X-Request-Id"] == d.received[i].headers["X-Request-Id"] == rid
        ids.append(rid)
    assert ids[0] != ids[1]


async def test_chat_prefill_body_and_streaming_decode_body(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9,
            "min_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}

    status, headers, raw = await post(fleet, url, chat, path="/v1/chat/completions")

    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert raw.endswith(b"data: [DONE]\n\n")
    [pr], [dr] = p.received, d.received
    assert pr.path == dr.path == "/v1/chat/completions"
    assert pr.body == {"model": "tiny", "messages": chat["messages"], "max_tokens": 1, "max_completion_tokens": 1,
                       "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    assert {k: v for k, v in dr.body.items() if k != "kv_transfer_params"} == chat
    assert dr.body["kv_transfer_params"]["remote_engine_id"] == "p0"


async def test_streaming_is_relayed_chunk_by_chunk(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=3)
    url = await fleet.router([p], [d])
    events = []
    async with fleet.session.post(url + "/v1/completions", json=dict(COMPLETION, stream=True)) as resp:
        assert resp.status == 200
        for _ in range(3):
            # The fake sends chunk i+1 only after we saw chunk i: a router that
            # buffers the stream would make this wait time out.
            events.append(await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5))
            d.release.set()
        events.append(await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5))
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:3]] == ["t0", "t1", "t2"]
    assert events[3] == b"data: [DONE]\n\n"


async def test_prefill_failure_goes_to_another_prefill(fleet):
    bad = await fleet.engine("bad", "prefill", mode="http500")
    good = await fleet.engine("good", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([bad, good], [d], prefill_attempts=2)
    for _ in range(6):
        status, headers, raw = await post(fleet, url, COMPLETION)
        assert status == 200
        assert "x-pdfleet-fallback" not in {k.lower() for k in headers}
        assert json.loads(raw)["kv_seen"]["remote_engine_id"] == "good"
    assert len(bad.received) >= 1  # the failing endpoint was tried, and its failure absorbed
    assert len(good.received) == 6
    text = await metrics(fleet, url)
    assert metric_value(text, 'pdfleet_router_retries_total{leg="prefill"}') == len(bad.received)
    assert metric_value(text, 'pdfleet_router_leg_failures_total{leg="prefill",reason="http_500"}') == len(bad.received)


@pytest.mark.parametrize("mode", ["http500", "no_kv"])
async def test_all_prefills_fail_then_decode_alone_with_bounded_retries(fleet, mode):
    prefills = [await fleet.engine(f"p{i}", "prefill", mode=mode) for i in range(3)]
    d = await fleet.engine("d0", "decode")
    url = await fleet.router(prefills, [d], prefill_attempts=2)

    status, headers, raw = await post(fleet, url, dict(COMPLETION, kv_transfer_params={"x": 1}))

    assert status == 200
    assert headers["x-pdfleet-fallback"] == "decode-only"
    assert sum(len(p.received) for p in prefills) == 2  # prefill_attempts, not every endpoint
    [dr] = d.received
    assert dr.body == COMPLETION  # original body, no kv_transfer_params: decode prefills itself
    text = await metrics(fleet, url)
    assert metric_value(text, 'pdfleet_router_fallbacks_total{reason="prefill_failed"}') == 1
    # the pair answered, but recomputed: the canary analysis reads it as its own outcome
    assert metric_value(text, 'pdfleet_router_revision_requests_total{outcome="kv_fallback",revision="static"}') == 1
    assert 'pdfleet_router_revision_requests_total{outcome="answered"' not in text


async def test_prefill_timeout_and_connect_error_fall_back(fleet):
    slow = await fleet.engine("slow", "prefill", mode="hang")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([slow, dead], [d], prefill_attempts=2, prefill_timeout_s=0.5)

    status, headers, raw = await post(fleet, url, COMPLETION)

    assert status == 200 and headers["x-pdfleet-fallback"] == "decode-only"
    await asyncio.wait_for(slow.cancelled.wait(), 5)  # the timed-out leg was abandoned upstream too
    text = await metrics(fleet, url)
    assert metric_value(text, 'pdfleet_router_leg_failures_total{leg="prefill",reason="timeout"}') == 1
    assert metric_value(text, 'pdfleet_router_leg_failures_total{leg="prefill",reason="connect"}') == 1


async def test_prefill_client_error_is_relayed_not_retried(fleet):
    p = await fleet.engine("p0", "prefill", mode="http400")
    p1 = await fleet.engine("p1", "prefill", mode="http400")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p, p1], [d])

    status, headers, raw = await post(fleet, url, COMPLETION, {"X-Request-Id": "r4"})

    assert status == 400
    assert "bad prompt" in json.loads(raw)["error"]["message"]
    assert headers["X-Request-Id"] == "r4"
    assert len(p.received) + len(p1.received) == 1
    assert d.received == []


async def test_decode_failure_retries_another_decode_with_prefill_kv(fleet):
    p = await fleet.engine("p0", "prefill", lease_s=30)
    bad = await fleet.engine("bad", "decode", mode="http500")
    good = await fleet.engine("good", "decode")
    url = await fleet.router([p], [bad, good], decode_attempts=2)
    for _ in range(6):
        before = len(bad.received)
        status, headers, raw = await post(fleet, url, COMPLETION)
        assert status == 200
        assert "x-pdfleet-fallback" not in {k.lower() for k in headers}
        kv = json.loads(raw)["kv_seen"]
        assert kv["remote_engine_id"] == "p0"
        if len(bad.received) > before:  # the retried request carried the same params to both decodes
            assert bad.received[-1].body["kv_transfer_params"] == kv
    assert len(bad.received) >= 1
    assert len(p.received) == 6  # a decode retry never repeats prefill


async def test_decode_retry_after_lease_expired_is_decode_only(fleet):
    p = await fleet.engine("p0", "prefill", lease_s=0.2)  # less than lease_margin_s
    bad = await fleet.engine("bad", "decode", mode="http500")
    good = await fleet.engine("good", "decode")
    url = await fleet.router([p], [bad, good], decode_attempts=2, lease_margin_s=1.0)
    retried = 0
    for _ in range(6):
        before = len(bad.received)
        status, headers, raw = await post(fleet, url, COMPLETION)
        assert status == 200
        if len(bad.received) > before:
            retried += 1
            assert headers["x-pdfleet-fallback"] == "decode-only"
            assert json.loads(raw)["kv_seen"] is None
            assert "kv_transfer_params" in bad.received[-1].body  # first attempt had them
        else:  # first decode took it: the params were passed even though the lease is short
            assert json.loads(raw)["kv_seen"]["remote_engine_id"] == "p0"
    assert retried >= 1


async def test_every_decode_failing_gives_502_with_bounded_attempts(fleet):
    p = await fleet.engine("p0", "prefill")
    decodes = [await fleet.engine(f"d{i}", "decode", mode="http500") for i in range(3)]
    url = await fleet.router([p], decodes, decode_attempts=2)

    status, headers, raw = await post(fleet, url, COMPLETION)

    assert status == 502
    assert_openai_error(raw, 502, "decode failed")
    assert sum(len(d.received) for d in decodes) == 2


async def test_decode_client_error_is_relayed(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", mode="http400")
    d1 = await fleet.engine("d1", "decode", mode="http400")
    url = await fleet.router([p], [d, d1])
    status, _, raw = await post(fleet, url, COMPLETION)
    assert status == 400 and "bad prompt" in json.loads(raw)["error"]["message"]
    assert len(d.received) + len(d1.received) == 1


async def test_client_disconnect_mid_stream_cancels_decode(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=3)
    url = await fleet.router([p], [d])
    session = aiohttp.ClientSession()
    resp = await session.post(url + "/v1/completions", json=dict(COMPLETION, stream=True))
    await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
    resp.close()
    await session.close()
    # decode sits in release.wait(); only the router dropping its connection cancels it
    await asyncio.wait_for(d.cancelled.wait(), 5)
    text = await metrics(fleet, url)
    assert metric_value(text, "pdfleet_router_client_disconnects_total") >= 1
    assert metric_value(text, 'pdfleet_router_in_flight{endpoint="decode-0",role="decode"}') == 0


async def test_client_disconnect_during_prefill_cancels_prefill(fleet):
    p = await fleet.engine("p0", "prefill", mode="hang")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d], prefill_timeout_s=20)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
            await s.post(url + "/v1/completions", json=COMPLETION)
    await asyncio.wait_for(p.cancelled.wait(), 5)
    assert d.received == []


async def test_decode_breaking_midstream_is_not_a_clean_end(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", mode="drop_midstream", chunks=3)
    url = await fleet.router([p], [d])
    with pytest.raises(aiohttp.ClientPayloadError):
        async with fleet.session.post(url + "/v1/completions", json=dict(COMPLETION, stream=True)) as resp:
            assert resp.status == 200
            await resp.read()


async def test_sized_answer_cut_short_goes_to_another_decode_never_a_truncated_200(fleet):
    p = await fleet.engine("p0", "prefill")
    broken = await fleet.engine("broken", "decode", mode="short_body")
    url = await fleet.router([p], [broken])
    status, _, raw = await post(fleet, url, COMPLETION)
    assert status == 502
    assert_openai_error(raw, 502, "decode failed")
    good = await fleet.engine("good", "decode")
    url = await fleet.router([p], [broken, good], decode_attempts=2)
    for _ in range(2):  # one of them starts on the broken decode
        status, headers, raw = await post(fleet, url, COMPLETION)
        assert status == 200 and json.loads(raw)["served_by"] == "good"
        assert json.loads(raw)["kv_seen"]["remote_engine_id"] == "p0"  # lease still valid: KV reused
    text = await metrics(fleet, url)
    assert metric_value(text, 'pdfleet_router_leg_failures_total{leg="decode",reason="broken_answer"}') >= 1


async def test_request_size_limit(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d], max_body_bytes=1000)

    status, _, raw = await post(fleet, url, dict(COMPLETION, prompt="x" * 2000))
    assert status == 413
    assert_openai_error(raw, 413, "1000 bytes")

    async def chunked():  # no Content-Length: the limit holds while reading
        for _ in range(20):
            yield b"x" * 100

    async with fleet.session.post(url + "/v1/completions", data=chunked()) as resp:
        assert resp.status == 413
    # negative control: under the limit the same router serves
    status, _, _ = await post(fleet, url, dict(COMPLETION, prompt="x" * 500))
    assert status == 200
    assert len(p.received) == 1 and len(d.received) == 1


@pytest.mark.parametrize("raw, needle", [(b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object"),
                                         (b"", "not valid JSON")])
async def test_client_mistakes_get_400_in_openai_shape(fleet, raw, needle):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    async with fleet.session.post(url + "/v1/chat/completions", data=raw,
                                  headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        assert resp.headers["Content-Type"].startswith("application/json")
        assert_openai_error(await resp.read(), 400, needle)
    assert p.received == [] and d.received == []


async def test_no_endpoints_gives_503_and_unhealthy(fleet):
    async def nothing(router):  # a discovery that never finds anything
        await asyncio.sleep(3600)

    url = await fleet.router(["http://127.0.0.1:1"], ["http://127.0.0.1:1"], discovery=nothing)
    status, _, raw = await post(fleet, url, COMPLETION)
    assert status == 503
    assert_openai_error(raw, 503, "no endpoints")
    async with fleet.session.get(url + "/health") as resp:
        assert resp.status == 503
        assert (await resp.json())["status"] == "unavailable"
    async with fleet.session.get(url + "/v1/models") as resp:
        assert resp.status == 503


async def test_models_and_health_come_from_the_fleet(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    async with fleet.session.get(url + "/v1/models", headers={"Authorization": "Bearer k"}) as resp:
        assert resp.status == 200
        assert (await resp.json())["data"][0]["owned_by"] == "d0"
    assert d.received[0].path == "/v1/models" and d.received[0].headers["Authorization"] == "Bearer k"
    assert p.received == []
    async with fleet.session.get(url + "/health") as resp:
        assert resp.status == 200
        h = await resp.json()
    assert h["status"] == "ok" and h["prefill_ready"] == 1 and h["decode_ready"] == 1


async def test_metrics_exposed(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    for _ in range(3):
        assert (await post(fleet, url, COMPLETION))[0] == 200
    assert (await post(fleet, url, dict(COMPLETION, kv_transfer_params={"a": 1})))[0] == 200
    text = await metrics(fleet, url)
    assert metric_value(text, 'pdfleet_router_requests_total{code="200",route="/v1/completions"}') == 4
    assert metric_value(text, 'pdfleet_router_leg_latency_seconds_count{leg="prefill"}') == 4
    assert metric_value(text, 'pdfleet_router_leg_latency_seconds_count{leg="decode"}') == 4
    assert metric_value(text, 'pdfleet_router_leg_latency_seconds_count{leg="decode_first_byte"}') == 4
    assert metric_value(text, "pdfleet_router_client_kv_transfer_params_dropped_total") == 1
    assert metric_value(text, 'pdfleet_router_in_flight{endpoint="prefill-0",role="prefill"}') == 0
    assert metric_value(text, 'pdfleet_router_legs_started_total{endpoint="prefill-0",role="prefill"}') == 4
    assert metric_value(text, 'pdfleet_router_legs_started_total{endpoint="decode-0",role="decode"}') == 4
    assert metric_value(text, 'pdfleet_router_endpoints{ready="true",role="decode"}') == 1
    assert metric_value(text, 'pdfleet_router_serving_revision{revision="static"}') == 1


async def test_in_flight_series_of_vanished_endpoints_are_dropped(fleet):
    from pdfleet.connector.router.app import ROUTER_KEY
    from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints

    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    assert (await post(fleet, url, COMPLETION))[0] == 200
    router = fleet.runners[-1].app[ROUTER_KEY]
    assert 'pdfleet_router_in_flight{endpoint="prefill-0",role="prefill"}' in await metrics(fleet, url)
    router.set_endpoints([RevisionEndpoints("r2", (Endpoint("http://127.0.0.1:1"),), (Endpoint(d.url),))])
    text = await metrics(fleet, url)
    assert 'pdfleet_router_in_flight{endpoint="prefill-0",role="prefill"}' not in text  # gone: series dropped
    assert 'pdfleet_router_in_flight{endpoint="decode-0",role="decode"}' in text  # still known: kept
    # its legs-started count goes with it (the name is reused by the next endpoint); the decode's stays
    assert 'pdfleet_router_legs_started_total{endpoint="prefill-0",role="prefill"}' not in text
    assert metric_value(text, 'pdfleet_router_legs_started_total{endpoint="decode-0",role="decode"}') == 1
    # the newcomer took the freed name, and its legs count there
    assert router.labels("http://127.0.0.1:1") == "prefill-0" and router.labels(p.url) == "unknown"


@pytest.mark.parametrize("method, path, code, needle", [
    ("GET", "/v1/completions", 405, "use POST"),
    ("POST", "/v1/models", 405, "use GET"),
    ("POST", "/v1/embeddings", 404, "no route /v1/embeddings"),
    ("GET", "/", 404, "no route /"),
])
async def test_unknown_routes_and_methods_answer_in_openai_shape(fleet, method, path, code, needle):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    async with fleet.session.request(method, url + path, json={}) as resp:
        assert resp.status == code
        assert_openai_error(await resp.read(), code, needle)
    assert p.received == [] and d.received == []


async def test_client_gone_during_a_prefill_that_finishes_hands_the_blocks_back_at_once(fleet):
    """The prefill leg ends just after the client left: its kv_transfer_params go to a decode with
    max_tokens=1 (the pull releases prefill's lease now, not at expiry) and that answer is dropped."""
    p = await fleet.engine("p0", "prefill", mode="slow")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d], prefill_timeout_s=20)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
            await s.post(url + "/v1/completions", json=dict(COMPLETION, max_tokens=50, stream=True))
    for _ in range(100):
        if d.received:
            break
        await asyncio.sleep(0.05)
    assert len(d.received) == 1 and not p.cancelled.is_set()
    back = d.received[0].body
    assert back["max_tokens"] == 1 and back["stream"] is False
    assert back["kv_transfer_params"].get("do_remote_prefill") is True
    assert d.received[0].headers["X-Request-Id"] == p.received[0].headers["X-Request-Id"]


async def test_long_client_request_id_is_replaced_so_decode_accepts_vllms_id(fleet):
    """Issue 20 row 6: the router used to pass a 256-character X-Request-Id on; vLLM makes
    chatcmpl-<id>-<8> of it, decode refuses that remote_request_id (> 256) and sends no release, so
    prefill's KV stays pinned for the whole lease. The router now sends an id decode accepts."""
    import time

    from pdfleet.contract.kv_params import InvalidTransferParams, parse_remote_prefill, produce

    def decode_accepts(header_id: str) -> bool:
        vllm_id = f"chatcmpl-{header_id}-0-{'a1b2c3d4'}"  # what vLLM's chat endpoint makes of the header
        params = produce(block_ids=[1], engine_id="p0", request_id=vllm_id, host="10.0.0.1", port=5600,
                         tp_size=1, instance_id=None, lease_seconds=60, num_tokens=16)
        try:
            parse_remote_prefill(params, num_prompt_tokens=16, block_size=16, local_tp_size=1, now=time.time())
        except InvalidTransferParams:
            return False
        return True

    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    long_id = "L" * 256
    assert not decode_accepts(long_id)  # negative control: what main sent
    status, headers, _ = await post(fleet, url, COMPLETION, {"X-Request-Id": long_id})
    assert status == 200
    sent = p.received[-1].headers["X-Request-Id"]
    assert sent != long_id and d.received[-1].headers["X-Request-Id"] == sent == headers["X-Request-Id"]
    assert decode_accepts(sent)
    ok_id = "c" * 200  # short enough: kept as the client sent it
    status, headers, _ = await post(fleet, url, COMPLETION, {"X-Request-Id": ok_id})
    assert p.received[-1].headers["X-Request-Id"] == ok_id == headers["X-Request-Id"] and decode_accepts(ok_id)
