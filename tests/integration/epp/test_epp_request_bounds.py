"""What a client's body can make the Endpoint Picker do (issue 38, part 3), through a real Envoy in both body
modes: nesting bounded before decoding (400, not an ended stream), prefill sent only what makes the KV and
its answer bounded (502), numbers read as vLLM reads them (n "4" is a fan-out)."""

from __future__ import annotations

import sys

import json

import msgspec
import pytest

from pdfleet.connector.serving import request as serving_request
from pdfleet.connector.serving.abandon import ANSWER_ONLY_FIELDS
from pdfleet.connector.serving.json_depth import MAX_JSON_DEPTH
from pdfleet.connector.serving.prefill_leg import MAX_PREFILL_ANSWER_BYTES
from pdfleet.contract.routing import FALLBACK_DECODE_ONLY, FALLBACK_HEADER

MODES = ["buffered", "full-duplex"]
DEEP = b'{"model":"tiny","prompt":"hi","x":' + b"[" * 1000 + b"]" * 1000 + b"}"
LOGPROBS = {"model": "tiny", "prompt": list(range(4000)), "max_tokens": 5, "prompt_logprobs": 20, "echo": True,
            "logprobs": 5, "n": 1}


async def post(gw, body: bytes):
    async with gw.session.post(gw.url + "/v1/completions", data=body,
                               headers={"Content-Type": "application/json"}) as r:
        return r.status, r.headers.copy(), await r.read()


@pytest.mark.parametrize("mode", MODES)
async def test_a_deeply_nested_body_is_400_naming_the_limit(gw, mode):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], mode=mode)
    status, _, raw = await post(gw, DEEP)
    assert status == 400, raw
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in json.loads(raw)["error"]["message"]
    assert not p.received and not d.received


async def test_negative_control_without_the_bound_the_stream_ends(gw, monkeypatch):
    monkeypatch.setattr(serving_request, "json_decode", msgspec.json.Decoder().decode)  # json_decode before
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d])
    limit = sys.getrecursionlimit()  # CPython's default, as a front end's process has it (a library imported
    sys.setrecursionlimit(1000)  # earlier in this process may have raised it)
    try:
        status, _, _ = await post(gw, DEEP)
    finally:
        sys.setrecursionlimit(limit)
    assert status == 500  # RecursionError ends the EPP's stream: Envoy answers for it (FailClose)


@pytest.mark.parametrize("mode", MODES)
async def test_prefill_gets_only_what_makes_the_kv_and_its_answer_is_bounded(gw, mode):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], mode=mode)
    status, _, raw = await post(gw, msgspec.json.encode(LOGPROBS))
    assert status == 200, raw
    assert not set(ANSWER_ONLY_FIELDS) & set(p.received[0].body)
    assert d.received[0].body["prompt_logprobs"] == 20  # decode: the client's body whole


@pytest.mark.parametrize("mode", MODES)
async def test_a_prefill_answer_past_the_bound_is_a_502(gw, mode):
    p = await gw.engine("p1", "prefill", answer_pad=2 * 1024 * 1024)
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d], mode=mode)
    status, _, raw = await post(gw, b'{"model":"tiny","prompt":"hi","max_tokens":5}')
    assert status == 502, raw
    assert f"exceeds the limit of {MAX_PREFILL_ANSWER_BYTES} bytes" in json.loads(raw)["error"]["message"]
    assert len(p.received) == 1 and not d.received


async def test_n_as_a_string_is_a_fan_out_served_by_decode_alone(gw):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    await gw.start([p], [d])
    status, headers, raw = await post(gw, b'{"model":"tiny","prompt":"hi","max_tokens":5,"n":"4"}')
    assert status == 200 and headers[FALLBACK_HEADER] == FALLBACK_DECODE_ONLY
    assert not p.received and len(json.loads(raw)["choices"]) == 4
