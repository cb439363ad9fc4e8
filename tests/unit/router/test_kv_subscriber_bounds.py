"""KV event subscriber bounds and restarts (issue 20 row 4)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq.asyncio

from pdfleet.connector.router import kv_events as ke
from pdfleet.connector.router import kv_subscriber as ks


@pytest.mark.parametrize("max_bytes, depth", [
    (8 * 2**20, 8),  # 64 MiB of the largest allowed
    (2**20, 64),
    (64 * 2**20, 4),  # never below 4
    (1024, 10_000),  # never above ZMQ's old default here
])
def test_live_queue_depth_in_bytes(max_bytes, depth):
    assert ks.live_queue_depth(max_bytes) == depth
    assert ks.live_queue_depth(max_bytes) * max_bytes <= max(ks.LIVE_QUEUE_BYTES, 4 * max_bytes)


@pytest.mark.parametrize("failures, delay", [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0), (0, 0.5)])
def test_restart_delay(failures, delay):
    assert ks.restart_delay(failures) == delay


def test_safe_decode_turns_any_decoder_error_into_malformed():
    nested = b"\x93" + msgspec.msgpack.encode(1.0) + b"\x91" * 1000 + b"\xc0\x00"  # 1 KB
    # too_deep, or malformed where the process raised its recursion limit (msgspec follows it)
    assert ks.safe_decode([b"", (1).to_bytes(8, "big"), nested], max_bytes=ke.MAX_MESSAGE_BYTES) in (
        "too_deep", "malformed")
    good = msgspec.msgpack.encode([1.0, [], 0])
    assert isinstance(ks.safe_decode([b"", (1).to_bytes(8, "big"), good], max_bytes=1024), ke.Message)


class Counting(ks.Counters):
    def __init__(self):
        self.resets = []

    def reset(self, url, reason):
        self.resets.append(reason)


async def test_a_failed_subscriber_is_restarted_unsynced_with_its_index_cleared(monkeypatch):
    monkeypatch.setattr(ks, "RESTART_BASE_S", 0.01)
    state = ks.EndpointState(ks.EventSource("http://e", "tcp://127.0.0.1:1"), ke.BlockIndex())
    state.synced = True
    state.index.hashes.update({1, 2, 3})
    counters = Counting()
    ctx = zmq.asyncio.Context()
    sub = ks.Subscriber(state, counters, ctx)
    calls = []

    async def initial_replay():
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("a bug, or a socket error")
        await asyncio.sleep(3600)

    sub._initial_replay = initial_replay
    task = asyncio.create_task(sub.run_forever())
    try:
        for _ in range(200):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(calls) == 2 and sub.restarts == 1
        assert not state.synced and len(state.index) == 0  # unsynced until a replay or a batch
        assert counters.resets == ["subscriber_restart"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.term()
