"""A request's estimated cost for flow control (connector/serving/flow/cost.py) and the fairness setting."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.flow.cost import CHAT_DEFAULT_MAX_TOKENS, MAX_COST, estimate_cost
from pdfleet.contract.flow_control import FlowControlConfig


@pytest.mark.parametrize("body,chat,expected", [
    ({"prompt": "abcd" * 100, "max_tokens": 50}, False, 150),  # 400 chars ~ 100 tokens + 50
    ({"prompt": [1, 2, 3], "max_tokens": 7}, False, 10),  # token ids count one each
    ({"prompt": ["abcd", "abcdabcd"], "max_tokens": 1}, False, 4),  # several prompts: 3 tokens + 1
    ({"prompt": "abcd"}, False, 1 + 16),  # no limit: vLLM's default for completions
    ({"messages": [{"role": "user", "content": "abcd"}]}, True, 1 + CHAT_DEFAULT_MAX_TOKENS),  # chat: a long answer
    ({"prompt": "abcd", "max_tokens": 10, "n": 3}, False, 31),  # three choices generate three times
    ({"messages": [{"role": "user", "content": "abcd" * 10}], "max_completion_tokens": 5, "max_tokens": 99},
     True, 15),  # chat: max_completion_tokens first
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "abcd" * 10}]}], "max_tokens": 5},
     True, 15),  # content parts
    ({"prompt": "x", "max_tokens": -5}, False, 1 + 16),  # a body vLLM refuses: the defaults
    ({"prompt": "x", "max_tokens": "lots"}, False, 1 + 16),
    ({"prompt": "x", "max_tokens": 10**12}, False, MAX_COST),  # bounded
    ({}, False, 16),
    ({"prompt": "abcd", "max_tokens": 10, "min_tokens": 10}, False, 1 + 10),  # min_tokens <= max_tokens (or refused)
    ({"prompt": "abcd", "min_tokens": "16"}, False, 1 + 16),
    ({"prompt": "abcd", "max_tokens": None}, False, 1 + 16),  # a completion's null is the default
])
def test_estimate_cost(body, chat, expected) -> None:
    assert estimate_cost(body, chat=chat) == expected


# Numbers as vLLM reads them (body_fields.py): each row is charged what vLLM will generate.
LAX_ROWS = [
    ({"prompt": "abcd", "max_tokens": "4096"}, False, 1 + 4096),  # was charged 17: 16 by default + 1
    ({"prompt": "abcd", "max_tokens": 4096.0}, False, 1 + 4096),
    ({"prompt": "abcd", "max_tokens": " 4_096 "}, False, 1 + 4096),
    ({"prompt": "abcd", "max_tokens": 10, "n": "3"}, False, 1 + 30),
    ({"messages": [{"role": "user", "content": "abcd"}], "min_tokens": 4000}, True, 1 + 4000),  # min over the default
    ({"messages": [{"role": "user", "content": "abcd"}], "max_completion_tokens": "5.0"}, True, 1 + 5),
    ({"prompt": "abcd", "max_tokens": True}, False, 1 + 1),  # vLLM reads True as 1
    ({"prompt": "abcd", "max_tokens": 10, "best_of": 5}, False, 1 + 10),  # vLLM 0.32 ignores best_of
]


@pytest.mark.parametrize("body,chat,expected", LAX_ROWS)
def test_estimate_cost_reads_numbers_as_vllm_does(body, chat, expected) -> None:
    assert estimate_cost(body, chat=chat) == expected


def _old_estimate_cost(body, *, chat: bool) -> float:
    """cost.py before body_fields.py: strict ints, min_tokens not counted, best_of counted."""
    def positive(v):
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    if chat:
        prompt = -(-len(body["messages"][0]["content"]) // 4)
        limit = positive(body.get("max_completion_tokens")) or positive(body.get("max_tokens")) or 512
    else:
        prompt = -(-len(body["prompt"]) // 4)
        limit = positive(body.get("max_tokens")) or 16
    return float(prompt + max(positive(body.get("n")) or 1, positive(body.get("best_of")) or 1) * limit)


def test_negative_control_the_old_cost_fails_the_lax_rows() -> None:
    assert all(_old_estimate_cost(body, chat=chat) != expected for body, chat, expected in LAX_ROWS)
    assert _old_estimate_cost({"prompt": "abcd", "max_tokens": "4096"}, chat=False) == 17


def test_fairness_setting_round_trips_and_the_default_stays_unsaid() -> None:
    assert FlowControlConfig().fairness == "cost"
    assert "fairness" not in FlowControlConfig(enabled=True).to_json()  # rendered router args keep their shape
    by_requests = FlowControlConfig(enabled=True, fairness="requests")
    assert FlowControlConfig.from_arg(by_requests.to_arg()) == by_requests
    with pytest.raises(ValueError, match="fairness: must be one of cost, requests, got 'tokens'"):
        FlowControlConfig(fairness="tokens")
    with pytest.raises(ValueError, match="fairness: expected str"):
        FlowControlConfig.from_json({"fairness": 1})
