"""check_depth and DropLog (pure): table tests."""

from __future__ import annotations

import msgspec
import pytest

from pdfleet.connector.transfer.bounds import DropLog, TooDeep, Truncated, check_depth

enc = msgspec.msgpack.encode


@pytest.mark.parametrize("doc,limit,ok", [
    (1, 0, True),
    ("x" * 300, 0, True),
    (b"\x00" * 70000, 0, True),  # bin32 skipped by its length
    ([], 0, True),  # an empty container adds no level
    ([1], 0, False),
    ([1], 1, True),
    ([[1]], 1, False),
    ({"a": {"b": [1, 2]}}, 3, True),
    ({"a": {"b": [1, 2]}}, 2, False),
    ([1.5, -3, 2**40, None, True, "s" * 40, {"k": [b"b" * 300]}], 3, True),
    (msgspec.msgpack.Ext(1, b"x" * 20), 0, True),
    ([[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]], 16, False),
])  # fmt: skip
def test_check_depth(doc, limit, ok):
    data = enc(doc)
    if ok:
        check_depth(data, limit)
    else:
        with pytest.raises(TooDeep):
            check_depth(data, limit)


@pytest.mark.parametrize("data", [b"", b"\x92\x01", b"\xdc\xff\xff", b"\xc1", b"\xda\x00"])
def test_check_depth_refuses_truncated_or_reserved(data):
    with pytest.raises(Truncated):
        check_depth(data, 8)


def test_check_depth_costs_one_step_per_byte_at_most():
    # A claimed 2**32-item array with nothing behind it ends at once.
    with pytest.raises(Truncated):
        check_depth(b"\xdd\xff\xff\xff\xff" + b"\x01" * 10, 8)
    with pytest.raises(TooDeep):
        check_depth(b"\x91" * 100_000 + b"\xc0", 16)


def test_drop_log_one_line_per_reason_per_interval_with_the_count_held_back():
    log = DropLog(10.0)
    seen = [(t, r, log.note(r, t)) for t, r in
            [(0, "a"), (1, "a"), (2, "b"), (3, "a"), (10.5, "a"), (11, "a"), (12, "b"), (25, "a")]]
    assert seen == [(0, "a", 0), (1, "a", None), (2, "b", 0), (3, "a", None), (10.5, "a", 2), (11, "a", None),
                    (12, "b", 0), (25, "a", 1)]
    with pytest.raises(ValueError):
        DropLog(0)


@pytest.mark.parametrize("entries,want", [
    ([("a", False, True), ("b", True, True)], "a"),
    ([("a", True, True), ("b", False, False)], "b"),
    ([("a", True, True), ("b", True, False), ("c", True, False)], "b"),  # never answered goes first
    ([("a", True, True), ("b", True, True)], "a"),  # all busy and healthy: least recently used
])  # fmt: skip
def test_pool_victim(entries, want):
    from pdfleet.connector.transfer.sidechannel import pool_victim

    assert pool_victim(entries) == want
