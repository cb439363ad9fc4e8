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
    ({"prompt": "x", "max_tokens": -5}, False, 1 + 16),  # nonsense limits are ignored
    ({"prompt": "x", "max_tokens": True}, False, 1 + 16),
    ({"prompt": "x", "max_tokens": 10**12}, False, MAX_COST),  # bounded
    ({}, False, 16),
])
def test_estimate_cost(body, chat, expected) -> None:
    assert estimate_cost(body, chat=chat) == expected


def test_fairness_setting_round_trips_and_the_default_stays_unsaid() -> None:
    assert FlowControlConfig().fairness == "cost"
    assert "fairness" not in FlowControlConfig(enabled=True).to_json()  # rendered router args keep their shape
    by_requests = FlowControlConfig(enabled=True, fairness="requests")
    assert FlowControlConfig.from_arg(by_requests.to_arg()) == by_requests
    with pytest.raises(ValueError, match="fairness: must be one of cost, requests, got 'tokens'"):
        FlowControlConfig(fairness="tokens")
    with pytest.raises(ValueError, match="fairness: expected str"):
        FlowControlConfig.from_json({"fairness": 1})
