"""The sink's pure decisions: a READ's time bound, heartbeat chunking (table tests)."""

from __future__ import annotations

import msgspec
import pytest

from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.heartbeats import chunk_request_ids
from pdfleet.connector.transfer.pull_state import read_deadline_seconds


@pytest.mark.parametrize("nbytes,bw,floor,want", [
    (0, 50e6, 5.0, 5.0),
    (50_000_000, 50e6, 5.0, 6.0),
    (256 * 2**20, 50e6, 5.0, 5.0 + 256 * 2**20 / 50e6),
    (10**9, 1e9, 0.0, 1.0),
    (-5, 1e6, 2.0, 2.0),
])  # fmt: skip
def test_read_deadline(nbytes, bw, floor, want):
    assert read_deadline_seconds(nbytes, bw, floor) == pytest.approx(want)


@pytest.mark.parametrize("bw,floor", [(0, 1.0), (-1, 1.0), (1e6, -0.1), (float("nan"), 1.0)])
def test_read_deadline_refuses_nonsense(bw, floor):
    with pytest.raises(ValueError):
        read_deadline_seconds(1, bw, floor)


@pytest.mark.parametrize("ids,max_ids,max_bytes,want", [
    ([], 3, 100, []),
    (["a", "b", "c"], 3, 100, [["a", "b", "c"]]),
    (["a", "b", "c", "d"], 3, 100, [["a", "b", "c"], ["d"]]),
    (["aaaa", "bbbb", "cccc"], 10, 18, [["aaaa", "bbbb"], ["cccc"]]),  # 9 bytes each at most
    (["x" * 50, "y"], 10, 18, [["x" * 50], ["y"]]),  # too long alone: a chunk of its own
])  # fmt: skip
def test_chunk_request_ids(ids, max_ids, max_bytes, want):
    assert chunk_request_ids(ids, max_ids, max_bytes) == want


def test_10000_ids_chunk_into_requests_the_codec_and_the_source_accept():
    ids = [f"cmpl-{i:08d}-{'z' * 40}" for i in range(10_000)]
    chunks = chunk_request_ids(ids)
    assert [r for c in chunks for r in c] == ids
    codec = wire.request_codec(b"k" * 32)
    for c in chunks:
        assert len(c) <= 4096
        frames = codec.encode(wire.HeartbeatRequest(id=1, request_ids=c, agent="a" * 80))
        assert len(frames[0]) <= wire.MAX_REQUEST_BYTES
    # negative control: the whole list in one request is what used to be refused
    with pytest.raises(ValueError):
        codec.encode(wire.HeartbeatRequest(id=1, request_ids=ids))
    assert msgspec.msgpack.encode(ids)
