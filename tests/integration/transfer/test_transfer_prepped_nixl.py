"""Prepared descriptor lists against real NIXL/UCX on DRAM: the indices of
``prepped.pull_indices`` read the right bytes, and NIXL posts as many descriptors as
``PullIndices.descriptors`` says (its own telemetry; merging switched off as the control)."""

from __future__ import annotations

import numpy as np
import pytest

from pdfleet.connector.transfer.layout import Region, SlicePlan
from pdfleet.connector.transfer.nixl_agent import _nixl_api
from pdfleet.connector.transfer.prepped import local_rows, pull_indices, read_groups, remote_rows

NB = 32


@pytest.fixture(scope="module")
def agents():
    api = _nixl_api()
    conf = dict(enable_prog_thread=False, backends=["UCX"], capture_telemetry=True)
    reader = api.nixl_agent("prepped-reader", api.nixl_agent_config(**conf))
    source = api.nixl_agent("prepped-source", api.nixl_agent_config(**conf))
    src = np.random.default_rng(5).integers(0, 256, 4 << 20, dtype=np.uint8)
    dst = np.zeros(4 << 20, dtype=np.uint8)
    reader.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    source.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    peer = reader.add_remote_agent(source.get_agent_metadata())
    yield reader, source, peer, dst, src
    reader.remove_remote_agent(peer)


def _regions(base: int, count: int, block_len: int, stride: int = 0, nb: int = NB) -> list[Region]:
    stride = stride or block_len
    span = (nb - 1) * stride + block_len
    return [Region(base=base + i * span, num_blocks=nb, block_stride=stride, block_len=block_len) for i in range(count)]


CASES = {
    # name: (local (count, block_len, stride), remote (count, block_len, stride), plan offsets, lids, rids)
    "block-outermost runs": ((1, 16384, 0), (1, 16384, 0), None, [0, 1, 2, 3, 10, 11], [8, 9, 10, 11, 2, 3]),
    "block-outermost scattered": ((1, 16384, 0), (1, 16384, 0), None, [0, 1, 2, 3], [7, 3, 20, 4]),
    "per layer runs": ((8, 2048, 0), (8, 2048, 0), None, [0, 1, 2, 3, 9, 10], [4, 5, 6, 7, 30, 31]),
    "padded blocks": ((2, 2048, 4096), (2, 2048, 4096), None, [0, 1, 2], [5, 6, 7]),
    "head slice 2/2": ((2, 2048, 0), (2, 4096, 0), (2048, 2048), [0, 1, 2], [3, 4, 5]),
}


@pytest.mark.parametrize("case", CASES)
def test_prepped_read_moves_the_right_bytes_in_the_predicted_descriptors(agents, case):
    reader, source, peer, dst, src = agents
    (lc, llen, lstride), (rc, rlen, rstride), offsets, lids, rids = CASES[case]
    dst[:] = 0
    local = _regions(dst.ctypes.data, lc, llen, lstride)
    remote = _regions(src.ctypes.data, rc, rlen, rstride)
    plan = SlicePlan(tuple(offsets or (0,) * rc), tuple(r.block_len for r in local), 2 if offsets else 1,
                     1 if offsets else 0)
    lrows, rrows = local_rows(local), remote_rows(remote, plan)
    lp = reader.prep_xfer_dlist("NIXL_INIT_AGENT", lrows.rows["DRAM"], "DRAM")
    rp = reader.prep_xfer_dlist(peer, rrows.rows["DRAM"], "DRAM")
    try:
        (read,) = pull_indices(read_groups(lrows, rrows), lids, rids)
        counts = {}
        for merge in (True, False):  # merging off: one descriptor per index (the control)
            handle = reader.make_prepped_xfer("READ", lp, read.local, rp, read.remote, b"", skip_desc_merge=not merge)
            state = reader.transfer(handle)
            while state == "PROC":  # both agents progress (UCX wireup needs the source too)
                source.get_new_notifs()
                state = reader.check_xfer_state(handle)
            assert state == "DONE"
            tel = reader.get_xfer_telemetry(handle)
            counts[merge] = tel.descCount
            assert tel.totalBytes == read.nbytes
            reader.release_xfer_handle(handle)
        assert counts[True] == read.descriptors
        assert counts[False] == len(read.local)
        for lr, rr, off in zip(local, remote, plan.offsets):
            for lb, rb in zip(lids, rids):
                lo = lr.base - dst.ctypes.data + lb * lr.block_stride
                ro = rr.base - src.ctypes.data + rb * rr.block_stride + off
                assert np.array_equal(dst[lo:lo + lr.block_len], src[ro:ro + lr.block_len])
        assert int(dst.astype(bool).sum()) <= read.nbytes  # nothing else written (zeros may match)
    finally:
        lp.release()
        rp.release()


@pytest.mark.parametrize("prepped", [True, False], ids=["prepped", "per-request-lists"])
def test_sink_pulls_the_same_bytes_and_descriptors_either_way(source_factory, sink_factory, prepped):
    """KVSink posts from lists prepared at handshake by default, from per-request lists when told
    not to; both read byte for byte what build_descriptors plans (runs coalesced)."""
    from transfer_harness import LocalKV, wait_for

    src = source_factory(lease=30.0, seed=4, regions=3)
    local = LocalKV(regions=3)
    sink = sink_factory(local, prepped_descriptors=prepped)
    remote, locals_ = [7, 8, 9, 40, 41, 3], [0, 1, 2, 10, 11, 20]  # runs: 3 + 2 + 1
    for rid in ("a", "b"):  # the second pull reuses the peer's prepared lists
        for r in range(3):
            local.buffers[r][:] = 0
        src.hold(rid, remote)
        sink.pull(rid, host="127.0.0.1", port=src.base_port, remote_engine_id="prefill-0",
                  remote_instance_id=src.instance_id, remote_block_ids=remote, local_block_ids=locals_)
        assert wait_for(sink, rid) == (True, "")
        for r in range(3):
            for lb, rb in zip(locals_, remote):
                assert np.array_equal(local.block(r, lb), src.expected(r, rb))
            assert not local.block(r, 5).any()  # nothing else written
    stats = sink.stats()
    assert stats["descriptors"] == 2 * 3 * 3  # 3 regions x 3 runs, twice
    assert stats["prepped_transfers"] == (2 if prepped else 0)
    assert stats["bytes"] == 2 * 3 * 6 * 4096
