"""KV event messages: decoding and bounds, the block index, sequence tracking, gap/restart handling."""

from __future__ import annotations

import pickle

import msgspec
import pytest

from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.kvaware.kv_subscriber import Counters, EndpointState, EventSource, handle_message

enc = msgspec.msgpack.encode


def stored(*hashes, medium="GPU", group=0):
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None, "token_ids": [1],
            "block_size": 32, "lora_id": None, "medium": medium, "lora_name": None, "group_idx": group}


def removed(*hashes):
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def frames(seq, *events, dp=0, ts=1.0):
    return [b"", seq.to_bytes(8, "big"), enc([ts, list(events), dp])]


# ---- decoding: the fuzz table --------------------------------------------------------

GOOD = frames(0, stored(1, 2))
FUZZ = [
    ("garbage", [b"", (0).to_bytes(8, "big"), b"\xc1\xff\x00garbage"], "malformed"),
    ("pickle", [b"", (0).to_bytes(8, "big"), pickle.dumps([1.0, [stored(1)], 0])], "malformed"),
    ("truncated", [b"", (0).to_bytes(8, "big"), GOOD[2][:-3]], "malformed"),
    ("huge", [b"", (0).to_bytes(8, "big"), enc([1.0, [stored(*range(10))], 0]) + b"\x00" * 100], "malformed"),
    ("oversized", [b"", (0).to_bytes(8, "big"), b"\x00" * (ke.MAX_MESSAGE_BYTES + 1)], "oversized"),
    ("too many hashes", frames(0, stored(*range(ke.MAX_HASHES_PER_EVENT + 1))), "malformed"),
    ("hash too long", frames(0, stored(b"x" * 65)), "malformed"),
    ("wrong type: hashes", frames(0, {**stored(1), "block_hashes": "abc"}), "malformed"),
    ("wrong type: batch", [b"", (0).to_bytes(8, "big"), enc({"ts": 1.0})], "malformed"),
    ("wrong type: events", [b"", (0).to_bytes(8, "big"), enc([1.0, "events", 0])], "malformed"),
    ("negative hash", frames(0, stored(-5)), None),  # ints are kept as the low 64 bits
    ("one frame", [GOOD[2]], "frames"),
    ("four frames", GOOD + [b""], "frames"),
    ("short seq", [b"", b"\x00\x01", GOOD[2]], "bad_seq"),
    ("negative seq", [b"", (-2).to_bytes(8, "big", signed=True), GOOD[2]], "bad_seq"),
    ("other dp rank", frames(0, stored(1), dp=1), "dp_rank"),
]


@pytest.mark.parametrize("label, message, reason", FUZZ, ids=[f[0] for f in FUZZ])
def test_decode_message_drops_bad_input_with_a_reason(label, message, reason):
    got = ke.decode_message(message)
    if reason is None:
        assert isinstance(got, ke.Message)
    else:
        assert got == reason


def test_decode_message_reads_vllms_shape_and_skips_unknown_event_types():
    msg = ke.decode_message(frames(7, stored(1, b"\x00" * 24 + b"\x01" * 8), {"type": "FutureEvent", "x": 1},
                                   removed(1), {"type": "AllBlocksCleared"}))
    assert isinstance(msg, ke.Message) and msg.seq == 7 and msg.unknown_events == 1
    assert [type(e).__name__ for e in msg.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]


def test_bytes_and_int_hashes_share_one_key():
    digest = bytes(range(32))
    assert ke.hash_key(digest) == ke.hash_key(int.from_bytes(digest, "big") & ke.HASH_MASK)


# ---- the index -------------------------------------------------------------------------


def apply(index, *events):
    msg = ke.decode_message(frames(0, *events))
    assert isinstance(msg, ke.Message)
    return index.apply(msg.events)


def test_index_follows_stored_removed_cleared():
    idx = ke.BlockIndex()
    assert apply(idx, stored(1, 2, 3), removed(2)) == {}  # nothing evicted
    assert sorted(idx.hashes) == [1, 3]
    apply(idx, stored(9, medium="CPU"), stored(8, group=1))  # another tier: its own; another group: not this cache
    assert sorted(idx.hashes) == [1, 3] and sorted(idx.tiers["CPU"]) == [9] and 8 not in idx
    apply(idx, {"type": "AllBlocksCleared"}, stored(4))  # clears every tier
    assert sorted(idx.hashes) == [4] and len(idx) == 1


def test_index_is_bounded_per_tier_evicting_the_oldest():
    idx = ke.BlockIndex(max_blocks=3)
    assert apply(idx, stored(1, 2, 3, 4)) == {"GPU": 1}
    assert sorted(idx.hashes) == [2, 3, 4]


# ---- sequence numbers ------------------------------------------------------------------


@pytest.mark.parametrize("last, replayed_upto, seq, expected", [
    (None, None, 0, ke.NEXT),
    (None, None, 5, ke.GAP),  # joined late
    (4, None, 5, ke.NEXT),
    (4, None, 7, ke.GAP),
    (4, None, 4, ke.RESTART),
    (4, None, 0, ke.RESTART),
    (9, 9, 3, ke.DUPLICATE),  # the live stream repeating what a replay delivered
    (9, 9, 10, ke.NEXT),
])
def test_stream_tracker(last, replayed_upto, seq, expected):
    assert ke.StreamTracker(last, replayed_upto).classify(seq) == expected


@pytest.mark.parametrize("expected, first, upto, covers", [
    (5, 5, 8, True), (5, 3, 8, True), (5, 6, 8, False), (5, None, 8, False), (5, None, 5, True),
])
def test_replay_covers(expected, first, upto, covers):
    assert ke.replay_covers(expected, first, upto) is covers


def test_replay_frames():
    assert ke.encode_replay_request(3) == [b"", (3).to_bytes(8, "big")]
    assert ke.is_replay_end([b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
    assert not ke.is_replay_end([b"", b"", (1).to_bytes(8, "big"), b"x"])


# ---- handle_message: gaps, restarts, replays -------------------------------------------


class Count(Counters):
    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def received(self, url):
        self.events.append(("received", ""))

    def dropped(self, url, reason):
        self.events.append(("dropped", reason))

    def reset(self, url, reason):
        self.events.append(("reset", reason))


def state(replay=True):
    return EndpointState(EventSource("http://e", "tcp://e:1", "tcp://e:2" if replay else None), ke.BlockIndex())


def msg(seq, *events):
    m = ke.decode_message(frames(seq, *events))
    assert isinstance(m, ke.Message)
    return m


def test_in_order_stream_builds_the_index():
    s, c = state(), Count()
    for seq, ev in enumerate([stored(1), stored(2), removed(1)]):
        handle_message(s, frames(seq, ev), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: None)
    assert sorted(s.index.hashes) == [2] and s.synced and s.tracker.last == 2


def test_gap_filled_by_replay_keeps_the_index():
    s, c = state(), Count()
    handle_message(s, frames(0, stored(1)), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: None)
    asked = []

    def replay(start, stop):
        asked.append((start, stop))
        return [msg(1, stored(2)), msg(2, stored(3))]

    handle_message(s, frames(3, stored(4)), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=replay)
    assert asked == [(1, 3)] and sorted(s.index.hashes) == [1, 2, 3, 4]
    assert ("reset", "gap") not in c.events


@pytest.mark.parametrize("replay_answer, replay_endpoint", [
    (None, True),  # replay did not answer
    ([], True),  # replay buffer no longer holds the missing batches
    ("unused", False),  # engine offers no replay
])
def test_gap_that_replay_cannot_fill_resets_the_index(replay_answer, replay_endpoint):
    s, c = state(replay_endpoint), Count()
    handle_message(s, frames(0, stored(1)), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: None)
    handle_message(s, frames(5, stored(4)), c, max_bytes=ke.MAX_MESSAGE_BYTES,
                   replay=lambda a, b: replay_answer)
    assert sorted(s.index.hashes) == [4] and ("reset", "gap") in c.events and s.tracker.last == 5


def test_publisher_restart_resets_the_index():
    s, c = state(), Count()
    for seq in range(3):
        handle_message(s, frames(seq, stored(seq + 10)), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: None)
    handle_message(s, frames(0, stored(99)), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: None)
    assert sorted(s.index.hashes) == [99] and ("reset", "restart") in c.events


BAD = [f for f in FUZZ if f[2] is not None]


@pytest.mark.parametrize("label, message, reason", BAD, ids=[f[0] for f in BAD])
def test_bad_messages_change_nothing(label, message, reason):
    s, c = state(), Count()
    handle_message(s, frames(0, stored(1)), c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: None)
    before = (set(s.index.hashes), s.tracker.last)
    handle_message(s, message, c, max_bytes=ke.MAX_MESSAGE_BYTES, replay=lambda a, b: pytest.fail("no replay"))
    assert (set(s.index.hashes), s.tracker.last) == before
    assert c.events[-1] == ("dropped", reason)
