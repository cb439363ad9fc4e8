"""Remote prefill or decode alone, per request (connector/serving/disaggregation.py)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.disaggregation import (
    ALWAYS,
    CACHED_ON_DECODE,
    FAN_OUT,
    LONG_UNCACHED,
    PREFILL_BUSY,
    SHORT_PROMPT,
    Decision,
    Policy,
    Request,
    decide,
)
from pdfleet.contract.routing import DECODE_ONLY, REMOTE_PREFILL

COND = Policy("Conditional", min_remote_prefill_tokens=256, prefill_busy_in_flight=4, block_size=32)
ALW = Policy("Always", min_remote_prefill_tokens=256, prefill_busy_in_flight=4, block_size=32)
IDLE = (0, 0)

# (case, policy, prompt tokens, cached on decode, prefill in flight, decode in flight, fan out, decision, reason)
TABLE = [
    ("short prompt (under one block)", COND, 12, 0, IDLE, 0, False, DECODE_ONLY, SHORT_PROMPT),
    ("a few blocks, under the minimum", COND, 128, 0, IDLE, 0, False, DECODE_ONLY, SHORT_PROMPT),
    ("prompt cached on decode", COND, 1500, 1472, IDLE, 0, False, DECODE_ONLY, CACHED_ON_DECODE),
    ("mostly cached: the rest is under the minimum", COND, 1500, 1280, IDLE, 0, False, DECODE_ONLY, CACHED_ON_DECODE),
    ("long uncached prompt", COND, 1500, 0, IDLE, 0, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("partly cached, long rest", COND, 1500, 640, IDLE, 0, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("exactly the minimum uncached", COND, 256, 0, IDLE, 0, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("prefills saturated, decode idle", COND, 1500, 0, (5, 4), 0, False, DECODE_ONLY, PREFILL_BUSY),
    ("prefills saturated, decode as busy", COND, 1500, 0, (5, 4), 4, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("one prefill free", COND, 1500, 0, (5, 0), 0, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("decode saturated, prefills idle (the reverse)", COND, 1500, 0, IDLE, 12, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("decode saturated: a short prompt still stays", COND, 12, 0, IDLE, 12, False, DECODE_ONLY, SHORT_PROMPT),
    ("n > 1 / batch prompts", COND, 1500, 0, IDLE, 0, True, DECODE_ONLY, FAN_OUT),
    ("no prefill ready: the leg falls back", COND, 1500, 0, (), 0, False, REMOTE_PREFILL, LONG_UNCACHED),
    ("Always: short prompt still remote", ALW, 12, 0, IDLE, 0, False, REMOTE_PREFILL, ALWAYS),
    ("Always: cached on decode still remote", ALW, 1500, 1472, IDLE, 0, False, REMOTE_PREFILL, ALWAYS),
    ("Always: prefills saturated still remote", ALW, 1500, 0, (5, 4), 0, False, REMOTE_PREFILL, ALWAYS),
    ("Always: n > 1 goes to decode alone", ALW, 1500, 0, IDLE, 0, True, DECODE_ONLY, FAN_OUT),
]


@pytest.mark.parametrize("case,policy,tokens,cached,prefills,decode,fan_out,decision,reason", TABLE,
                         ids=[row[0] for row in TABLE])
def test_decision_table(case, policy, tokens, cached, prefills, decode, fan_out, decision, reason):
    got = decide(policy, Request(tokens, cached, prefills, decode, fan_out))
    assert got == Decision(decision, reason)
    assert got.remote == (decision == REMOTE_PREFILL)


def test_every_conditional_decode_only_row_would_be_remote_under_always():
    # negative control: the table's decode-only rows are the policy's doing, not the inputs'
    for case, policy, tokens, cached, prefills, decode, fan_out, decision, reason in TABLE:
        if policy is COND and decision == DECODE_ONLY and reason != FAN_OUT:
            assert decide(ALW, Request(tokens, cached, prefills, decode, fan_out)).remote, case


def test_the_minimum_is_at_least_one_block():
    p = Policy("Conditional", min_remote_prefill_tokens=0, block_size=32)
    assert decide(p, Request(31, 0, IDLE, 0)).reason == SHORT_PROMPT
    assert decide(p, Request(32, 0, IDLE, 0)).remote


def test_tokens_wanted_covers_the_decision():
    # counting prompt tokens up to tokens_wanted gives the decision counting all would give
    for cached in (0, 320, 1472):
        cap = COND.tokens_wanted(cached)
        for full in (1500, 4000):
            capped = decide(COND, Request(min(full, cap), cached, IDLE, 0))
            assert capped == decide(COND, Request(full, cached, IDLE, 0))


def test_header_names_decision_and_reason():
    assert Decision(DECODE_ONLY, SHORT_PROMPT).header() == "decode_only; reason=short_prompt"


@pytest.mark.parametrize("kwargs,field", [
    ({"policy": "Sometimes"}, "policy"),
    ({"block_size": 0}, "block_size"),
    ({"min_remote_prefill_tokens": -1}, "min_remote_prefill_tokens"),
    ({"prefill_busy_in_flight": 0}, "prefill_busy_in_flight"),
])
def test_bad_policy_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Policy(**kwargs)
