"""KV caches built by vLLM 0.32's own ``allocate_kv_cache`` (device cpu) in a chosen
physical layout, registered through ``PdfleetConnector``'s worker path.

Shared by the layout tests and their prefill process (``layout_source_proc.py``).
Cache contents are a seeded pattern per layer (``expected_layer``), written through
the layer views vLLM returns, so the test regenerates what prefill holds.
"""

from __future__ import annotations

import os
import tempfile

import torch

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

from pdfleet.connector import PdfleetConnector

BLOCK = 16
HEAD_DIM = 16
LAYERS = 4
NUM_BLOCKS = 64
DTYPE = torch.float16


KEY_ENV = "PDFLEET_LAYOUT_TEST_KEY_FILE"


def _key_file() -> str:
    """One side-channel key for this test run and the source processes it starts (they inherit the
    path through the environment): the connector refuses to start without a key."""
    path = os.environ.get(KEY_ENV)
    if not path:
        fd, path = tempfile.mkstemp(prefix="pdfleet-layout-test-key-")
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
        os.environ[KEY_ENV] = path
    return path


KEY_FILE = _key_file()  # made on import, before any source process is started


def layer_names(layers: int = LAYERS) -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(layers)]


def build_worker(
    layout: str, role: str, *, heads: int, tp_size: int = 1, tp_rank: int = 0,
    layers: int = LAYERS, num_blocks: int = NUM_BLOCKS,
) -> tuple[PdfleetConnector, dict[str, torch.Tensor]]:
    """A worker-side connector whose KV cache vLLM allocated in ``layout`` (one backing buffer)."""
    kt = KVTransferConfig(kv_connector="PdfleetConnector", kv_connector_module_path="pdfleet.connector",
                          kv_role=role, engine_id=f"{role}-{layout}",
                          kv_connector_extra_config={"auth_secret_file": KEY_FILE})
    cfg = VllmConfig(cache_config=CacheConfig(block_size=BLOCK), device_config=DeviceConfig("cpu"),
                     kv_transfer_config=kt)
    cfg.parallel_config.tensor_parallel_size = tp_size
    cfg.cache_config.kv_cache_layout = layout  # what the engine core resolves and records
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=HEAD_DIM, dtype=DTYPE)
    groups = [KVCacheGroupSpec(layer_names(layers), spec)]
    kvcfg = get_kv_cache_config_from_groups(cfg, groups, spec.page_size_bytes * layers * num_blocks)
    assert kvcfg.num_blocks == num_blocks
    kv = allocate_kv_cache(kvcfg, torch.device("cpu"), KVCacheLayout[layout])
    conn = PdfleetConnector(cfg, KVConnectorRole.WORKER, kvcfg)
    conn._worker.tp_rank = tp_rank  # vLLM's TP process group sets it in an engine
    conn.register_kv_caches(kv)
    return conn, kv


def expected_layer(index: int, shape: tuple[int, ...], seed: int = 7) -> torch.Tensor:
    """Prefill's content of layer ``index`` ([blocks, heads, tokens, 2 x head_dim])."""
    gen = torch.Generator().manual_seed(seed * 1000 + index)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(DTYPE)


def fill(kv: dict[str, torch.Tensor], seed: int = 7) -> None:
    for i, t in enumerate(kv.values()):
        t.copy_(expected_layer(i, tuple(t.shape), seed))
