"""Which chat requests the router renders to the engine's prompt, and in which content format."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.kvaware.chat_prompt import PARTS, STRING, content_format, plain_conversation
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, HashConfig
from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting, Tokenizer
from pdfleet.operator.local.tiny_model import TinyLlamaSpec, build_tokenizer

SYS = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "hello there"}


@pytest.mark.parametrize("body, fmt, want", [
    ({"messages": [SYS, USER]}, STRING, [SYS, USER]),
    ({"messages": [USER]}, PARTS, [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
     STRING, [{"role": "user", "content": "a\nb"}]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
     PARTS, [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]),
    ({"messages": [dict(USER, name="ann")]}, STRING, [dict(USER, name="ann")]),
    ({"messages": [USER], "add_generation_prompt": True, "tools": []}, STRING, [USER]),
    # not plain: scored by text
    ({"messages": []}, STRING, None),
    ({"messages": "hello"}, STRING, None),
    ({"messages": [{"role": "tool", "content": "x"}]}, STRING, None),
    ({"messages": [{"role": "developer", "content": "x"}]}, STRING, None),
    ({"messages": [dict(USER, tool_calls=[])]}, STRING, None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, STRING, None),
    ({"messages": [{"role": "user", "content": None}]}, STRING, None),
    ({"messages": [dict(USER, name=3)]}, STRING, None),
    ({"messages": [USER], "tools": [{"type": "function"}]}, STRING, None),
    ({"messages": [USER], "chat_template": "{{ x }}"}, STRING, None),
    ({"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}}, STRING, None),
    ({"messages": [USER], "add_generation_prompt": False}, STRING, None),
    ({"messages": [USER], "continue_final_message": True}, STRING, None),
    ({"messages": [USER], "add_special_tokens": True}, STRING, None),
])
def test_plain_conversation_table(body, fmt, want):
    assert plain_conversation(body, fmt) == want


@pytest.mark.parametrize("as_string, as_parts, want", [
    ("<|user|>\nMARK\n", "<|user|>\n[{'type': 'text', 'text': 'MARK'}]\n", STRING),  # prints the list
    ("<|user|>\nMARK\n", "<|user|>\nMARK\n", PARTS),  # iterates over parts (and takes strings too)
    ("<|user|>\nMARK\n", "<|user|>\n\n", STRING),
    ("<|user|>\n\n", "<|user|>\n\n", None),  # drops the text: not understood
])
def test_content_format_table(as_string, as_parts, want):
    assert content_format(as_string, as_parts, "MARK") == want


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer(TinyLlamaSpec())
    return tok, Tokenizer(tok._tokenizer, chat=tok)


def test_chat_keys_equal_the_templates_own_tokens(tiny):
    """The router's keys for a plain chat request are those of the template's tokens (what vLLM
    prefills), both on a token-cache miss and on a hit; rendered in the wrong content format, not."""
    hf, tok = tiny
    assert tok.chat_format == STRING  # the tiny template prints message['content']
    routing = PrefixRouting(RouterConfig(prefill=("http://p",), decode=("http://d",), block_size=16),
                            RouterMetrics(), tokenize=tok)
    hasher = BlockHasher(HashConfig(16))
    system = {"role": "system", "content": "You route requests. " * 40}
    for turn in ("first question about caches", "a second, different question"):
        messages = [system, {"role": "user", "content": turn}]
        want = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        keys = list(routing.keys_for({"messages": messages}, True).exact(hasher))
        assert keys == hasher.keys(want)
        assert len(keys) >= 10
    # negative control: the same conversation passed as text parts to this template prints a list
    tok.chat_format = PARTS
    try:
        wrong = list(routing.keys_for({"messages": messages}, True).exact(hasher))
    finally:
        tok.chat_format = STRING
    assert wrong and wrong != keys


def test_chat_requests_that_are_not_plain_are_scored_by_text(tiny):
    _, tok = tiny
    routing = PrefixRouting(RouterConfig(prefill=("http://p",), decode=("http://d",), block_size=16),
                            RouterMetrics(), tokenize=tok)
    keys = routing.keys_for({"messages": [dict(USER, content="x" * 300)], "tools": [{"type": "function"}]}, True)
    assert not keys.has_exact and keys.text  # the routed index's text keys only


def test_a_template_that_fails_turns_chat_scoring_off(tiny):
    hf, _ = tiny

    class Broken:
        chat_template = "{{ raise }}"

        def apply_chat_template(self, *a, **kw):
            raise ValueError("template error")

    tok = Tokenizer(hf._tokenizer, chat=Broken())
    assert tok.chat_format is None and tok.render_chat({"messages": [USER]}) is None
