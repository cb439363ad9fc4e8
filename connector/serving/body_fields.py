"""The request numbers the fleet acts on, read as vLLM 0.32's request models read them (pure).

vLLM validates a body with pydantic in lax mode (``CompletionRequest`` / ``ChatCompletionRequest``,
``vllm/entrypoints/openai/*/protocol.py``), so an ``int`` field takes an int, a bool (as 0/1), a
finite float with no fractional part inside int64, or a string of an int (Unicode whitespace
around it, ``_`` between digits, a ``.000`` tail); a ``bool`` field takes ``"yes"``/``"on"``/
``"t"``/1/0.0 and the like. A front end that reads ``"4096"`` as "no limit" or ``"n": "4"`` as one
choice misjudges cost and fan-out. ``tests/unit/router/test_body_fields.py`` runs the same values
through pydantic itself, so the two cannot drift.

What vLLM refuses (a type pydantic refuses, ``null`` where the field is not optional, and the
ranges ``SamplingParams`` checks: max_tokens >= 1, 0 <= min_tokens <= max_tokens, n >= 1) raises
``FieldError`` naming the field. The callers leave such a request for vLLM to refuse, from decode
alone (fanout.py: prefill never sees these fields, so P/D would spend a prefill and a lease on it);
a request parser may refuse it with 400 instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FieldError", "Numbers", "lax_bool", "lax_int", "read_numbers", "COMPLETIONS_DEFAULT_MAX_TOKENS"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens's default (a chat request has none)
_MAX_INT_DIGITS = 4300  # pydantic-core refuses an int string with more digits (int_parsing_size)
_I64 = 2**63  # a float converts only strictly inside (-2**63, 2**63)
# Rust's char::is_whitespace (pydantic-core trims with str::trim); Python's str.strip() also strips \x1c-\x1f.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
              "\u2028\u2029\u202f\u205f\u3000"
_JSON_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")  # what jiter's NumberInt parses
_NONZERO_OR_MINUS = frozenset("123456789-")
_TRUE = frozenset(("true", "yes", "on", "y", "t", "1"))
_FALSE = frozenset(("false", "no", "off", "n", "f", "0"))


class FieldError(ValueError):
    """A body field vLLM would refuse."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        super().__init__(f"{field}: {why}, got {_shown(value)}")
        self.field = field


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def lax_int(value: Any) -> int:
    """``value`` as pydantic's lax ``int`` reads it; ValueError where pydantic refuses it."""
    if isinstance(value, int):  # bool included: True is 1
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer() or not -_I64 < value < _I64:
            raise ValueError("not an integer")
        return int(value)
    if isinstance(value, str):
        text = value if _JSON_INT.fullmatch(value) else _cleaned(value)
        if text is None or not _JSON_INT.fullmatch(text) or len(text.lstrip("-")) > _MAX_INT_DIGITS:
            raise ValueError("not an integer")
        return int(text)
    raise ValueError("not an integer")


def _cleaned(text: str) -> str | None:
    """pydantic-core's clean_int_str (src/input/shared.rs), quirks included ("0-1" is -1): whitespace
    trimmed, one sign, leading zeros and a ``.000`` tail dropped, single ``_`` between digits removed;
    None where it gives up."""
    length = len(text)
    text = text.strip(_WHITESPACE)
    if text.startswith("+"):
        if text.startswith("+-"):
            return None
        text = text[1:]
    sign = ""
    if text.startswith("-"):
        if text[1:2] in ("-", "+"):
            return None
        sign, text = "-", text[1:]
    text = _without_leading_zeros(text)
    if text is None:
        return None
    whole, dot, decimals = text.partition(".")
    if dot and decimals and decimals.strip("0") == "":
        text = whole
    if "_" in text and "__" not in text and not text.startswith("_") and not text.endswith("_"):
        return sign + text.replace("_", "")
    return None if len(text) == length else sign + text


def _without_leading_zeros(text: str) -> str | None:
    """pydantic-core's strip_leading_zeros: the text from its first digit 1-9 or '-' after leading zeros
    (and ``_``), keeping one zero before a '.'; None if another character comes first."""
    if not text or (text[0] != "0" and text[0] not in _NONZERO_OR_MINUS):
        return None
    if text[0] != "0":
        return text
    for i, char in enumerate(text[1:], 1):
        if char in _NONZERO_OR_MINUS:
            return text[i:]
        if char == ".":
            return text[i - 1:]
        if char not in "0_":
            return None
    return text[-1]


def lax_bool(value: Any) -> bool:
    """``value`` as pydantic's lax ``bool`` reads it; ValueError where pydantic refuses it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    raise ValueError("not a boolean")


@dataclass(frozen=True)
class Numbers:
    """What vLLM will do with a body's numbers."""

    max_tokens: int | None  # the generation limit the client set; None (chat only): to the context's end
    min_tokens: int = 0
    n: int = 1  # choices (one engine request each)
    use_beam_search: bool = False


def _field(body: Mapping[str, Any], name: str, read, *, nullable: bool, default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        if not nullable:
            raise FieldError(name, value, "must not be null")
        return None
    try:
        return read(value)
    except ValueError:
        raise FieldError(name, value, f"must be {'a boolean' if read is lax_bool else 'an integer'}") from None


def read_numbers(body: Mapping[str, Any], *, chat: bool) -> Numbers:
    """The body's numbers as vLLM reads them; ``FieldError`` for the first one vLLM refuses."""
    limit_field = "max_tokens"
    if chat:  # both validated; max_completion_tokens wins when set (ChatCompletionRequest.build_tok_params)
        limit = _field(body, "max_tokens", lax_int, nullable=True, default=None)
        completion_limit = _field(body, "max_completion_tokens", lax_int, nullable=True, default=None)
        if completion_limit is not None:
            limit_field, limit = "max_completion_tokens", completion_limit
        _field(body, "echo", lax_bool, nullable=False, default=False)
    else:  # null is the default (normalize_null_max_tokens); 0 with echo: the prompt only, run as 1 token
        limit = _field(body, "max_tokens", lax_int, nullable=True, default=None)
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS if limit is None else limit
        if _field(body, "echo", lax_bool, nullable=True, default=False) and limit == 0:
            limit = 1
    min_tokens = _field(body, "min_tokens", lax_int, nullable=False, default=0)
    n = _field(body, "n", lax_int, nullable=chat, default=1)
    beam = _field(body, "use_beam_search", lax_bool, nullable=False, default=False)
    if limit is not None and limit < 1:
        raise FieldError(limit_field, body.get(limit_field), "must be at least 1")
    if min_tokens < 0:
        raise FieldError("min_tokens", body.get("min_tokens"), "must be at least 0")
    if limit is not None and min_tokens > limit:
        raise FieldError("min_tokens", body.get("min_tokens"), f"must be at most {limit_field}={limit}")
    if n is not None and n < 1:
        raise FieldError("n", body.get("n"), "must be at least 1")
    return Numbers(limit, min_tokens, 1 if n is None else n, beam)
