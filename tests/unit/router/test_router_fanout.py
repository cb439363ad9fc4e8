"""Pure router decision: which request bodies vLLM fans out into several engine requests."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.fanout import fan_out_reason


@pytest.mark.parametrize("body, reason", [
    ({"prompt": "hi"}, None),
    ({"prompt": "hi", "n": 1}, None),
    ({"prompt": "hi", "n": None}, None),  # chat's default
    ({"prompt": ["hi"]}, None),  # one prompt in a list
    ({"prompt": [1, 2, 3]}, None),  # token ids: one prompt
    ({"prompt": [[1, 2, 3]]}, None),
    ({"prompt": []}, None),  # vLLM refuses it; no reason to split
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, None),  # chat: one prompt
    ({"prompt": "hi", "use_beam_search": False}, None),
    ({"prompt": "hi", "n": True}, None),  # vLLM reads True as 1
    ({"prompt": "hi", "n": "1"}, None),
    ({"prompt": "hi", "logprobs": 2, "echo": True, "stop": ["\n"]}, None),
    ({"prompt": "hi", "n": 2}, "n=2"),
    ({"messages": [{"role": "user", "content": "a"}], "n": 3}, "n=3"),
    ({"prompt": "hi", "use_beam_search": True}, "use_beam_search"),
    ({"prompt": ["a", "b"]}, "2 prompts"),
    ({"prompt": [[1, 2], [3, 4], [5]]}, "3 prompts"),
    ({"prompt": ["a", [1, 2]]}, "2 prompts"),
    ({"prompt_embeds": ["AAAA", "BBBB"]}, "2 prompt_embeds"),
    ({"prompt_embeds": ["AAAA"]}, None),
    ({"prompt_embeds": "AAAA"}, None),
])
def test_fan_out_reason(body, reason):
    assert fan_out_reason(body) == reason


# n and use_beam_search read as vLLM reads them (body_fields.py); a number vLLM refuses goes to decode
# alone, which refuses it before any prefill is spent or leased (prefill never sees these fields).
LAX_ROWS = [
    ({"prompt": "hi", "n": "4"}, False, "n=4"),
    ({"prompt": "hi", "n": 4.0}, False, "n=4"),
    ({"messages": [], "n": " 2 "}, True, "n=2"),
    ({"prompt": "hi", "use_beam_search": "true"}, False, "use_beam_search"),
    ({"prompt": "hi", "use_beam_search": 1}, False, "use_beam_search"),
    ({"prompt": "hi", "n": 0}, False, "refused n: must be at least 1, got 0"),
    ({"prompt": "hi", "n": "four"}, False, "refused n: must be an integer, got 'four'"),
    ({"prompt": "hi", "n": None}, False, "refused n: must not be null, got None"),  # a completion's n is not optional
    ({"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, False, "refused min_tokens: must be at most max_tokens=4, got 5"),
]


@pytest.mark.parametrize("body, chat, reason", LAX_ROWS)
def test_fan_out_reads_numbers_as_vllm_does(body, chat, reason):
    assert fan_out_reason(body, chat=chat) == reason


def _old_fan_out_n(body):  # fanout.py before body_fields.py
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return f"n={n}"
    return "use_beam_search" if body.get("use_beam_search") is True else None


def test_negative_control_the_old_guard_let_lax_numbers_into_pd():
    assert all(_old_fan_out_n(body) != reason for body, _, reason in LAX_ROWS)
    assert _old_fan_out_n({"prompt": "hi", "n": "4"}) is None  # into P/D: 3 prefill leases left unread
