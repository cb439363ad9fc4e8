"""The Endpoint Picker asks the router's decision core the same disaggregation question (issue 32), behind a
real Envoy: under Conditional a short prompt goes to decode alone (no prefill leg, no kv_transfer_params),
a long one keeps both legs; Always (the negative control) runs the prefill leg for both."""

from __future__ import annotations

import pytest

from pdfleet.contract.routing import DISAGGREGATION_HEADER, FALLBACK_HEADER

# No tokenizer here: the picker estimates 4 characters a token (well above the minimum of 128 tokens).
LONG = " ".join(f"block {i} of the prefill cache moves to decode over the network." for i in range(20))


@pytest.mark.parametrize("mode", ["buffered", "full-duplex"])
@pytest.mark.parametrize("policy", ["Conditional", "Always"])
async def test_short_prompts_skip_the_prefill_leg_under_conditional(gw, mode, policy):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    url = await gw.start([p], [d], mode=mode, disaggregation_policy=policy, min_remote_prefill_tokens=128,
                         prefill_policy="leastOutstanding", decode_policy="leastOutstanding")
    answers = {}
    for label, prompt in (("short", "hi"), ("long", LONG)):
        async with gw.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                  "max_tokens": 5}) as r:
            assert r.status == 200, await r.text()
            answers[label] = (dict(r.headers), await r.json())
    short_headers, short = answers["short"]
    long_headers, long = answers["long"]
    assert long["kv_seen"]["remote_engine_id"] == "p1" and FALLBACK_HEADER not in long_headers
    assert FALLBACK_HEADER not in short_headers  # a choice, not a failure of P/D
    if policy == "Conditional":
        assert [q.body["prompt"] for q in p.received] == [LONG]  # the prefill never saw the short prompt
        assert short["kv_seen"] is None
        assert short_headers[DISAGGREGATION_HEADER] == "decode_only; reason=short_prompt"
        assert long_headers[DISAGGREGATION_HEADER] == "remote_prefill; reason=long_uncached"
    else:
        assert [q.body["prompt"] for q in p.received] == ["hi", LONG]
        assert short["kv_seen"]["remote_engine_id"] == "p1"
        assert short_headers[DISAGGREGATION_HEADER] == "remote_prefill; reason=always"
