"""The canary's conversation key (connector/serving/canary.py, issue 31): an explicit id first, else the
conversation's first turn in full, so that conversations behind a long shared preamble are told apart
and every turn of one conversation keeps its key, in chat and completions form."""

from __future__ import annotations

import random

import pytest
from multidict import CIMultiDict

from pdfleet.connector.serving.canary import conversation_key, explicit_key, prefix_key, to_canary
from pdfleet.contract.routing import SESSION_HEADER

SYSTEM = "You are a careful assistant. " * 40  # 1,120 characters, shared by every conversation
FEW_SHOT = [{"role": "system", "name": "example_user", "content": "What is 2+2?"},
            {"role": "system", "name": "example_assistant", "content": "4"}]


def old_key(body: dict, *, chat: bool) -> str | None:
    """The key before issue 31 (first 512 characters of system + first user turn): the negative control."""
    if chat:
        parts = []
        for m in body["messages"]:
            if isinstance(m.get("content"), str):
                parts.append(f"{m['role']}:{m['content']}")
                if m["role"] == "user":
                    break
        text = "\n".join(parts)
    else:
        text = body["prompt"]
    return text[:512] or None


def chat_turns(i: int, turns: int = 3, *, preamble=(), parts=False) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, *preamble]
    out = []
    for t in range(turns):
        text = f"conversation {i}, question {t}: how do I sort {i * 7919 % 997} items?"
        messages = messages + [{"role": "user", "content": [{"type": "text", "text": text}] if parts else text}]
        out.append({"model": "m", "messages": messages})
        messages = messages + [{"role": "assistant", "content": f"answer {t} to {i}"}]
    return out


# (template of a completions prompt: system, user turn, assistant cue, answer separator)
TEMPLATES = {
    "plain": ("{s}\n\n", "User: {u}", "\nAssistant:", " {a}\n"),
    "chatml": ("<|im_start|>system\n{s}<|im_end|>\n", "<|im_start|>user\n{u}<|im_end|>\n",
               "<|im_start|>assistant\n", "{a}<|im_end|>\n"),
    "llama3": ("<|start_header_id|>system<|end_header_id|>\n\n{s}<|eot_id|>",
               "<|start_header_id|>user<|end_header_id|>\n\n{u}<|eot_id|>",
               "<|start_header_id|>assistant<|end_header_id|>\n\n", "{a}<|eot_id|>"),
    "mistral": ("<s>[INST] {s}\n\n", "{u}", " [/INST]", " {a}</s>[INST] "),
}


def completion_turns(i: int, turns: int = 3, template: str = "plain") -> list[dict]:
    sys_t, user_t, cue, answer_t = TEMPLATES[template]
    prompt = sys_t.format(s=SYSTEM)
    out = []
    for t in range(turns):
        prompt += user_t.format(u=f"conversation {i}, question {t}: {i * 31 % 101}?") + cue
        out.append({"model": "m", "prompt": prompt})
        prompt += answer_t.format(a=f"answer {t} to {i}")
    return out


def keys(bodies: list[dict], chat: bool, **kw) -> list[str]:
    return [conversation_key(b, chat=chat, request_id=f"r{n}", **kw) for n, b in enumerate(bodies)]


@pytest.mark.parametrize("case,conversations,chat", [
    ("long shared system prompt", [chat_turns(i) for i in range(200)], True),
    ("few-shot preamble (named examples)", [chat_turns(i, preamble=FEW_SHOT) for i in range(200)], True),
    ("content parts", [chat_turns(i, parts=True) for i in range(200)], True),
    *[(f"multi-turn completions ({t})", [completion_turns(i, template=t) for i in range(200)], False)
      for t in TEMPLATES],
])
def test_each_conversation_keeps_one_key_and_conversations_differ(case, conversations, chat) -> None:
    per_conversation = [set(keys(turns, chat)) for turns in conversations]
    assert all(len(k) == 1 for k in per_conversation), case  # every turn keeps the first turn's key
    assert len(set.union(*per_conversation)) == len(conversations), case  # and no two conversations share one
    assert not any(k.startswith("request:") for ks in per_conversation for k in ks), case


@pytest.mark.parametrize("chat", [True, False])
def test_negative_control_the_old_key_collapses_behind_the_shared_prompt(chat) -> None:
    conversations = [chat_turns(i) if chat else completion_turns(i) for i in range(200)]
    assert len({old_key(turns[0], chat=chat) for turns in conversations}) == 1
    # at weight 30 the old key sends all or nothing to the canary; the new one splits
    old = sum(to_canary(old_key(c[0], chat=chat), "rev-b", 30) for c in conversations) / 2
    new = sum(to_canary(keys(c[:1], chat)[0], "rev-b", 30) for c in conversations) / 2
    assert old in (0, 100) and abs(new - 30) <= 8, (old, new)


def test_content_parts_are_read_and_match_the_string_form() -> None:
    as_text = chat_turns(5)[0]
    as_parts = chat_turns(5, parts=True)[0]
    assert prefix_key(as_text, chat=True) == prefix_key(as_parts, chat=True) is not None
    image_only = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert prefix_key(image_only, chat=True) is None


def test_known_limit_plain_few_shot_turns_look_like_the_first_turn() -> None:
    """Documented: few-shot examples sent as plain user/assistant turns are the conversation's first turn
    as far as a stateless key can tell; an explicit key then tells conversations apart."""
    plain = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    convs = [chat_turns(i, preamble=plain) for i in range(20)]
    assert len({prefix_key(c[0], chat=True) for c in convs}) == 1
    with_ids = {conversation_key(c[0], chat=True, request_id="x", headers={SESSION_HEADER: f"s{i}"})
                for i, c in enumerate(convs)}
    assert len(with_ids) == 20


@pytest.mark.parametrize("headers,body,expected", [
    ({SESSION_HEADER: "s-1"}, {"prompt_cache_key": "p", "user": "u", "prompt": "x"}, "session:s-1"),
    (CIMultiDict({"X-Session-Id": "s-2"}), {"prompt": "x"}, "session:s-2"),  # aiohttp's headers
    ({"X-SESSION-ID": "s-3"}, {"prompt": "x"}, "session:s-3"),  # a plain dict, any case
    ({}, {"prompt_cache_key": "p", "user": "u", "prompt": "x"}, "prompt_cache_key:p"),
    (None, {"user": "u", "prompt": "x"}, "user:u"),
    ({SESSION_HEADER: "  "}, {"user": 7, "prompt": "x"}, None),  # blank or not a string: no explicit key
    ({SESSION_HEADER: "s" * 2000}, {"prompt": "x"}, None),  # too long to be an id
])
def test_explicit_key_order(headers, body, expected) -> None:
    assert explicit_key(body, headers) == expected


def test_a_configured_session_header_replaces_the_default() -> None:
    assert explicit_key({}, {"x-conversation": "c"}, session_header="x-conversation") == "session:c"
    assert explicit_key({}, {SESSION_HEADER: "c"}, session_header="x-conversation") is None


def test_explicit_key_wins_over_content_and_request_id_is_last() -> None:
    body = chat_turns(1)[0]
    assert conversation_key(body, chat=True, request_id="r", headers={SESSION_HEADER: "s"}) == "session:s"
    assert conversation_key(body, chat=True, request_id="r").startswith("chat:")
    assert conversation_key({"prompt": [1, 2]}, chat=False, request_id="r") == "request:r"


def test_cueless_completions_prompts_are_keyed_by_their_start() -> None:
    # a first turn longer than the window keeps its key; one shorter changes when the prompt grows (documented)
    long_first = "p" * 1000 + "unique question " * 200
    assert prefix_key({"prompt": long_first}, chat=False) == prefix_key({"prompt": long_first + "more"}, chat=False)
    short = "short question"
    assert prefix_key({"prompt": short}, chat=False) != prefix_key({"prompt": short + " answer more"}, chat=False)


def test_split_and_stickiness_over_random_conversations() -> None:
    """600 conversations of 1-4 turns behind the shared prompt, mixed forms: the canary's share at weight 30
    is within 5 points, and every conversation stays on one pair."""
    rng = random.Random(31)
    pairs, share = [], 0
    for i in range(600):
        n = rng.randint(1, 4)
        turns = chat_turns(i, n, parts=i % 3 == 0) if i % 2 else completion_turns(i, n, rng.choice(list(TEMPLATES)))
        picks = {to_canary(k, "rev-b", 30) for k in keys(turns, chat=bool(i % 2))}
        pairs.append(len(picks))
        share += picks == {True}
    assert pairs.count(1) == 600
    assert abs(share / 6 - 30) <= 5, share / 6
