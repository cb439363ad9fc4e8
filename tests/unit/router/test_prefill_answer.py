"""The prefill leg's body and what it reads of prefill's answer (prefill_leg.py, abandon.one_token_body)."""

from __future__ import annotations

import msgspec
import pytest

from pdfleet.connector.serving.abandon import ANSWER_ONLY_FIELDS, one_token_body
from pdfleet.connector.serving.prefill_leg import PrefillLeg, answer_kv_params

PARAMS = {"do_remote_decode": True}


@pytest.mark.parametrize("field, value", [
    ("prompt_logprobs", 20), ("logprobs", 5), ("logprobs", True), ("top_logprobs", 3), ("echo", True),
    ("logprob_token_ids", [1, 2]), ("return_token_ids", True), ("return_tokens_as_token_ids", True),
    ("return_token_offsets", True), ("n", 4), ("best_of", 4), ("use_beam_search", True),
    ("stream_options", {"include_usage": True}), ("min_tokens", 9),
])
@pytest.mark.parametrize("chat", [False, True])
def test_the_one_token_leg_drops_what_only_shapes_the_answer(field, value, chat) -> None:
    body = {"model": "m", "prompt": "p", field: value}
    assert field not in PrefillLeg.prefill_body(body, chat=chat)
    assert body[field] == value  # the client's body is not touched


@pytest.mark.parametrize("field, value", [
    ("model", "lora-a"), ("prompt", [1, 2]), ("messages", [{"role": "user", "content": "x"}]),
    ("cache_salt", "s"), ("chat_template", "{{x}}"), ("chat_template_kwargs", {"enable_thinking": False}),
    ("add_generation_prompt", False), ("add_special_tokens", True), ("truncate_prompt_tokens", 100),
    ("priority", 3), ("temperature", 0.2), ("mm_processor_kwargs", {"a": 1}),
])
def test_the_one_token_leg_keeps_what_makes_the_kv(field, value) -> None:
    assert one_token_body({field: value}, PARAMS, chat=True)[field] == value


def test_negative_control_every_dropped_field_was_sent_before() -> None:
    def old(body):  # abandon.one_token_body before: stream_options and min_tokens were the only drops
        out = dict(body, max_tokens=1, stream=False)
        out.pop("stream_options", None)
        out.pop("min_tokens", None)
        return out

    kept_before = [f for f in ANSWER_ONLY_FIELDS if f in old(dict.fromkeys(ANSWER_ONLY_FIELDS, 1))]
    assert {"prompt_logprobs", "echo", "logprobs", "n"} <= set(kept_before)


@pytest.mark.parametrize("answer, params", [
    (b'{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":{"a":1}}', {"a": 1}),
    (b'{"id":"x"}', None),
    (b'{"kv_transfer_params":null}', None),
    (b'{"kv_transfer_params":"s"}', "s"),  # the leg calls it no_kv_transfer_params
    (b'{"prompt_logprobs":[' + b'{"1":{"logprob":-1.0,"rank":1}},' * 10000 + b'null],"kv_transfer_params":{"b":2}}',
     {"b": 2}),
])
def test_answer_kv_params(answer, params) -> None:
    assert answer_kv_params(answer) == params


@pytest.mark.parametrize("answer", [b"[1]", b"not json", b'{"x":' + b"[" * 1000 + b"]" * 1000 + b"}"])
def test_answer_kv_params_refuses_what_is_no_answer(answer) -> None:
    with pytest.raises(msgspec.DecodeError):  # the leg: invalid_json (not a RecursionError out of the leg)
        answer_kv_params(answer)
