"""pdfleet KV transfer core: NIXL READs of KV blocks, ZMQ handshake, leases. Imports no vLLM.

Public API (addresses are plain ints; see each module's docstring):

- ``Region``, ``KVLayout`` (layout.py): registered memory and what both sides agree on.
- ``KVSource`` (source.py): prefill side; ``start``, ``hold``, ``poll_released``, ``stats``, ``close``.
- ``KVSink`` (sink.py): decode side; ``pull``, ``keep_alive``, ``poll``, ``stats``, ``close``.
- Pure helpers: ``plan_slice``, ``remote_rank_for``, ``registration_spans``,
  ``choose_kv_cache_layout`` (layout.py); ``validate_block_ids``, ``coalesce_runs``,
  ``build_descriptors`` (descriptors.py).

``KVSource``/``KVSink`` are imported lazily so that the pure parts import without NIXL/ZMQ.
"""

from __future__ import annotations

from typing import Any

from pdfleet.connector.transfer.descriptors import build_descriptors, coalesce_runs, validate_block_ids
from pdfleet.connector.transfer.layout import (
    IncompatibleLayout,
    InvalidBlockIds,
    KVLayout,
    LayoutChoice,
    Region,
    SlicePlan,
    Span,
    choose_kv_cache_layout,
    plan_slice,
    registration_spans,
    remote_rank_for,
)

__all__ = [
    "Region",
    "KVLayout",
    "SlicePlan",
    "IncompatibleLayout",
    "InvalidBlockIds",
    "plan_slice",
    "remote_rank_for",
    "validate_block_ids",
    "coalesce_runs",
    "build_descriptors",
    "Span",
    "registration_spans",
    "LayoutChoice",
    "choose_kv_cache_layout",
    "KVSource",
    "KVSink",
]


def __getattr__(name: str) -> Any:
    if name == "KVSource":
        from pdfleet.connector.transfer.source import KVSource

        return KVSource
    if name == "KVSink":
        from pdfleet.connector.transfer.sink import KVSink

        return KVSink
    raise AttributeError(f"module 'pdfleet.connector.transfer' has no attribute {name!r}")
