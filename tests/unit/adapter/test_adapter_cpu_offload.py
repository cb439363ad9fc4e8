"""pdfleet's host-memory offload tier for CPU engines (adapter/cpu_offload.py, issue 40): which engine blocks pair
with which host rows (offload_rows.copy_rows, pure, a table), and the worker's copies: blocks stored then loaded
into other blocks come back byte for byte, through strided engine tensors, chunks of several blocks and a first
chunk that starts before the request's first block. Negative control: the same transfer read back with the
skip ignored returns other bytes."""

from __future__ import annotations

import pytest
import torch

from pdfleet.connector.adapter.offload_rows import GroupRows, copy_rows

ROWS = [
    # engine blocks, group sizes, first block index per group, chunk ids, blocks per chunk -> per group rows
    ("one block a chunk", [7, 3, 9], [3], [0], [4, 0, 2], 1, [GroupRows(0, (7, 3, 9), (4, 0, 2))]),
    ("two blocks a chunk", [7, 3, 9, 1], [4], [0], [5, 2], 2, [GroupRows(0, (7, 3, 9, 1), (10, 11, 4, 5))]),
    ("first chunk starts a block early", [7, 3, 9], [3], [1], [5, 2], 2, [GroupRows(0, (7, 3, 9), (11, 4, 5))]),
    ("last chunk half used", [7, 3, 9], [3], [0], [5, 2], 2, [GroupRows(0, (7, 3, 9), (10, 11, 4))]),
    ("two groups, one empty", [7, 3, 8], [2, 0, 1], [0, 0, 4], [1, 6], 4,
     [GroupRows(0, (7, 3), (4, 5)), GroupRows(2, (8,), (24,))]),
    ("nothing", [], [0], [0], [], 2, []),
]


@pytest.mark.parametrize("case,blocks,sizes,firsts,chunks,per,expected", ROWS, ids=[r[0] for r in ROWS])
def test_engine_blocks_pair_with_host_rows(case, blocks, sizes, firsts, chunks, per, expected) -> None:
    assert copy_rows(blocks, sizes, firsts, chunks, per) == expected


@pytest.mark.parametrize("blocks,sizes,firsts,chunks,per", [
    ([7, 3], [3], [0], [1, 2, 3], 1),   # sizes say 3 blocks, 2 given
    ([7, 3, 9], [3], [0], [1, 2], 1),   # too few chunks
    ([7, 3], [2], [0], [1, 2, 3], 2),   # a chunk left over
    ([7], [1], [0, 0], [1], 1),         # a block index per group
])
def test_sides_that_disagree_are_refused(blocks, sizes, firsts, chunks, per) -> None:
    with pytest.raises(ValueError):
        copy_rows(blocks, sizes, firsts, chunks, per)


def _worker(num_blocks: int, page: int, chunks: int, per: int, strided: bool):
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

    from pdfleet.connector.adapter.cpu_offload import HostCopyWorker

    backing = torch.randint(-128, 127, (num_blocks, page * (2 if strided else 1)), dtype=torch.int8)
    engine = backing[:, :page] if strided else backing  # a layer view whose block stride exceeds its page
    other = torch.randint(-128, 127, (num_blocks, page), dtype=torch.int8)
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(engine, page), CanonicalKVCacheTensor(other, page)],
                               [[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    return HostCopyWorker(caches, per, chunks), engine, other


def _specs(blocks, first, chunk_ids):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    return GPULoadStoreSpec(blocks, [len(blocks)], [first]), CPULoadStoreSpec(chunk_ids)


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("per,first,chunk_ids", [(1, 0, [3, 0, 2]), (2, 1, [1, 3]), (4, 2, [1, 0])])
def test_stored_blocks_load_back_into_other_blocks_byte_for_byte(strided, per, first, chunk_ids) -> None:
    worker, engine, other = _worker(num_blocks=12, page=64, chunks=4, per=per, strided=strided)
    src, dst = [5, 1, 8], [0, 11, 4]
    kept = [t[src].clone() for t in (engine, other)]
    gpu, cpu = _specs(src, first, chunk_ids)
    assert worker.submit_store(1, gpu, cpu)
    engine[src] = 0  # the engine evicts and reuses the blocks
    gpu_back, cpu_back = _specs(dst, first, chunk_ids)
    assert worker.submit_load(2, cpu_back, gpu_back)
    assert torch.equal(engine[dst], kept[0]) and torch.equal(other[dst], kept[1])
    done = worker.get_finished()
    assert [(r.job_id, r.success) for r in done] == [(1, True), (2, True)] and all(r.transfer_size for r in done)
    assert worker.get_finished() == []  # each result is reported once


def test_negative_control_a_load_that_ignores_the_skip_reads_other_bytes() -> None:
    worker, engine, _ = _worker(num_blocks=12, page=64, chunks=4, per=2, strided=False)
    src, dst = [5, 1, 8], [0, 11, 4]
    kept = engine[src].clone()
    worker.submit_store(1, *_specs(src, 1, [1, 3]))
    worker.submit_load(2, *reversed(_specs(dst, 0, [1, 3])))  # first block index 0: chunk rows from the start
    assert not torch.equal(engine[dst], kept)


def test_the_spec_hands_out_the_host_copy_worker() -> None:
    from pdfleet.connector.adapter.cpu_offload import PdfleetCPUOffloadingSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    from pdfleet.contract.kv_offload import PDFLEET_CPU_SPEC, PDFLEET_CPU_SPEC_MODULE, SPEC_MODULE_PATH_KEY, SPEC_NAME_KEY

    cls = OffloadingSpecFactory.get_spec_cls({SPEC_NAME_KEY: PDFLEET_CPU_SPEC, SPEC_MODULE_PATH_KEY: PDFLEET_CPU_SPEC_MODULE})
    assert cls is PdfleetCPUOffloadingSpec  # what the plan's spec_name and spec_module_path load


def test_the_connector_asks_for_the_layout_its_config_names() -> None:
    """Beside the offloading connector (spec.kvOffload) pdfleet's connector asks vLLM for LBHNC, the layout that one
    asks for (MultiConnector refuses children that disagree); without the key it chooses itself (None here)."""
    from types import SimpleNamespace

    from pdfleet.connector.adapter.kv_layout import configured_layout, required_layout
    from pdfleet.contract.connector_config import KV_CACHE_LAYOUT, ConnectorConfigError

    def config(extra):
        return SimpleNamespace(model_config=object(), kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra))

    assert configured_layout(config({KV_CACHE_LAYOUT: "LBHNC"})) == required_layout(config({KV_CACHE_LAYOUT: "LBHNC"})) == "LBHNC"
    assert configured_layout(config({"backends": ["UCX"]})) is None and configured_layout(config({})) is None
    with pytest.raises(ConnectorConfigError, match=KV_CACHE_LAYOUT):
        configured_layout(config({KV_CACHE_LAYOUT: "BHLNC"}))
