"""KV event subscriber bounds and restarts (issue 20 row 4)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq.asyncio

from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.kvaware import kv_subscriber as ks
from pdfleet.contract.kv_tiers import MEDIUMS


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


MiB = 2**20


@pytest.mark.parametrize("publishers, total, budget", [
    (1, 512 * MiB, ks.Budget(6, 8 * MiB, 588_674)),  # one engine: its full per-socket queue; 3 tiers of 152 B blocks
    (2, 512 * MiB, ks.Budget(6, 8 * MiB, 294_337)),
    (8, 512 * MiB, ks.Budget(4, 16 * MiB // 5 - 64 * 1024, 73_584)),  # the cap shrinks before the depth
    (64, 512 * MiB, ks.Budget(4, 2 * MiB // 5 - 64 * 1024, 9_198)),
    (1000, 512 * MiB, ks.Budget(1, ks.MIN_MESSAGE_BYTES, 588)),  # past what the bound can hold: the smallest
    (0, 16 * MiB, ks.Budget(4, 4 * MiB // 5 - 64 * 1024, 18_396)),
])
def test_plan_budget(publishers, total, budget):
    assert ks.plan_budget(publishers, total_bytes=total, max_bytes=8 * MiB, index_max_blocks=1_000_000) == budget


@pytest.mark.parametrize("total", [16 * MiB, 64 * MiB, 512 * MiB, 4096 * MiB])
def test_every_publisher_together_stays_within_the_total(total):
    limit = total // 2 // (2 * 2 * (ks.MIN_MESSAGE_BYTES + 64 * 1024))  # publishers the bound can hold
    for n in [*range(1, min(limit, 130)), limit]:
        b = ks.plan_budget(n, total_bytes=total, max_bytes=8 * MiB, index_max_blocks=1_000_000)
        assert n * b.queue_bytes <= total // 2, (n, b)
        assert n * len(MEDIUMS) * b.index_blocks * ks.INDEX_BYTES_PER_BLOCK <= total // 2, (n, b)  # every tier
        assert b.depth >= 1 and ks.MIN_MESSAGE_BYTES <= b.max_bytes <= 8 * MiB
    # negative control: bounds per publisher only (as before) overrun the total with a few publishers
    old_queue = 2 * ks.live_queue_depth(8 * MiB) * 8 * MiB
    assert 8 * old_queue > total // 2 or total > 1024 * MiB


# ---- issue 31: decoded size counted, one decode per batch ------------------------------------------

def _batch(events: int, hashes: int, base: int = 1000) -> list[bytes]:
    evs = [{"type": "BlockStored", "block_hashes": list(range(base + i * hashes, base + (i + 1) * hashes)),
            "medium": "GPU"}
           for i in range(events)]
    return [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, evs, 0])]


@pytest.mark.parametrize("events,hashes,max_decoded,expected", [
    (4, 1000, None, "ok"),  # no decoded bound: as before
    (4, 1000, 4 * (ke.DECODED_EVENT_BYTES + ke.DECODED_PER_HASH * 1000), "ok"),
    (4, 1000, 4 * (ke.DECODED_EVENT_BYTES + ke.DECODED_PER_HASH * 1000) - 1, "oversized"),  # the 4th tips it
    (1, 60_000, 1_000_000, "oversized"),  # small ints: ~180 KB on the wire, ~2.6 MB decoded
])
def test_the_decoded_size_of_a_batch_is_bounded(events, hashes, max_decoded, expected) -> None:
    msg = ke.decode_message(_batch(events, hashes), max_bytes=ke.MAX_MESSAGE_BYTES, max_decoded_bytes=max_decoded)
    assert (msg if isinstance(msg, str) else "ok") == expected


@pytest.mark.parametrize("base", [1000, 2**63])  # small ints (3 bytes on the wire) and 64-bit ones (9)
def test_the_decoded_estimate_bounds_what_python_holds(base) -> None:
    """The estimate is an upper bound of the decoded batch's real size (measured with tracemalloc)."""
    import tracemalloc

    frames = _batch(3, 20_000, base)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    msg = ke.decode_message(frames, max_bytes=ke.MAX_MESSAGE_BYTES)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert isinstance(msg, ke.Message)
    estimate = 3 * (ke.DECODED_EVENT_BYTES + ke.DECODED_PER_HASH * 20_000)
    assert held <= estimate, (held, estimate)
    assert held > estimate / 3, (held, estimate)  # and not wildly above it (the budget stays useful)


async def test_a_live_batch_is_decoded_once(monkeypatch) -> None:
    calls = []
    real = ke.decode_message

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(ke, "decode_message", counting)
    state = ks.EndpointState(ks.EventSource("http://e", "tcp://127.0.0.1:1"), ke.BlockIndex())
    sub = ks.Subscriber(state, ks.Counters())
    await sub._handle(_batch(1, 10))
    assert len(calls) == 1 and len(state.index) == 10


def test_the_decoded_allowance_is_the_queue_budget_less_the_two_messages_being_read() -> None:
    b = ks.plan_budget(3, total_bytes=64 * MiB, max_bytes=ke.MAX_MESSAGE_BYTES, index_max_blocks=10**6)
    assert ks.decoded_allowance(b.max_bytes, b.depth) + 2 * (b.max_bytes + 64 * 1024) == b.queue_bytes
