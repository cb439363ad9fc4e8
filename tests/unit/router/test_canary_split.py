"""The canary split (connector/serving/canary.py): share, stickiness per conversation, monotone steps."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.canary import canary_share, prefix_key, to_canary

KEYS = [f"conversation {i}: system prompt and first question" for i in range(1000)]


@pytest.mark.parametrize("weight", [0, 1, 10, 25, 50, 90, 100])
def test_the_split_over_1000_keys_is_within_3_points_of_the_weight(weight) -> None:
    share = sum(to_canary(k, "rev-b", weight) for k in KEYS) / len(KEYS) * 100
    assert abs(share - weight) <= 3, share


def test_negative_control_a_constant_key_is_not_split() -> None:
    # every request with one key goes one way: the measured split is 0 or 100, far from 50
    share = sum(to_canary("same", "rev-b", 50) for _ in KEYS) / len(KEYS) * 100
    assert share in (0, 100)


def test_sticky_and_monotone_as_the_weight_rises() -> None:
    previous: set[str] = set()
    for weight in (5, 10, 25, 50, 75, 100):
        now = {k for k in KEYS if to_canary(k, "rev-b", weight)}
        assert previous <= now, "raising the weight never moves a conversation back to the stable pair"
        previous = now
    assert all(to_canary(k, "rev-b", 30) == to_canary(k, "rev-b", 30) for k in KEYS[:50])  # deterministic


def test_the_salt_reshuffles_which_conversations_go_first() -> None:
    a = {k for k in KEYS if to_canary(k, "rev-b", 20)}
    b = {k for k in KEYS if to_canary(k, "rev-c", 20)}
    assert a != b and len(a & b) < len(a)


def test_share_is_stable_across_processes() -> None:
    # sha256, not Python's per-process hash: a fixed value every router replica computes alike
    assert canary_share("hello", "rev-b") == canary_share("hello", "rev-b")
    assert 0 <= canary_share("hello", "rev-b") < 10_000


@pytest.mark.parametrize("body,chat,expected", [
    ({"prompt": "tell me"}, False, "prompt:tell me"),
    ({"prompt": "x" * 3000}, False, "prompt:" + "x" * 2048),  # no cue: the first WINDOW_CHARS
    ({"prompt": ["tell me"]}, False, "prompt:tell me"),
    ({"prompt": [1, 2, 3]}, False, None),
    ({}, False, None),
    ({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]}, True,
     "chat:system:be brief\nuser:hi"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}, True, "chat:user:x"),
    ({"messages": "nope"}, True, None),
])
def test_prefix_key_is_the_first_turn_of_the_conversation(body, chat, expected) -> None:
    assert prefix_key(body, chat=chat) == expected


def test_later_turns_keep_the_key_of_the_first() -> None:
    first = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]}
    later = {"messages": first["messages"] + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]}
    assert prefix_key(first, chat=True) == prefix_key(later, chat=True)
