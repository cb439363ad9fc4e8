"""A prefill whose TP ranks live on two nodes (two hosts): each decode rank pulls from the pod
holding the prefill rank it reads, named in kv_transfer_params.remote_hosts. Real vLLM schedulers,
real NIXL/UCX and ZMQ; the two "nodes" are two loopback addresses (127.0.0.1 and 127.0.0.2)."""

from __future__ import annotations

import time

import pytest
import torch
from adapter_harness import BLOCK, Side, free_port, prefill_request, request, signed

from pdfleet.connector.adapter import worker as worker_mod
from pdfleet.connector.adapter.nodes import NODE_HOSTS_ENV

NODES = ("127.0.0.1", "127.0.0.2")


@pytest.fixture()
def env(monkeypatch):
    return monkeypatch


def _prefill_over_two_nodes(tiny_model, env) -> tuple[Side, Side]:
    port = free_port()
    env.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(port))
    env.setenv(NODE_HOSTS_ENV, ",".join(NODES))
    sides = []
    for rank, host in enumerate(NODES):
        env.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", host)
        env.setattr(worker_mod, "tensor_parallel_rank", lambda rank=rank: rank)
        sides.append(Side(tiny_model, "kv_producer", tp=2, heads=1, nnodes=2, engine_id="prefill-over-2-nodes"))
    leader, node1 = sides
    leader.peer_workers.append(node1.worker)  # rank 1 executes the leader scheduler's metadata
    return leader, node1


def _pull_with_two_decode_ranks(tiny_model, env, params: dict,
                                extra: dict | None = None) -> tuple[list[Side], object, list, dict]:
    env.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    env.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    env.delenv(NODE_HOSTS_ENV)
    ranks = []
    for rank in (0, 1):
        env.setattr(worker_mod, "tensor_parallel_rank", lambda rank=rank: rank)
        ranks.append(Side(tiny_model, "kv_consumer", tp=2, heads=1, extra=extra))
    sched = ranks[0]
    dreq = request(3 * BLOCK + 2, dict(params), seed=4)
    sched.add(dreq)
    meta = sched.scheduler.schedule().kv_connector_metadata
    assert dreq.request_id in meta.pulls
    for side in ranks:
        side.worker.bind_connector_metadata(meta)
        side.worker.start_load_kv(None)
    results = {}
    for rank, side in enumerate(ranks):
        for _ in range(1500):
            res = side.worker.get_transfer_results(set())
            if res.finished_recving or res.failed_recving:
                break
            time.sleep(0.01)
        results[rank] = res
    return ranks, dreq, sched.block_ids(dreq.request_id), results


def test_each_decode_rank_reads_the_prefill_rank_on_its_node(tiny_model, env):
    leader, node1 = _prefill_over_two_nodes(tiny_model, env)
    decodes = []
    try:
        _, params, p_blocks = prefill_request(leader, 3 * BLOCK + 2, seed=4)
        assert params["remote_hosts"] == list(NODES) and params["remote_host"] == NODES[0]
        for name in node1.kv:  # rank 1's own KV (its head), different from rank 0's
            for b in p_blocks:
                node1.kv[name][b].copy_(torch.randn(node1.kv[name][b].shape, generator=torch.Generator().manual_seed(b)))
        decodes, dreq, d_blocks, results = _pull_with_two_decode_ranks(tiny_model, env, params)
        for rank, res in results.items():
            assert res.finished_recving == {dreq.request_id} and not res.failed_recving, (rank, res)
        for rank, (decode, prefill) in enumerate(zip(decodes, (leader, node1))):
            for name in prefill.kv:
                for i in range(3):
                    assert torch.equal(decode.kv[name][d_blocks[i]], prefill.kv[name][p_blocks[i]]), (rank, name, i)
    finally:
        for side in (*decodes, leader, node1):
            side.close()


def test_without_remote_hosts_rank_1_dials_the_leader_and_fails(tiny_model, env):
    """Negative control: the same pull with every rank at remote_host (the old contract) cannot
    reach prefill rank 1, which listens on the other node; rank 0 still succeeds."""
    leader, node1 = _prefill_over_two_nodes(tiny_model, env)
    decodes = []
    try:
        _, params, _ = prefill_request(leader, 3 * BLOCK + 2, seed=4)
        del params["remote_hosts"]
        params = signed(params)  # as a prefill that does not know its nodes would have signed them
        # Rank 1's handshakes go unanswered: one short attempt each instead of 3 x 5 s.
        decodes, dreq, _, results = _pull_with_two_decode_ranks(
            tiny_model, env, params, extra={"handshake_timeout": 1.0, "handshake_retries": 1})
        assert results[0].finished_recving == {dreq.request_id} and not results[0].failed_recving
        assert dreq.request_id in (results[1].failed_recving or set())  # reported failed: vLLM recomputes
    finally:
        for side in (*decodes, leader, node1):
            side.close()
