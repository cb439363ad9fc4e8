"""PdfleetConnector inside real vLLM 0.32 schedulers: prefill holds, decode pulls over real NIXL."""

from __future__ import annotations

import time

import pytest
import torch
from adapter_harness import BLOCK, Side, free_port, prefill_request, request, run_until, signed

from vllm.v1.request import RequestStatus

from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS


@pytest.fixture()
def pair(tiny_model, monkeypatch):
    port = free_port()
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(port))
    prefill = Side(tiny_model, "kv_producer", extra={"lease_seconds": 20})
    decode = Side(tiny_model, "kv_consumer", extra={"handshake_timeout": 1.0, "handshake_retries": 1})
    yield prefill, decode
    decode.close()
    prefill.close()


def test_basic_pd_flow(pair):
    prefill, decode = pair
    n = 3 * BLOCK + 5
    pid, params, p_blocks = prefill_request(prefill, n, seed=3)
    assert params["do_remote_prefill"] is True and params["remote_request_id"] == pid
    assert params["remote_block_ids"] == [p_blocks[: len(params["remote_block_ids"][0])]]
    assert params["remote_instance_id"] == prefill.worker._worker.instance_id
    # params 1.4: the scheduler's fresh lease id, and the worker holds the lease under that same id
    assert params["pdfleet_params_version"] == "1.4" and len(params["remote_lease_id"]) == 32
    assert prefill.worker._worker.source._leases._leases[pid].lease_id == bytes.fromhex(params["remote_lease_id"])
    free_before = prefill.free_blocks()

    dreq = request(n, dict(params), max_tokens=3, seed=3)
    decode.add(dreq)
    decode.step(write_kv=False)
    assert dreq.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    run_until(decode, lambda: dreq.request_id not in decode.scheduler.finished_recving_kv_req_ids
              and dreq.status == RequestStatus.RUNNING, write_kv=False)
    # Full blocks were pulled; the partial tail and the last token are computed locally.
    d_blocks = decode.block_ids(dreq.request_id)
    for i in range(n // BLOCK):
        for name in prefill.kv:
            assert torch.equal(decode.kv[name][d_blocks[i]], prefill.kv[name][p_blocks[i]]), (name, i)
    assert not torch.equal(decode.kv[next(iter(decode.kv))][d_blocks[n // BLOCK]],
                           prefill.kv[next(iter(prefill.kv))][p_blocks[n // BLOCK]])
    assert dreq.num_computed_tokens >= (n // BLOCK) * BLOCK
    # Prefill frees the blocks once decode's completion notification arrives.
    run_until(prefill, lambda: pid not in prefill.scheduler.requests)
    assert prefill.free_blocks() > free_before
    stats = decode.worker.get_kv_connector_stats()
    assert stats is not None and stats.data["transfers"] == 1 and stats.data["bytes"] > 0
    # every message decode sent named the lease id: none refused, the lease ended by its completion
    prefill_stats = prefill.worker._worker.cumulative_stats()
    assert prefill_stats["lease_proof_refused"] == 0 and prefill_stats["leases_completed"] == 1


def test_prompt_shorter_than_a_block_pulls_nothing(pair):
    prefill, decode = pair
    pid, params, _ = prefill_request(prefill, BLOCK - 3, seed=5)
    dreq = request(BLOCK - 3, dict(params), max_tokens=2, seed=5)
    decode.add(dreq)
    decode.step()
    assert dreq.status == RequestStatus.RUNNING  # computed locally at once, no transfer wait
    assert dreq.num_computed_tokens == BLOCK - 3 or decode.outputs.get(dreq.request_id) is not None
    assert decode.worker._worker.cumulative_stats().get("transfers", 0) == 0
    # Nothing to pull: decode's release notice frees prefill's blocks now, not at lease expiry (20 s).
    started = time.monotonic()
    run_until(prefill, lambda: pid not in prefill.scheduler.requests)
    assert time.monotonic() - started < 1.0
    assert prefill.worker._worker.cumulative_stats()["leases_released"] == 1


def test_abort_before_transfer_frees_everything(pair):
    prefill, decode = pair
    pid, params, _ = prefill_request(prefill, 2 * BLOCK + 1, seed=7)
    prefill_free = prefill.free_blocks()
    dreq = request(2 * BLOCK + 1, dict(params), seed=7)
    decode.add(dreq)
    free = decode.free_blocks()
    decode.scheduler.finish_requests(dreq.request_id, RequestStatus.FINISHED_ABORTED)
    started = time.monotonic()
    for _ in range(5):
        decode.step()
    assert dreq.request_id not in decode.scheduler.requests
    assert decode.free_blocks() == free
    assert decode.worker._worker.cumulative_stats().get("transfers", 0) == 0
    # The abort notice reaches prefill, which frees the request's blocks within a second
    # (its lease is 20 s): an abort storm cannot pin prefill memory.
    run_until(prefill, lambda: pid not in prefill.scheduler.requests)
    assert time.monotonic() - started < 1.0
    assert prefill.free_blocks() > prefill_free
    assert prefill.worker._worker.cumulative_stats()["leases_released"] == 1
    assert decode.worker._worker.cumulative_stats()["releases"] == 1


def test_abort_during_transfer_waits_for_the_read(pair):
    prefill, decode = pair
    _, params, _ = prefill_request(prefill, 2 * BLOCK, seed=8)
    dreq = request(2 * BLOCK, dict(params), seed=8)
    decode.add(dreq)
    decode.step(write_kv=False)
    assert dreq.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    free = decode.free_blocks()
    decode.scheduler.finish_requests(dreq.request_id, RequestStatus.FINISHED_ABORTED)
    # Blocks stay allocated while NIXL may still write them; freed once the pull reports.
    assert decode.free_blocks() == free
    run_until(decode, lambda: dreq.request_id not in decode.scheduler.requests, write_kv=False)
    assert decode.free_blocks() > free


def test_unreachable_prefill_is_finished_with_load_errors_and_recomputed(pair):
    prefill, decode = pair
    _, params, _ = prefill_request(prefill, 2 * BLOCK + 4, seed=9)
    bad = signed(dict(params, remote_port=free_port(), remote_instance_id=None))
    dreq = request(2 * BLOCK + 4, bad, max_tokens=2, seed=9)
    decode.add(dreq)
    decode.step(write_kv=False)
    assert dreq.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    seen_errors: set[int] = set()
    orig = decode.worker.get_block_ids_with_load_errors

    def spy() -> set[int]:
        got = orig()
        seen_errors.update(got)
        return got

    decode.worker.get_block_ids_with_load_errors = spy
    run_until(decode, lambda: decode.outputs.get(dreq.request_id) is not None
              and decode.outputs[dreq.request_id].finish_reason is not None, steps=2000)
    assert seen_errors, "the failed pull's blocks must be reported as load errors"
    out = decode.outputs[dreq.request_id]
    assert str(out.finish_reason) == "length"  # recomputed locally, not failed
    stats = decode.worker._worker.cumulative_stats()
    assert stats["failures"] >= 1 and stats["handshake_failures"] >= 1


def test_load_failure_policy_fail_reports_an_error(tiny_model, monkeypatch):
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    decode = Side(tiny_model, "kv_consumer", policy="fail", extra={"handshake_timeout": 0.5, "handshake_retries": 1})
    try:
        params = signed({"do_remote_prefill": True, "remote_engine_id": "gone", "remote_request_id": "x",
                         "remote_host": "127.0.0.1", "remote_port": free_port(), "remote_block_ids": [[0, 1]],
                         "tp_size": 1})
        dreq = request(2 * BLOCK + 1, params, seed=10)
        decode.add(dreq)
        run_until(decode, lambda: dreq.request_id in decode.outputs, steps=2000, write_kv=False)
        assert str(decode.outputs[dreq.request_id].finish_reason) == "error"
    finally:
        decode.close()


def test_concurrent_loads(pair):
    prefill, decode = pair
    sizes = [BLOCK, 2 * BLOCK + 3, 4 * BLOCK, 3 * BLOCK + 31]
    produced = [prefill_request(prefill, n, seed=20 + i) for i, n in enumerate(sizes)]
    dreqs = [request(n, dict(p), seed=20 + i) for i, (n, (_, p, _)) in enumerate(zip(sizes, produced))]
    for r in dreqs:
        decode.add(r)
    decode.step(write_kv=False)
    assert all(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS for r in dreqs)
    run_until(decode, lambda: all(r.status == RequestStatus.RUNNING for r in dreqs), write_kv=False)
    for r, n, (_, _, p_blocks) in zip(dreqs, sizes, produced):
        d_blocks = decode.block_ids(r.request_id)
        for i in range(n // BLOCK):
            for name in prefill.kv:
                assert torch.equal(decode.kv[name][d_blocks[i]], prefill.kv[name][p_blocks[i]])
    assert decode.worker._worker.cumulative_stats()["transfers"] == len(sizes)


def test_corrupt_hook_changes_pulled_blocks(tiny_model, monkeypatch):
    """The test-only fault hook really corrupts pulled KV (it backs the e2e negative control)."""
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    prefill = Side(tiny_model, "kv_producer")
    monkeypatch.setenv(TEST_CORRUPT_PULLED_BLOCKS, "1")
    decode = Side(tiny_model, "kv_consumer")
    try:
        _, params, p_blocks = prefill_request(prefill, 2 * BLOCK, seed=11)
        dreq = request(2 * BLOCK, dict(params), seed=11)
        decode.add(dreq)
        decode.step(write_kv=False)
        run_until(decode, lambda: dreq.status == RequestStatus.RUNNING, write_kv=False)
        d_blocks = decode.block_ids(dreq.request_id)
        name = next(iter(prefill.kv))
        assert not torch.equal(decode.kv[name][d_blocks[0]], prefill.kv[name][p_blocks[0]])
        assert decode.worker._worker.cumulative_stats()["blocks_corrupted_for_test"] == 2
    finally:
        decode.close()
        prefill.close()


@pytest.mark.parametrize("keep_alive", [True, False])
def test_queued_request_keeps_the_prefill_lease_alive(tiny_model, monkeypatch, keep_alive):
    """A decode request queued longer than the lease still pulls, because decode heartbeats it.

    Without the heartbeats (negative control) the lease expires and the pull fails.
    """
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    prefill = Side(tiny_model, "kv_producer", extra={"lease_seconds": 1.5})
    decode = Side(tiny_model, "kv_consumer")
    try:
        _, params, _ = prefill_request(prefill, 2 * BLOCK, seed=12)
        dreq = request(2 * BLOCK, dict(params), seed=12)
        if keep_alive:
            decode.connector.on_new_request(dreq)
        deadline = time.monotonic() + 4.0  # queued for over twice the lease
        while time.monotonic() < deadline:
            meta = decode.connector.build_connector_meta(None)
            decode.worker.bind_connector_metadata(meta)
            decode.worker.start_load_kv(None)
            decode.worker.clear_connector_metadata()
            prefill.step()  # prefill frees whatever expired
            time.sleep(0.05)
        decode.scheduler.add_request(dreq)
        decode.step(write_kv=False)
        run_until(decode, lambda: dreq.status == RequestStatus.RUNNING, write_kv=False)
        stats = decode.worker._worker.cumulative_stats()
        if keep_alive:
            assert stats.get("transfers", 0) == 1 and stats.get("failures", 0) == 0
        else:
            # refused up front (expired remote_lease_expiry) or failed by the pull: never read
            assert stats.get("transfers", 0) == 0
            assert stats.get("failures", 0) + stats.get("params_rejected", 0) == 1
    finally:
        decode.close()
        prefill.close()
