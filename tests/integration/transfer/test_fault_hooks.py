"""The stuck-READ fault hook (PDFLEET_TEST_STUCK_READS, used by the fault suite against a live fleet)
over real NIXL/UCX on DRAM with the source in its own process: while its file exists a pull's READ
hangs and the sink's own read bound cancels it, fails the pull and releases the lease; once the file
is gone pulls complete with the source's bytes again."""

from __future__ import annotations

import time

import numpy as np
from transfer_harness import LocalKV, wait_for

from pdfleet.connector.testhooks import sink_nixl_agent
from pdfleet.contract.env import TEST_STUCK_READS

HOST = "127.0.0.1"
SECRET = b"fleet-secret-of-the-fault-hooks"


def test_a_stuck_read_fails_within_its_bound_releases_its_lease_and_later_pulls_succeed(
        source_factory, sink_factory, monkeypatch, tmp_path):
    flag = tmp_path / "stuck"
    monkeypatch.setenv(TEST_STUCK_READS, str(flag))  # read by sink_nixl_agent(), as the adapter's worker does
    src = source_factory(secret=SECRET.hex(), lease=1.0, num_blocks=16, block_len=64 * 1024)
    local = LocalKV(num_blocks=16, block_len=64 * 1024)
    sink = sink_factory(local, secret=SECRET, read_timeout_floor=1.0, read_floor_bandwidth=50e6,
                        nixl_agent=sink_nixl_agent())

    def pull(rid: str, blocks: list[int]) -> tuple[bool, str, float]:
        src.hold(rid, blocks)
        t0 = time.monotonic()
        sink.pull(rid, host=HOST, port=src.base_port, remote_engine_id="prefill-0",
                  remote_instance_id=src.instance_id, remote_block_ids=blocks, local_block_ids=blocks)
        ok, reason = wait_for(sink, rid, timeout=30)
        return ok, reason, time.monotonic() - t0

    assert pull("before", [1, 2])[:2] == (True, "")
    flag.touch()
    ok, reason, took = pull("stuck", [3, 4, 5])
    bound = 1.0 + 3 * 2 * 64 * 1024 / 50e6  # floor + its bytes (3 blocks x 2 regions) at the floor bandwidth
    print(f"stuck READ failed after {took:.2f}s (bound {bound:.2f}s, lease 1s): {reason}")
    assert not ok and "did not complete within" in reason
    assert bound <= took < bound + 1.0  # heartbeats kept the 1 s lease alive past it; the bound ended it
    assert sink.stats()["reads_timed_out"] == 1
    deadline = time.monotonic() + 5
    while src.stats()["leases_released"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert src.stats()["leases_released"] == 1  # the sink's release notice, not an expiry
    flag.unlink()
    assert pull("after", [6, 7])[:2] == (True, "")
    for region in range(2):
        for block in (1, 2, 6, 7):
            assert np.array_equal(local.block(region, block), src.expected(region, block))
