"""The KV offload tier of spec.kvOffload in an engine's --kv-transfer-config, and in status (pure).

A role listed in kvOffload.roles gets vLLM's MultiConnector over pdfleet's connector (first: a P/D
request's KV still comes from its prefill) and vLLM's OffloadingConnector (second), whose spec is
pdfleet's host-copy one on CPU engines and vLLM's built-in CPU spec on GPU engines
(contract/kv_offload.py). Other roles, and every role without kvOffload, keep pdfleet's connector alone.
"""

from __future__ import annotations

from typing import Any, Optional

from pdfleet.contract.connector_config import KV_CACHE_LAYOUT
from pdfleet.contract.kv_offload import (
    OFFLOAD_KV_CACHE_LAYOUT,
    multi_connector_config,
    offload_connector_config,
)
from pdfleet.operator.api import quantity
from pdfleet.operator.api.rules import is_cpu_engine
from pdfleet.operator.api.types import DisaggregatedInferenceSpec


def offloads(spec: DisaggregatedInferenceSpec, role: str) -> bool:
    return spec.kv_offload is not None and role in spec.kv_offload.roles


def with_offload(spec: DisaggregatedInferenceSpec, role: str, pdfleet: dict[str, Any]) -> dict[str, Any]:
    """``pdfleet`` (pdfleet's connector config) as it is, or under MultiConnector beside the offload tier."""
    if not offloads(spec, role):
        return pdfleet
    assert spec.kv_offload is not None
    # MultiConnector refuses children that ask for different KV layouts; the offloading connector asks for LBHNC.
    pdfleet = {**pdfleet, "kv_connector_extra_config": {**pdfleet["kv_connector_extra_config"],
                                                        KV_CACHE_LAYOUT: OFFLOAD_KV_CACHE_LAYOUT}}
    offload = offload_connector_config(
        quantity.to_bytes(spec.kv_offload.cpu.capacity), cpu_engine=is_cpu_engine(spec.role(role)),
        block_size=spec.kv_offload.block_size,
    )
    return multi_connector_config(pdfleet, offload)


def status(spec: DisaggregatedInferenceSpec) -> Optional[dict[str, Any]]:
    """status.kvOffload: the tier each engine of the listed roles holds, or None without one."""
    o = spec.kv_offload
    if o is None:
        return None
    return {"capacity": o.cpu.capacity, "capacityBytes": quantity.to_bytes(o.cpu.capacity),
            "roles": [r for r in ("prefill", "decode") if r in o.roles],
            "blockSize": o.block_size or spec.engine.block_size}
