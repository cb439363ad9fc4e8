"""What a client's body can make the router do (issue 38, part 3), through the router's real HTTP front end
in front of fake engines: nesting is bounded before decoding, prefill gets only what makes the KV and
answers within a bound, and numbers are read as vLLM reads them."""

from __future__ import annotations

import sys

import json

import msgspec
import pytest
from test_router_proxy import COMPLETION, assert_openai_error, metric_value, metrics, post

from pdfleet.connector.serving import request as serving_request
from pdfleet.connector.serving import prefill_leg
from pdfleet.connector.serving.abandon import ANSWER_ONLY_FIELDS
from pdfleet.connector.serving.json_depth import MAX_JSON_DEPTH
from pdfleet.connector.serving.prefill_leg import ANSWER_TOO_LARGE, MAX_PREFILL_ANSWER_BYTES
from pdfleet.contract.routing import FALLBACK_DECODE_ONLY, FALLBACK_HEADER

pytestmark = pytest.mark.timeout(60)

DEEP = b'{"model":"tiny","prompt":"hi","x":' + b"[" * 1000 + b"]" * 1000 + b"}"
LOGPROBS = dict(COMPLETION, prompt=list(range(4000)), prompt_logprobs=20, echo=True, logprobs=5, n=1,
                top_logprobs=3, return_token_ids=True, stream=True, stream_options={"include_usage": True})


async def post_raw(fleet, url, raw: bytes):
    async with fleet.session.post(url + "/v1/completions", data=raw,
                                  headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.read()


async def test_a_deeply_nested_body_is_400_naming_the_limit(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    status, raw = await post_raw(fleet, url, DEEP)
    assert status == 400
    assert_openai_error(raw, 400, f"nested deeper than {MAX_JSON_DEPTH} levels")
    assert not p.received and not d.received
    shallow = b'{"model":"tiny","prompt":"' + b"[" * 1000 + b'","max_tokens":2}'  # brackets in a string
    assert (await post_raw(fleet, url, shallow))[0] == 200


async def test_negative_control_without_the_bound_a_deep_body_is_a_500(fleet, monkeypatch):
    monkeypatch.setattr(serving_request, "json_decode", msgspec.json.Decoder().decode)  # json_decode before
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    limit = sys.getrecursionlimit()  # CPython's default, as a front end's process has it (a library imported
    sys.setrecursionlimit(1000)  # earlier in this process may have raised it)
    try:
        status = (await post_raw(fleet, url, DEEP))[0]
    finally:
        sys.setrecursionlimit(limit)
    assert status == 500  # RecursionError: no client error, and no answer in the EPP


async def test_prefill_receives_only_what_makes_the_kv(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    status, headers, raw = await post(fleet, url, LOGPROBS)
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    [pr], [dr] = p.received, d.received
    assert pr.body == {"model": "tiny", "prompt": LOGPROBS["prompt"], "temperature": 0, "max_tokens": 1,
                       "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    assert {k: v for k, v in dr.body.items() if k != "kv_transfer_params"} == LOGPROBS  # decode: all of it
    assert set(ANSWER_ONLY_FIELDS) >= set(LOGPROBS) - set(pr.body) - {"stream"}


async def test_negative_control_the_whole_body_sent_to_prefill_sizes_its_answer(fleet, monkeypatch):
    def old_one_token_body(body, kv_transfer_params, *, chat):  # abandon.py before: only stream/min_tokens went
        out = dict(body, max_tokens=1, stream=False, kv_transfer_params=kv_transfer_params)
        out.pop("stream_options", None)
        return out

    monkeypatch.setattr(prefill_leg, "one_token_body", old_one_token_body)
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    status, _, raw = await post(fleet, url, LOGPROBS)
    assert p.received[0].body["prompt_logprobs"] == 20  # prefill answered ~6.5 MB: past the bound
    assert status == 502


async def test_a_prefill_answer_past_the_bound_is_a_502_counted_and_not_retried(fleet):
    big = [await fleet.engine(f"p{i}", "prefill", answer_pad=2 * 1024 * 1024) for i in range(2)]
    d = await fleet.engine("d0", "decode")
    url = await fleet.router(big, [d])
    status, _, raw = await post(fleet, url, COMPLETION)
    assert status == 502
    assert_openai_error(raw, 502, f"prefill's answer exceeds the limit of {MAX_PREFILL_ANSWER_BYTES} bytes")
    assert sum(len(p.received) for p in big) == 1  # not retried: another prefill would answer the same
    assert not d.received
    text = await metrics(fleet, url)
    assert metric_value(text, f'pdfleet_router_leg_failures_total{{leg="prefill",reason="{ANSWER_TOO_LARGE}"}}') == 1
    # the endpoint was not ejected: the next request is served by a prefill of the same fleet
    small = await fleet.engine("p2", "prefill")
    d2 = await fleet.engine("d1", "decode")
    assert (await post(fleet, await fleet.router([small], [d2]), COMPLETION))[0] == 200


@pytest.mark.parametrize("n", ["4", 4.0, " 4 "])
async def test_n_as_vllm_reads_it_is_a_fan_out_served_by_decode_alone(fleet, n):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    status, headers, raw = await post(fleet, url, dict(COMPLETION, n=n))
    assert status == 200 and headers[FALLBACK_HEADER] == FALLBACK_DECODE_ONLY
    assert not p.received  # no prefill leases left for 3 of 4 children
    assert len(json.loads(raw)["choices"]) == 4
