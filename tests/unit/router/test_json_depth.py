"""A JSON text's nesting bounded before decoding (connector/serving/json_depth.py, upstream.json_decode)."""

from __future__ import annotations

import sys

import itertools

import msgspec
import pytest

from pdfleet.connector.serving.json_depth import MAX_JSON_DEPTH, TooDeep, check_depth, depth
from pdfleet.connector.serving.upstream import json_decode


def nested(levels: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' * levels + inner + b"}" * levels


@pytest.mark.parametrize("raw, expected", [
    (b"", 0),
    (b"1", 0),
    (b"{}", 1),
    (b'{"a":[1,{"b":[]}]}', 4),
    (b'[[],[],[[]]]', 3),
    (b'"[[[[{{{{"', 0),  # brackets inside a string are text
    (b'{"a":"[[[[\\"[[[["}', 1),  # an escaped quote does not end the string
    (b'{"a":"x\\\\","b":[[1]]}', 3),  # an escaped backslash does
    (b'{"a":"unterminated [[[[', 1),  # an unterminated string runs to the end
    (b'{"a":"x\\', 1),
    (b"[[[", 3),  # unclosed: msgspec recurses that deep before it sees the end
    (nested(200), 200),
    (b'{"p":"' + b"[" * 1000 + b'"}', 1),
])
def test_depth(raw, expected) -> None:
    assert depth(raw) == expected


@pytest.mark.parametrize("raw, refused", [
    (nested(MAX_JSON_DEPTH), False),
    (nested(MAX_JSON_DEPTH + 1), True),
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), True),
    (b"[" + b"[]," * 5000 + b"[]]", False),  # many brackets, shallow: the scan runs and passes
    (b'{"prompt":"' + b"{" * 1000 + b'"}', False),  # a string holding 1,000 brackets is not nesting
    (b'{"messages":[' + b'{"role":"user","content":"[{"},' * 300 + b"{}]}", False),
])
def test_check_depth(raw, refused) -> None:
    if refused:
        with pytest.raises(TooDeep, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            check_depth(raw)
    else:
        check_depth(raw)


def _reference_depth(text: str) -> int | None:
    """A JSON lexer's view, one character at a time; None where a backslash stands outside a string
    (no JSON: msgspec stops there, before any bracket after it)."""
    level = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == "\\":
            return None
        elif char == '"':
            in_string = True
        elif char in "[{":
            level += 1
            deepest = max(deepest, level)
        elif char in "]}":
            level -= 1
    return deepest


def test_depth_agrees_with_a_lexer_on_every_short_text() -> None:
    compared = 0
    for size in range(1, 8):
        for chars in itertools.product('[]{"\\a', repeat=size):
            text = "".join(chars)
            expected = _reference_depth(text)
            if expected is not None:
                assert depth(text.encode()) == expected, text
                compared += 1
    assert compared > 50_000


def test_json_decode_refuses_deep_nesting_as_invalid_json() -> None:
    """Both front ends answer msgspec.DecodeError with 400: TooDeep is one; RecursionError was not."""
    raw = nested(1000)
    with pytest.raises(msgspec.DecodeError, match="nested deeper than 128 levels"):
        json_decode(raw)
    assert json_decode(nested(MAX_JSON_DEPTH)) == msgspec.json.decode(nested(MAX_JSON_DEPTH))
    # negative control: the decoder alone (json_decode before the bound) raises RecursionError, which
    # no front end caught as a client error, under CPython's default recursion limit (a library imported
    # earlier in the same process may have raised it: set it here, as a front end's process has it)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(RecursionError):
            msgspec.json.decode(raw)
    finally:
        sys.setrecursionlimit(old)
