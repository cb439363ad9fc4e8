"""Pulling KV blocks from a prefill process: exact bytes, coalescing, notification-driven free,
heterogeneous TP slices, invalid requests. Real processes, NIXL over UCX on DRAM, real ZMQ."""

from __future__ import annotations

import time

import numpy as np
from transfer_harness import LocalKV, wait_for

HOST = "127.0.0.1"


def pull(sink, src, rid, remote, local, **kw):
    opts = dict(host=HOST, port=src.base_port, remote_engine_id="prefill-0", remote_instance_id=src.instance_id,
                remote_block_ids=remote, local_block_ids=local)
    opts.update(kw)
    sink.pull(rid, **opts)


def matches(local: LocalKV, src, remote, locals_, seed=None) -> bool:
    return all(
        np.array_equal(local.block(r, lb), src.expected(r, rb, seed))
        for r in range(len(local.regions))
        for lb, rb in zip(locals_, remote)
    )


def test_pulled_bytes_equal_source_and_runs_coalesce(source_factory, sink_factory, local_kv):
    src = source_factory(lease=30.0, seed=11)
    sink = sink_factory(local_kv)
    remote = [3, 4, 5, 6, 20, 40, 41]  # runs: 3-6, 20, 40-41
    local = [0, 1, 2, 3, 10, 30, 31]  # the same runs locally
    src.hold("r1", remote)
    pull(sink, src, "r1", remote, local)
    assert wait_for(sink, "r1") == (True, "")

    assert matches(local_kv, src, remote, local)
    # negative control: the same comparison against another source pattern fails
    assert not matches(local_kv, src, remote, local, seed=12)
    # blocks outside the request were not written
    assert not local_kv.block(0, 4).any() and not local_kv.block(1, 63).any()

    stats = sink.stats()
    assert stats["descriptors"] == 2 * 3  # 2 regions x 3 runs, not 2 x 7 blocks
    assert stats["bytes"] == 2 * 7 * 4096
    assert stats["handshakes"] == 1 and stats["failures"] == 0

    # scattered blocks cannot be merged: one descriptor per block per region
    src.hold("r2", [50, 52, 54])
    pull(sink, src, "r2", [50, 52, 54], [40, 41, 42])
    assert wait_for(sink, "r2") == (True, "")
    assert sink.stats()["descriptors"] == 6 + 2 * 3
    assert sink.stats()["handshakes"] == 1  # cached agent reused
    assert matches(local_kv, src, [50, 52, 54], [40, 41, 42])


def test_completion_notification_frees_blocks_before_lease(source_factory, sink_factory, local_kv):
    src = source_factory(lease=60.0)
    sink = sink_factory(local_kv)
    src.hold("n1", [1, 2])
    assert src.released() == []  # held: not freed before the read
    pull(sink, src, "n1", [1, 2], [5, 6])
    assert wait_for(sink, "n1")[0]
    deadline = time.monotonic() + 5
    released: list[str] = []
    while time.monotonic() < deadline and not released:
        released = src.released()
        time.sleep(0.01)
    assert released == ["n1"]
    stats = src.stats()
    assert stats["leases_completed"] == 1 and stats["leases_expired"] == 0 and stats["leases_active"] == 0


def test_heterogeneous_tp_reads_head_slices(source_factory, sink_factory):
    # prefill TP1 with 4 KV heads (block 8 KiB, HND); decode TP2 with 2 heads per rank (4 KiB).
    src = source_factory(lease=60.0, block_len=8192, layout={"num_kv_heads": 4}, seed=5)
    ranks = []
    for rank in (0, 1):
        kv = LocalKV(block_len=4096)
        sink = sink_factory(kv, engine_id="decode-tp2", layout={"num_kv_heads": 2, "tp_rank": rank, "tp_size": 2})
        ranks.append((kv, sink))
    remote, local = [7, 8, 9], [0, 1, 2]
    src.hold("h1", remote)
    for rank, (_kv, sink) in enumerate(ranks):
        # prefill tp_size 1: both decode ranks dial base_port + 0
        pull(sink, src, "h1", remote, local, remote_tp_size=1)
        assert wait_for(sink, "h1") == (True, "")
        if rank == 0:
            time.sleep(0.2)
            assert src.released() == []  # one reader of two has finished: still held
    for rank, (kv, _) in enumerate(ranks):
        for r in range(2):
            for lb, rb in zip(local, remote):
                whole = src.expected(r, rb)
                assert np.array_equal(kv.block(r, lb), whole[rank * 4096 : (rank + 1) * 4096])
                other = whole[(1 - rank) * 4096 : (2 - rank) * 4096]
                assert not np.array_equal(kv.block(r, lb), other)  # negative control
    deadline = time.monotonic() + 5
    released: list[str] = []
    while time.monotonic() < deadline and not released:
        released = src.released()
        time.sleep(0.01)
    assert released == ["h1"]
    assert ranks[0][1].stats()["descriptors"] == 2 * 3  # slices are strided: one per block


def test_invalid_block_ids_fail_cleanly(source_factory, sink_factory, local_kv):
    src = source_factory(lease=30.0, num_blocks=64)
    sink = sink_factory(local_kv)
    src.hold("ok0", [1])
    pull(sink, src, "ok0", [1], [1])
    assert wait_for(sink, "ok0")[0]
    cases = {
        "neg": dict(remote_block_ids=[-1], local_block_ids=[0]),
        "local-range": dict(remote_block_ids=[1], local_block_ids=[64]),
        "remote-range": dict(remote_block_ids=[64], local_block_ids=[0]),
        "lengths": dict(remote_block_ids=[1, 2], local_block_ids=[0]),
        "types": dict(remote_block_ids=["1"], local_block_ids=[0]),
        "not-a-list": dict(remote_block_ids=None, local_block_ids=[0]),
        "port": dict(port="5600"),
        "empty": dict(remote_block_ids=[], local_block_ids=[]),
    }
    expected = {
        "neg": "remote_block_ids[0] = -1",
        "local-range": "local_block_ids[0] = 64: out of range",
        "remote-range": "remote_block_ids[0] = 64: out of range",
        "lengths": "lengths must match",
        "types": "remote_block_ids[0] must be an int, got str",
        "not-a-list": "remote_block_ids must be a list of ints",
        "port": "port must be an int",
        "empty": "empty",
    }
    for rid, kw in cases.items():
        src.hold(rid, [1])
        pull(sink, src, rid, [1], [0], **kw)
    failures: dict[str, str] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(failures) < len(cases):
        done, failed = sink.poll()
        assert not done
        failures.update(failed)
    assert set(failures) == set(cases)
    for rid, text in expected.items():
        assert text in failures[rid], (rid, failures[rid])
    sink.pull(123, host=HOST, port=src.base_port, remote_engine_id="prefill-0", remote_instance_id=None,
              remote_block_ids=[1], local_block_ids=[0])
    assert "request_id must be a non-empty string" in sink.poll()[1]["123"]
    assert not local_kv.block(0, 0).any()  # nothing was written by the failed requests
    # the sink still works
    src.hold("ok1", [2])
    pull(sink, src, "ok1", [2], [3])
    assert wait_for(sink, "ok1") == (True, "")
    assert sink.stats()["failures"] == len(cases) + 1


def test_advertised_lease_expiry_lets_the_read_start_before_the_ack(source_factory, sink_factory, local_kv):
    src = source_factory(lease=30.0)
    sink = sink_factory(local_kv)
    src.hold("w", [1])
    pull(sink, src, "w", [1], [1])
    assert wait_for(sink, "w")[0]  # handshake done, clock offset measured
    posted = sink.stats()["descriptors"]

    expiry = src.hold("fast", [2, 3])
    pull(sink, src, "fast", [2, 3], [2, 3], remote_lease_expiry=expiry)
    assert sink.stats()["descriptors"] == posted + 2  # posted inside pull(), no ack yet
    assert wait_for(sink, "fast") == (True, "")
    assert matches(local_kv, src, [2, 3], [2, 3])

    # control: without an expiry (or with one already past) the READ waits for the ack
    src.hold("slow", [4])
    pull(sink, src, "slow", [4], [4])
    assert sink.stats()["descriptors"] == posted + 2
    assert wait_for(sink, "slow") == (True, "")
    src.hold("past", [5])
    pull(sink, src, "past", [5], [5], remote_lease_expiry=time.time() - 1)
    assert sink.stats()["descriptors"] == posted + 4  # "slow" posted 2 after its ack; "past" waits
    assert wait_for(sink, "past") == (True, "")  # the ack still says held: fine

    pull(sink, src, "bad", [6], [6], remote_lease_expiry="soon")
    ok, reason = wait_for(sink, "bad")
    assert not ok and "remote_lease_expiry must be a unix time" in reason


def test_a_1_3_lease_bound_starts_the_read_but_only_an_ack_completes_it(source_factory, sink_factory, local_kv):
    """params 1.3: ``remote_lease_deadline`` is an upper bound of the lease (decode's monotonic time of
    acceptance + remote_lease_seconds). With time left it lets the READ start at once, as an advertised
    expiry did; within the safety margin it does not. Either way the pull completes only after an ack."""
    src = source_factory(lease=30.0)
    sink = sink_factory(local_kv)
    src.hold("w", [1])
    pull(sink, src, "w", [1], [1])
    assert wait_for(sink, "w")[0]  # handshake done: the next pull attaches inside pull()
    posted = sink.stats()["descriptors"]

    src.hold("bounded", [2, 3])
    pull(sink, src, "bounded", [2, 3], [2, 3], remote_lease_deadline=time.monotonic() + 30)
    per_run = sink.stats()["descriptors"] - posted  # posted at once, before any ack
    assert per_run > 0
    assert wait_for(sink, "bounded") == (True, "")
    assert matches(local_kv, src, [2, 3], [2, 3])
    # control: a bound within the safety margin does not start the READ; the ack does
    src.hold("near", [4])
    pull(sink, src, "near", [4], [4], remote_lease_deadline=time.monotonic() + 0.1)
    assert sink.stats()["descriptors"] == posted + per_run
    assert wait_for(sink, "near") == (True, "")
    assert sink.stats()["descriptors"] == posted + 2 * per_run  # one run of blocks each
    # the bound never completes a pull: blocks the source holds no lease on are read, yet the pull fails
    pull(sink, src, "gone", [5], [5], remote_lease_deadline=time.monotonic() + 30)
    ok, reason = wait_for(sink, "gone")
    assert not ok, reason

    pull(sink, src, "bad", [6], [6], remote_lease_deadline=float("nan"))
    ok, reason = wait_for(sink, "bad")
    assert not ok and "remote_lease_deadline must be a monotonic time" in reason
