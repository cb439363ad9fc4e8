"""A JSON text's nesting, bounded before it is decoded (pure).

msgspec recurses on nested arrays and objects (even into values it skips), so a small body nested
about 1,000 levels raises ``RecursionError`` out of the decoder: an error neither front end turns into
a 400 (the EPP's stream ended instead). ``check_depth`` refuses nesting past a bound first, with
``TooDeep``, a ``msgspec.DecodeError``: every place that already answers invalid JSON with 400 answers
this too. Cheap for ordinary bodies: fewer opening brackets than the bound cannot nest deeper (two
``bytes.count``); otherwise escapes are cut out (escaped backslashes, then escaped quotes: JSON pairs
backslashes from the left), so every quote left delimits a string, everything but quotes and brackets is dropped, the text between
odd and even quotes (strings) goes, and the depth is a running sum over the brackets left: all in C
loops, a few microseconds per thousand strings.
"""

from __future__ import annotations

from array import array
from itertools import accumulate

import msgspec

__all__ = ["MAX_JSON_DEPTH", "TooDeep", "check_depth", "depth"]

# Far deeper than any request body's JSON (a tool's JSON schema nests a few dozen levels at most), far
# shallower than msgspec's recursion can reach on any thread.
MAX_JSON_DEPTH = 128

_NOT_SYNTAX = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes


class TooDeep(msgspec.DecodeError):
    """A JSON text nested deeper than the bound."""


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (brackets inside strings do not count; an
    unterminated string runs to the end of the text)."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then escaped quotes
    outside = b"".join(text.translate(None, _NOT_SYNTAX).split(b'"')[::2])  # odd parts are strings
    steps = array("b", outside.translate(_STEP))
    return max(accumulate(steps, initial=0))  # about 20 ns a bracket


def check_depth(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ``TooDeep`` (naming the limit) when ``raw`` nests arrays and objects deeper than ``max_depth``."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return  # too few openings to nest deeper
    if depth(raw) > max_depth:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels (the limit of nesting in a request body)")
