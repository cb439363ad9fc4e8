"""PdfleetConnector inside real vLLM 0.32 schedulers: prefill holds, decode pulls over real NIXL."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import BLOCK, Side, free_port, request, run_until

from vllm.v1.request import RequestStatus


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


def prefill_request(prefill: Side, n_tokens: int, seed: int = 0) -> tuple[str, dict, list[int]]:
    """Run a do_remote_decode request on prefill; return its id, returned params and its blocks."""
    req = request(n_tokens, {"do_remote_decode": True}, max_tokens=1, seed=seed)
    prefill.add(req)
    blocks: list[int] = []

    def finished() -> bool:
        nonlocal blocks
        if req.request_id in prefill.scheduler.requests and not blocks:
            blocks = prefill.block_ids(req.request_id)
        out = prefill.outputs.get(req.request_id)
        return out is not None and out.finish_reason is not None

    run_until(prefill, finished)
    params = prefill.outputs[req.request_id].kv_transfer_params
    assert params is not None
    prefill.step()  # delivers the hold to the worker
    return req.request_id, params, blocks


def test_basic_pd_flow(pair):
    prefill, decode = pair
    n = 3 * BLOCK + 5
    pid, params, p_blocks = prefill_request(prefill, n, seed=3)
    assert params["do_remote_prefill"] is True and params["remote_request_id"] == pid
    assert params["remote_block_ids"] == [p_blocks[: len(params["remote_block_ids"][0])]]
    assert params["remote_instance_id"] == prefill.worker._worker.instance_id
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


def test_prompt_shorter_than_a_block_pulls_nothing(pair):
    prefill, decode = pair
    _, params, _ = prefill_request(prefill, BLOCK - 3, seed=5)
    dreq = request(BLOCK - 3, dict(params), max_tokens=2, seed=5)
    decode.add(dreq)
    decode.step()
    assert dreq.status == RequestStatus.RUNNING  # computed locally at once, no transfer wait
    assert dreq.num_computed_tokens == BLOCK - 3 or decode.outputs.get(dreq.request_id) is not None
    assert decode.worker._worker.cumulative_stats().get("transfers", 0) == 0
