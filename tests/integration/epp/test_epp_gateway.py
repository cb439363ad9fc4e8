"""The Endpoint Picker behind a real Envoy in GAIE's reference shape (ORIGINAL_DST on
x-gateway-destination-endpoint), in BUFFERED and FULL_DUPLEX_STREAMED body modes: P/D on one
revision pair with kv_transfer_params, streaming relayed chunk by chunk, the subset hint, and shedding."""

from __future__ import annotations

import asyncio
import json

import pytest

from pdfleet.contract.flow_control import FlowControlConfig
from pdfleet.contract.gateway import DESTINATION_ENDPOINT_HEADER, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE
from pdfleet.contract.routing import FALLBACK_HEADER, REVISION_HEADER

MODES = ["buffered", "full-duplex"]


def _subset_filter(subset) -> str:
    """A filter that sets the proxy's subset hint before ext_proc (as a gateway implementation would)."""
    return json.dumps({"name": "envoy.filters.http.set_metadata", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
        "metadata": [{"metadata_namespace": SUBSET_HINT_NAMESPACE,
                      "value": {SUBSET_HINT_KEY: subset}}]}})


@pytest.mark.parametrize("mode", MODES)
async def test_completion_runs_prefill_then_decode_with_kv_params(gw, mode):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    url = await gw.start([p], [d], mode=mode)
    async with gw.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 5,
                                                              "kv_transfer_params": {"evil": 1}}) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
        assert r.headers[REVISION_HEADER] == "static"
        assert FALLBACK_HEADER not in r.headers
    # prefill: the one-token leg; decode: the client's request plus prefill's params (the client's dropped)
    assert p.received[0].body["max_tokens"] == 1 and p.received[0].body["kv_transfer_params"] == {
        "do_remote_decode": True}
    assert d.received[0].body["max_tokens"] == 5
    assert answer["kv_seen"]["remote_engine_id"] == "p1" and "evil" not in answer["kv_seen"]
    # one request id on both legs, the one the client sees
    rid = p.received[0].headers["X-Request-Id"]
    assert d.received[0].headers["X-Request-Id"] == rid == r.headers["X-Request-Id"]
    assert answer["kv_seen"]["remote_request_id"] == rid
    assert d.received[0].headers[DESTINATION_ENDPOINT_HEADER] == d.url.removeprefix("http://")


@pytest.mark.parametrize("mode", MODES)
async def test_chat_and_a_client_request_id(gw, mode):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    url = await gw.start([p], [d], mode=mode)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
    async with gw.session.post(url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "mine-1"}) as r:
        assert r.status == 200
        answer = await r.json()
    assert answer["choices"][0]["message"]["content"] == "hello world"
    assert p.received[0].path == "/v1/chat/completions"
    assert p.received[0].body["max_completion_tokens"] == 1
    assert d.received[0].body["max_completion_tokens"] == 9
    assert answer["kv_seen"]["remote_request_id"] == "mine-1"


@pytest.mark.parametrize("mode", MODES)
async def test_stream_is_relayed_chunk_by_chunk(gw, mode):
    """The decode sends its second chunk only after the client saw the first: a proxy (or EPP) that
    held the answer back would deadlock here and time out."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode", gated=True, chunks=3)
    url = await gw.start([p], [d], mode=mode)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True}
    seen = []
    async with gw.session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        async with asyncio.timeout(5):
            while b"[DONE]" not in seen:
                chunk = await r.content.readany()
                assert chunk, "the stream ended early"
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    data = event.removeprefix(b"data: ")
                    seen.append(data if data == b"[DONE]" else json.loads(data)["choices"][0]["text"])
                    if data != b"[DONE]" and len(seen) < 3:
                        # the decode holds this request while more of its answer is to come (after the
                        # last chunk the answer may be over already: [DONE] follows it at once)
                        assert gw.epp.router.picker.outstanding.counts.get(d.url) == 1
                    if data != b"[DONE]":
                        d.release.set()
    assert seen == ["t0", "t1", "t2", b"[DONE]"]
    assert d.received[0].body["kv_transfer_params"]["remote_engine_id"] == "p1"
    for _ in range(50):  # the exchange ends when the proxy closes it after the answer
        if not gw.epp.router.picker.outstanding.counts:
            break
        await asyncio.sleep(0.02)
    assert gw.epp.router.picker.outstanding.counts == {}


@pytest.mark.parametrize("mode", MODES)
async def test_subset_hint_is_honoured(gw, mode):
    p = await gw.engine("p1", "prefill")
    d1 = await gw.engine("d1", "decode")
    d2 = await gw.engine("d2", "decode")
    await gw.start([p], [d1, d2], mode=mode,
                   extra_filters=[_subset_filter([d2.url.removeprefix("http://")])])
    for _ in range(4):
        async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200
            assert (await r.json())["served_by"] == "d2"
    assert not d1.received and len(d2.received) == 4


@pytest.mark.parametrize("subset", [[], ["10.9.9.9:8000"]], ids=["empty", "elsewhere"])
async def test_subset_with_nothing_usable_is_503_at_once(gw, subset):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], extra_filters=[_subset_filter(subset)])
    async with asyncio.timeout(5):
        async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 503
            assert "subset" in (await r.json())["error"]["message"]
    assert not p.received and not d.received  # nothing ran, not even the prefill leg


async def test_shed_request_is_429_with_reason_and_retry_after(gw):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode", gated=True, chunks=2)
    flow = FlowControlConfig(enabled=True, max_in_flight_per_decode=1, max_queued=1, max_queue_s=0.3)
    await gw.start([p], [d], flow_control=flow)
    body = {"prompt": "hi", "max_tokens": 2, "stream": True}
    async with gw.session.post(gw.url + "/v1/completions", json=body) as first:
        assert first.status == 200
        await first.content.readany()  # the first request holds the only slot while it streams
        async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
            assert r.status == 429
            assert int(r.headers["Retry-After"]) >= 1
            assert "overloaded" in (await r.json())["error"]["message"]
        d.release.set()
        await first.read()
    assert len(p.received) == 1  # the shed request never reached an engine
    for _ in range(50):  # the slot comes back once the first exchange ends
        if gw.epp.router.picker.flow.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
        assert r.status == 200


async def test_models_goes_to_a_decode(gw):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d])
    async with gw.session.get(gw.url + "/v1/models") as r:
        assert r.status == 200
        assert (await r.json())["data"][0]["owned_by"] == "d1"


async def test_a_client_cannot_name_the_destination(gw):
    """The proxy drops a client's x-gateway-destination-endpoint before the EPP names its own."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    rogue = await gw.engine("rogue", "decode")
    await gw.start([p], [d])
    headers = {DESTINATION_ENDPOINT_HEADER: rogue.url.removeprefix("http://")}
    async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi"}, headers=headers) as r:
        assert (await r.json())["served_by"] == "d1"
    assert not rogue.received


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data, status, needle", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object, got list"),
    (b'{"prompt": "' + b"x" * 300 + b'"}', 413, "exceeds the EPP's limit of 200 bytes"),
])
async def test_bad_requests_are_answered_by_the_epp_naming_the_problem(gw, mode, data, status, needle):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], mode=mode, max_body_bytes=200)
    async with gw.session.post(gw.url + "/v1/completions", data=data,
                               headers={"Content-Type": "application/json"}) as r:
        assert r.status == status
        assert needle in (await r.json())["error"]["message"]
    assert not p.received and not d.received


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("token", ["fleet-token", None], ids=["fleet_token", "no_token"])
async def test_decode_gets_the_fleets_engine_token_not_the_clients(gw, monkeypatch, mode, token):
    """The decode request is the proxy's: with the fleet's token set (PDFLEET_ENGINE_API_KEY), the EPP
    puts it on that request in place of the client's Authorization, as the router does on both its
    legs. Negative control: without a token the client's header passes unchanged."""
    from pdfleet.contract.env import ENGINE_API_KEY

    if token:
        monkeypatch.setenv(ENGINE_API_KEY, token)
    else:
        monkeypatch.delenv(ENGINE_API_KEY, raising=False)
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], mode=mode)
    async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi"},
                               headers={"Authorization": "Bearer client"}) as r:
        assert r.status == 200
    expected = f"Bearer {token}" if token else "Bearer client"
    assert d.received[0].headers.get("Authorization") == expected
    if token:
        assert p.received[0].headers.get("Authorization") == expected  # the prefill leg: the router's session


@pytest.mark.parametrize("form", ["comma-separated item", "bare IP"])
async def test_subset_hints_in_the_reference_epps_forms(gw, form):
    """GAIE's reference EPP reads an item holding comma-separated endpoints and a bare IP (any port of that
    IP); through a real Envoy, both are honoured (issue 38). Negative control: before, each such item was
    taken as one literal "ip:port", matched nothing, and every request was 503."""
    p = await gw.engine("p1", "prefill")
    d1 = await gw.engine("d1", "decode")
    d2 = await gw.engine("d2", "decode")
    if form == "bare IP":
        subset, allowed = ["10.9.9.9", "127.0.0.1"], {"d1", "d2"}  # both decodes listen on 127.0.0.1
    else:
        subset, allowed = [f"10.9.9.9:8000,{d2.url.removeprefix('http://')}"], {"d2"}
    await gw.start([p], [d1, d2], extra_filters=[_subset_filter(subset)])
    served = set()
    for _ in range(4):
        async with gw.session.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200, await r.text()
            served.add((await r.json())["served_by"])
    assert served == allowed  # sequential requests rotate over every allowed decode
    if form != "bare IP":
        assert not d1.received
