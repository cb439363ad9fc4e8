"""Which physical KV cache layout the connector asks vLLM for, and which one vLLM chose.

The decision is the pure ``choose_kv_cache_layout`` (connector/transfer/layout.py);
this module is its I/O edge: it asks vLLM's attention selector which layouts the
engine's backend accepts (``supported_kv_cache_layouts``) and logs the choice. vLLM
resolves the final layout in the engine core (``resolve_kv_cache_layout``: an explicit
``VLLM_KV_CACHE_LAYOUT`` wins, and a connector request the backends refuse is
dropped with a warning); workers read the result with ``resolved_layout``.
"""

from __future__ import annotations

import logging
from typing import Any

from pdfleet.connector.transfer.layout import KV_CACHE_LAYOUTS, LayoutChoice, choose_kv_cache_layout
from pdfleet.contract.connector_config import ALLOW_UNAUTHENTICATED, ConnectorExtraConfig

__all__ = ["attention_layouts", "configured_layout", "kernel_split_reason", "required_layout", "resolved_layout"]

log = logging.getLogger(__name__)

_logged: set[tuple[str, str]] = set()


def kernel_split_reason(block_size: int | None, kernel_sizes: Any) -> str:
    """Why vLLM will split each block into kernel blocks, or "" when it will not.

    ``kernel_sizes``: the backend's ``get_supported_kernel_block_sizes()`` (ints, or
    objects with ``.base`` for "a multiple of"). No split when the block size is one of
    the ints or a multiple of a ``.base`` (vLLM 0.32's own rule), or when it is unset
    (vLLM then picks one the backend supports).
    """
    if block_size is None or not kernel_sizes:
        return ""
    for size in kernel_sizes:
        base = getattr(size, "base", None)
        if (base is not None and block_size % base == 0) or size == block_size:
            return ""
    return f"block_size {block_size} is not a kernel block size of the attention backend ({list(kernel_sizes)})"


def _backend(vllm_config: Any) -> Any:
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    mc = vllm_config.model_config
    with set_current_vllm_config(vllm_config):
        return get_attn_backend(
            mc.get_head_size(), mc.dtype, vllm_config.cache_config.cache_dtype, use_mla=bool(mc.use_mla),
        )


def attention_layouts(vllm_config: Any) -> tuple[str, ...] | None:
    """Layouts the attention backend vLLM selects for this model accepts (None: any).

    Raises when the backend cannot be determined (the caller falls back).
    """
    layouts = _backend(vllm_config).supported_kv_cache_layouts()
    return None if layouts is None else tuple(layout.name for layout in layouts)


def configured_layout(vllm_config: Any) -> str | None:
    """The layout the connector's own config names (``required_kv_cache_layout``: set beside vLLM's OffloadingConnector,
    which asks for that one), or None: the connector chooses."""
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(ktc, "kv_connector_extra_config", None) or {}
    return ConnectorExtraConfig.parse({**extra, ALLOW_UNAUTHENTICATED: True}).required_kv_cache_layout if extra else None


def required_layout(vllm_config: Any) -> str | None:
    """The layout name for ``get_required_kvcache_layout``, or None without a model config."""
    if vllm_config is None or vllm_config.model_config is None:
        return None
    configured = configured_layout(vllm_config)
    if configured is not None:
        _log_once(LayoutChoice(configured, False, "kv_connector_extra_config asks for it (a sibling connector's)"))
        return configured
    try:
        supported = attention_layouts(vllm_config)
        cc = vllm_config.cache_config
        block_size = cc.block_size if getattr(cc, "user_specified_block_size", False) else None
        split = kernel_split_reason(block_size, _backend(vllm_config).get_supported_kernel_block_sizes())
        choice = choose_kv_cache_layout(supported, kernel_split=split)
    except Exception as exc:  # unknown backend: ask for the fallback, explicitly
        choice = LayoutChoice("LBHNC", True, f"the attention backend's layouts are unknown ({exc}); falling back"
                                             " to LBHNC (one descriptor per layer and block run)")
    _log_once(choice)
    return choice.layout


def _log_once(choice: LayoutChoice) -> None:
    key = (choice.layout, choice.reason)
    if key not in _logged:  # vLLM may ask more than once
        _logged.add(key)
        (log.warning if choice.fallback else log.info)(
            "pdfleet connector asks for KV cache layout %s: %s", choice.layout, choice.reason
        )


def resolved_layout(vllm_config: Any, kv_cache_config: Any) -> str:
    """The layout vLLM resolved for this worker's KV cache (LBHNC when none is recorded)."""
    for owner in (kv_cache_config, getattr(vllm_config, "cache_config", None)):
        name = getattr(owner, "kv_cache_layout", None)
        if isinstance(name, str) and name:
            name = {"NHD": "LBNHC", "HND": "LBHNC"}.get(name, name)  # vLLM's legacy aliases
            if name not in KV_CACHE_LAYOUTS:
                raise ValueError(f"KV cache layout {name!r} is not one of {KV_CACHE_LAYOUTS}")
            return name
    return "LBHNC"
