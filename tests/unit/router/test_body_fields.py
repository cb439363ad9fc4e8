"""Body numbers read as vLLM reads them (connector/serving/body_fields.py), held against pydantic itself.

The same values go through a pydantic model in lax mode (how vLLM 0.32's request models read a body)
and through the reader: where pydantic gives an int, the reader gives the same int; where pydantic
refuses, the reader refuses. A sweep of short strings over the characters that matter keeps the two
from drifting on inputs nobody thought to list. Where vLLM is installed, its own request models and
SamplingParams are the reference for the table rows.
"""

from __future__ import annotations

import itertools
import json

import msgspec
import pytest
from pydantic import BaseModel, ValidationError

from pdfleet.connector.serving.body_fields import FieldError, Numbers, lax_bool, lax_int, read_numbers

_REFUSED = object()


class _Int(BaseModel):
    v: int


class _Bool(BaseModel):
    v: bool


def _pydantic(model: type[BaseModel], value):
    try:
        return model.model_validate({"v": value}).v
    except ValidationError:
        return _REFUSED


def _ours(read, value):
    try:
        return read(value)
    except ValueError:
        return _REFUSED


INT_VALUES = [
    4, -4, 0, True, False, 2**70, -(2**70),
    4.0, -0.0, 4.5, 0.5, 1e3, 1e20, 9.2e18, 9.223372036854775e18, 2.0**63, -(2.0**63), float("nan"), float("inf"),
    "4", " 4 ", "4.0", "4.00", "+4.0", "-4", "4.5", "4.", ".0", "4.0.0", "1e3", "0x10", "4_000", "_4", "4_", "4__0",
    "1_000.0", "4.0_0", "04", "-0", "", " ", "+", "- 4", "abc", "true", "\u00a04", "\u20034\u2028", "\x1c4", "\ufeff4",
    "\u0664", "\uff14", "\t4\n", "1" * 4300, "1" * 4301, "1" * 4298 + ".0",
    None, [], {}, [4], {"v": 4},
]
BOOL_VALUES = [True, False, 1, 0, 2, -1, 1.0, 0.0, 0.5, "true", "True", "tRuE", "yes", "on", "y", "t", "1", "0", "false",
               "no", "off", "n", "f", " true", "true ", "2", "1.0", "", "ye", None, [], "\u212a"]


@pytest.mark.parametrize("value", INT_VALUES, ids=repr)
def test_lax_int_reads_what_pydantic_reads(value) -> None:
    assert _ours(lax_int, value) == _pydantic(_Int, value)


@pytest.mark.parametrize("value", BOOL_VALUES, ids=repr)
def test_lax_bool_reads_what_pydantic_reads(value) -> None:
    assert _ours(lax_bool, value) == _pydantic(_Bool, value)


def test_short_strings_swept_agree_with_pydantic() -> None:
    alphabet = "09._+-e x\t\u00a0\x1c\u0664"
    for size in range(1, 5):
        for chars in itertools.product(alphabet, repeat=size):
            text = "".join(chars)
            assert _ours(lax_int, text) == _pydantic(_Int, text), repr(text)
    for text in ("1", "0", "t", "f", "y", "n", "on", "off", "yes", "no", "true", "false"):
        for variant in {text.upper(), text.title(), text}:
            assert _ours(lax_bool, variant) == _pydantic(_Bool, variant), repr(variant)


def _old_positive_int(value):  # cost.py and fanout.py before body_fields: a strict int, no bool
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def test_negative_control_the_old_strict_reader_fails_the_lax_rows() -> None:
    lax_rows = [v for v in ("4096", 4096.0, " 4 ", "4_096", "4.0") if _pydantic(_Int, v) is not _REFUSED]
    assert lax_rows and all(_old_positive_int(v) is None for v in lax_rows)
    assert all(lax_int(v) == _pydantic(_Int, v) for v in lax_rows)


@pytest.mark.parametrize("body, chat, numbers", [
    ({}, False, Numbers(16)),  # CompletionRequest.max_tokens defaults to 16
    ({}, True, Numbers(None)),  # a chat request runs to the context's end
    ({"max_tokens": None}, False, Numbers(16)),  # a completion's null is the default (normalize_null_max_tokens)
    ({"max_tokens": 0, "echo": "yes"}, False, Numbers(1)),  # the prompt echoed, run as one token
    ({"max_tokens": "4096"}, False, Numbers(4096)),
    ({"max_tokens": 4096.0, "min_tokens": "10", "n": "4"}, False, Numbers(4096, 10, 4)),
    ({"max_tokens": 99, "max_completion_tokens": "5"}, True, Numbers(5)),  # max_completion_tokens wins
    ({"max_tokens": 99, "max_completion_tokens": None}, True, Numbers(99)),
    ({"n": None}, True, Numbers(None)),  # chat's n is optional
    ({"n": True}, False, Numbers(16, 0, 1)),  # True is 1
    ({"use_beam_search": "yes"}, False, Numbers(16, use_beam_search=True)),
    ({"best_of": "abc"}, False, Numbers(16)),  # not a field of vLLM 0.32's models: ignored
    ({"max_completion_tokens": "abc"}, False, Numbers(16)),  # nor max_completion_tokens in a completion
])
def test_read_numbers(body, chat, numbers) -> None:
    assert read_numbers(body, chat=chat) == numbers


@pytest.mark.parametrize("body, chat, message", [
    ({"n": "four"}, False, "n: must be an integer, got 'four'"),
    ({"n": None}, False, "n: must not be null"),  # CompletionRequest.n is not optional
    ({"min_tokens": None}, True, "min_tokens: must not be null"),
    ({"max_tokens": 4.5}, False, "max_tokens: must be an integer, got 4.5"),
    ({"max_tokens": 10, "max_completion_tokens": [1]}, True, "max_completion_tokens: must be an integer"),
    ({"max_tokens": "x", "max_completion_tokens": 5}, True, "max_tokens: must be an integer"),  # both validated
    ({"use_beam_search": "maybe"}, False, "use_beam_search: must be a boolean"),
    ({"max_tokens": 0}, False, "max_tokens: must be at least 1, got 0"),
    ({"max_completion_tokens": "-3"}, True, "max_completion_tokens: must be at least 1, got '-3'"),
    ({"min_tokens": -1}, False, "min_tokens: must be at least 0"),
    ({"max_tokens": 5, "min_tokens": 6}, False, "min_tokens: must be at most max_tokens=5, got 6"),
    ({"min_tokens": 17}, False, "min_tokens: must be at most max_tokens=16"),  # the default limit
    ({"n": 0}, True, "n: must be at least 1, got 0"),
])
def test_read_numbers_refuses_what_vllm_refuses(body, chat, message) -> None:
    with pytest.raises(FieldError, match=message.replace("[", r"\[")):
        read_numbers(body, chat=chat)


def test_json_numbers_through_our_decoder_match_vllms_decoder() -> None:
    """The router decodes with msgspec, vLLM (FastAPI) with json.loads: the same number either way."""
    for text in ("4", "4.0", "1e3", "-0.0", "4.0000000000000001", '"4"', "true", "9223372036854775807"):
        raw = b'{"n": ' + text.encode() + b"}"
        assert lax_int(msgspec.json.decode(raw)["n"]) == _pydantic(_Int, json.loads(raw)["n"]), text


# vLLM's own models, where the package is installed (importing it takes a few seconds).
@pytest.fixture(scope="module")
def vllm_models():
    completion = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
    chat = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    return completion.CompletionRequest, chat.ChatCompletionRequest, SamplingParams, VLLMValidationError


def _vllm_reads(models, body: dict, *, chat: bool):
    """What vLLM makes of the body's numbers, or _REFUSED (its model, then SamplingParams' checks)."""
    completion_model, chat_model, sampling, refusal = models
    base = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    try:
        req = (chat_model if chat else completion_model).model_validate({**base, **body})
        limit = (req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens) if chat \
            else 1 if req.echo and req.max_tokens == 0 else req.max_tokens  # CompletionRequest.to_sampling_params
        sampling(n=req.n if req.n is not None else 1, max_tokens=limit, min_tokens=req.min_tokens)
    except (ValidationError, refusal):
        return _REFUSED
    return Numbers(limit, req.min_tokens, req.n if req.n is not None else 1, req.use_beam_search)


VLLM_ROWS = [{"max_tokens": v} for v in (4096, "4096", 4096.0, " 7 ", "7.00", True, 4.5, "x", None, 0, -2, [3])] + [
    {"n": v} for v in (4, "4", 4.0, True, False, None, 0, "2.5", "+3")] + [
    {"min_tokens": v} for v in (3, "3", 3.0, None, -1, 17)] + [
    {"use_beam_search": v} for v in (True, "true", "on", 1, 0.0, "maybe", None)] + [
    {"max_completion_tokens": "5", "max_tokens": 99}, {"max_completion_tokens": None, "max_tokens": "9"},
    {"max_tokens": 5, "min_tokens": "5"}, {"max_tokens": "5", "min_tokens": 6}, {"best_of": 4},
    {"max_tokens": 0, "echo": True}, {"max_tokens": "0", "echo": "on"}, {"max_tokens": 0, "echo": None},
    {"echo": "maybe"}, {"echo": None}]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("body", VLLM_ROWS, ids=repr)
def test_read_numbers_agrees_with_vllms_models(vllm_models, body, chat) -> None:
    try:
        ours = read_numbers(body, chat=chat)
    except FieldError:
        ours = _REFUSED
    assert ours == _vllm_reads(vllm_models, body, chat=chat)
