"""Bounds checked before decoding untrusted msgpack, and rate-limited drop logging (pure).

``check_depth`` walks a msgpack document's structure without building it (each item
costs one step, strings and binaries are skipped by length) and refuses nesting
deeper than a bound: msgspec recurses on nested containers, even when it skips an
unknown field, so a small, deeply nested message would otherwise raise
``RecursionError`` out of the decoder. ``DropLog`` turns a flood of dropped messages
into one log line per reason per interval, with the count of those it held back.
"""

from __future__ import annotations

import struct

__all__ = ["TooDeep", "Truncated", "check_depth", "DropLog"]

# Header byte -> (number of length bytes, kind): kind "skip" (n payload bytes follow the
# length), "arr"/"map" (n items / pairs), "ext" (type byte + n bytes).
_VAR = {
    0xC4: (1, "skip"), 0xC5: (2, "skip"), 0xC6: (4, "skip"),
    0xD9: (1, "skip"), 0xDA: (2, "skip"), 0xDB: (4, "skip"),
    0xC7: (1, "ext"), 0xC8: (2, "ext"), 0xC9: (4, "ext"),
    0xDC: (2, "arr"), 0xDD: (4, "arr"), 0xDE: (2, "map"), 0xDF: (4, "map"),
}  # fmt: skip
_FIXED = {
    0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip
_LEN = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}


class TooDeep(ValueError):
    pass


class Truncated(ValueError):
    pass


def check_depth(data: bytes, max_depth: int) -> None:
    """Raise ``TooDeep`` when ``data``'s first msgpack document nests containers deeper
    than ``max_depth``, ``Truncated`` when it ends early or uses a reserved byte.

    Work is bounded by ``len(data)``: every item consumes at least one byte.
    """
    n = len(data)
    pos = 0
    stack: list[int] = []
    remaining = 1
    while True:
        if remaining == 0:
            if not stack:
                return
            remaining = stack.pop()
            continue
        remaining -= 1
        if pos >= n:
            raise Truncated("msgpack document ends early")
        b = data[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0:
            continue
        if b <= 0x9F:  # fixmap (0x80-0x8f) / fixarray (0x90-0x9f)
            count = (b & 0x0F) * (2 if b <= 0x8F else 1)
        elif b <= 0xBF:  # fixstr
            pos += b & 0x1F
            continue
        elif b in _FIXED:
            pos += _FIXED[b]
            continue
        else:
            spec = _VAR.get(b)
            if spec is None:
                raise Truncated(f"reserved msgpack byte 0x{b:02x}")
            width, kind = spec
            if pos + width > n:
                raise Truncated("msgpack document ends early")
            (length,) = _LEN[width].unpack_from(data, pos)
            pos += width
            if kind == "skip":
                pos += length
                continue
            if kind == "ext":
                pos += 1 + length
                continue
            count = length * (2 if kind == "map" else 1)
        if count:
            if len(stack) >= max_depth:
                raise TooDeep(f"nested deeper than {max_depth} levels")
            stack.append(remaining)
            remaining = count


class DropLog:
    """One line per reason per ``interval`` seconds; the rest are counted and reported with the next line."""

    def __init__(self, interval: float = 10.0) -> None:
        if not interval > 0:
            raise ValueError("interval must be > 0 seconds")
        self.interval = float(interval)
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def note(self, reason: str, now: float) -> int | None:
        """None: stay quiet (counted). Else: log now, saying this many like it were held back since the last line."""
        last = self._last.get(reason)
        if last is not None and now - last < self.interval:
            self._held[reason] = self._held.get(reason, 0) + 1
            return None
        if len(self._last) > 256 and reason not in self._last:  # reasons are a small fixed set; stay bounded
            self._last.clear()
            self._held.clear()
        self._last[reason] = now
        return self._held.pop(reason, 0)
