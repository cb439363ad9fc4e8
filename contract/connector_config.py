"""The connector's ``kv_connector_extra_config``: one typed object, one set of defaults.

The operator renders it (plan/engine.py: ``kv_transfer_config``), the API's ``kvTransfer``
defaults come from ``DEFAULTS``, and the connector parses it (adapter/config.py) with
``ConnectorExtraConfig.parse``, which names the key and what is allowed on bad input.

Keys (all optional):

- ``lease_seconds`` (number > 0, default 120): how long prefill holds a finished request's
  blocks for decode to read; decode heartbeats extend it. (Until this contract the API said
  120 and the connector 30; every fleet the operator renders has always passed 120.)
- ``backends`` (non-empty list of NIXL backend names, default ``["UCX"]``).
- ``auth_secret_file`` (path): file whose bytes are the side channel's HMAC key; the key itself
  never goes in the config.
- ``allow_unauthenticated`` (bool, default false): without ``auth_secret_file`` the connector
  refuses to start unless this is true.
- ``handshake_timeout`` (number > 0, default 5.0 seconds), ``handshake_retries`` (int >= 0, default 3).
- ``compat_extra`` (string): mixed into the compatibility hash, to keep apart fleets that must
  never exchange KV (the operator puts the revision there).
- ``read_floor_bandwidth`` (bytes/s > 0, default 50e6), ``read_timeout_floor`` (seconds > 0, default 5):
  a READ not done within the floor plus its bytes at that bandwidth is cancelled and recomputed.
- ``nixl_threads`` (int 0..64, default 0), ``nixl_split_batch`` (int 1..4096, default 4): decode's
  NIXL UCX backend posts a READ of at least ``nixl_split_batch`` descriptors from ``nixl_threads``
  threads at once, each with its own UCX worker (on a GPU, its own CUDA stream). The operator
  renders ``GPU_NIXL_THREADS`` for ``bufferDevice: cuda`` unless the spec says otherwise.
- ``required_kv_cache_layout`` (``"LBHNC"``): the physical KV layout to ask vLLM for instead of the connector's own
  choice; the operator sets it when the connector runs beside vLLM's OffloadingConnector (spec.kvOffload),
  which asks for that one, under MultiConnector, which refuses children that disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from pdfleet.contract import kv_offload

CONNECTOR_CLASS = "PdfleetConnector"
CONNECTOR_MODULE = "pdfleet.connector"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# spec.kvTransfer.decodeReuse: each role both holds and pulls (issue 40); vLLM's kv_both, spelled in kv_offload.py
KV_BOTH = kv_offload.MULTI_KV_ROLE

LEASE_SECONDS = "lease_seconds"
BACKENDS = "backends"
AUTH_SECRET_FILE = "auth_secret_file"
ALLOW_UNAUTHENTICATED = "allow_unauthenticated"
HANDSHAKE_TIMEOUT = "handshake_timeout"
HANDSHAKE_RETRIES = "handshake_retries"
COMPAT_EXTRA = "compat_extra"
READ_FLOOR_BANDWIDTH = "read_floor_bandwidth"
READ_TIMEOUT_FLOOR = "read_timeout_floor"
NIXL_THREADS = "nixl_threads"
NIXL_SPLIT_BATCH = "nixl_split_batch"
KV_CACHE_LAYOUT = "required_kv_cache_layout"
KV_CACHE_LAYOUT_CHOICES = (kv_offload.OFFLOAD_KV_CACHE_LAYOUT,)
# What a GPU fleet runs with (bench part l on an H100, 256 MiB pull: one thread posts 128 pages
# in 0.69 ms and reads at ~250 GB/s, one CUDA stream; 4 threads split at 4: 509-730 GB/s).
GPU_NIXL_THREADS = 4
MAX_NIXL_THREADS = 64


def nixl_threads_for(buffer_device: str, requested: int | None = None) -> int:
    """The spec's value, else the measured default for where the KV lives: on a GPU one thread posts
    a read on one CUDA stream (~250 GB/s on an H100), several split it (docs/connector-core.md)."""
    if requested is not None:
        return requested
    return GPU_NIXL_THREADS if buffer_device == "cuda" else 0
MAX_NIXL_SPLIT_BATCH = 4096


class ConnectorConfigError(ValueError):
    """A connector setting is invalid; the message names it and what is allowed."""


def _where(key: str) -> str:
    return f"kv_connector_extra_config.{key}"


@dataclass(frozen=True)
class ConnectorExtraConfig:
    lease_seconds: float = 120
    backends: tuple[str, ...] = ("UCX",)
    auth_secret_file: str | None = None
    allow_unauthenticated: bool = False
    handshake_timeout: float = 5.0
    handshake_retries: int = 3
    compat_extra: str = ""
    # A READ not complete within read_timeout_floor plus its bytes at read_floor_bandwidth (bytes/s)
    # is cancelled, fails (vLLM recomputes) and its lease is released.
    read_floor_bandwidth: float = 50e6
    read_timeout_floor: float = 5.0
    nixl_threads: int = 0
    nixl_split_batch: int = 4
    required_kv_cache_layout: str | None = None  # None: the connector chooses (adapter/kv_layout.py)

    def to_extra(self) -> dict[str, Any]:
        """The JSON object vLLM passes to the connector. The keys the operator always sets are
        always written; the others only when they differ from the default."""
        out: dict[str, Any] = {BACKENDS: list(self.backends), LEASE_SECONDS: _number(self.lease_seconds)}
        if self.compat_extra:
            out[COMPAT_EXTRA] = self.compat_extra
        if self.auth_secret_file is not None:
            out[AUTH_SECRET_FILE] = self.auth_secret_file
        if self.required_kv_cache_layout is not None:
            out[KV_CACHE_LAYOUT] = self.required_kv_cache_layout
        for f in fields(self):
            if f.name in (HANDSHAKE_TIMEOUT, HANDSHAKE_RETRIES, ALLOW_UNAUTHENTICATED, READ_FLOOR_BANDWIDTH,
                          READ_TIMEOUT_FLOOR, NIXL_THREADS, NIXL_SPLIT_BATCH):
                value = getattr(self, f.name)
                if value != f.default:
                    out[f.name] = value
        return out

    @classmethod
    def parse(cls, extra: Mapping[str, Any] | None) -> "ConnectorExtraConfig":
        """Validate ``kv_connector_extra_config``; raise ``ConnectorConfigError`` naming the key."""
        extra = dict(extra or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in extra if k not in known)
        if unknown:
            raise ConnectorConfigError(f"kv_connector_extra_config has unknown keys {unknown}; allowed: {sorted(known)}")
        backends = extra.get(BACKENDS, list(DEFAULTS.backends))
        if (not isinstance(backends, (list, tuple)) or not backends
                or not all(isinstance(b, str) and b for b in backends)):
            raise ConnectorConfigError(f"{_where(BACKENDS)} must be a non-empty list of names, got {backends!r}")
        retries = extra.get(HANDSHAKE_RETRIES, DEFAULTS.handshake_retries)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConnectorConfigError(f"{_where(HANDSHAKE_RETRIES)} must be an integer >= 0, got {retries!r}")
        compat_extra = extra.get(COMPAT_EXTRA, DEFAULTS.compat_extra)
        if not isinstance(compat_extra, str):
            raise ConnectorConfigError(f"{_where(COMPAT_EXTRA)} must be a string, got {compat_extra!r}")
        allow = extra.get(ALLOW_UNAUTHENTICATED, DEFAULTS.allow_unauthenticated)
        if not isinstance(allow, bool):
            raise ConnectorConfigError(f"{_where(ALLOW_UNAUTHENTICATED)} must be true or false, got {allow!r}")
        path = extra.get(AUTH_SECRET_FILE)
        if path is None and not allow:
            raise ConnectorConfigError(
                f"{_where(AUTH_SECRET_FILE)} is not set: the side channel would accept anyone"
                " (and a NIXL READ can then read this engine's KV cache). Mount a key file and set"
                f" {AUTH_SECRET_FILE}, or set {ALLOW_UNAUTHENTICATED}: true to run without one"
            )
        if path is not None and (not isinstance(path, str) or not path):
            raise ConnectorConfigError(f"{_where(AUTH_SECRET_FILE)} must be a file path, got {path!r}")
        layout = extra.get(KV_CACHE_LAYOUT)
        if layout is not None and layout not in KV_CACHE_LAYOUT_CHOICES:
            raise ConnectorConfigError(f"{_where(KV_CACHE_LAYOUT)} must be one of {list(KV_CACHE_LAYOUT_CHOICES)}"
                                       f" or unset, got {layout!r}")
        return cls(
            lease_seconds=_positive(extra, LEASE_SECONDS, DEFAULTS.lease_seconds),
            backends=tuple(backends),
            auth_secret_file=path,
            allow_unauthenticated=allow,
            handshake_timeout=_positive(extra, HANDSHAKE_TIMEOUT, DEFAULTS.handshake_timeout),
            handshake_retries=retries,
            compat_extra=compat_extra,
            read_floor_bandwidth=_positive(extra, READ_FLOOR_BANDWIDTH, DEFAULTS.read_floor_bandwidth),
            read_timeout_floor=_positive(extra, READ_TIMEOUT_FLOOR, DEFAULTS.read_timeout_floor),
            nixl_threads=_int_in(extra, NIXL_THREADS, DEFAULTS.nixl_threads, 0, MAX_NIXL_THREADS),
            nixl_split_batch=_int_in(extra, NIXL_SPLIT_BATCH, DEFAULTS.nixl_split_batch, 1, MAX_NIXL_SPLIT_BATCH),
            required_kv_cache_layout=layout,
        )


DEFAULTS = ConnectorExtraConfig()


def _number(value: float) -> float | int:
    # 120, not 120.0: the rendered engine args (and so the pods) stay as they were.
    return int(value) if float(value).is_integer() else value


def _positive(extra: Mapping[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConnectorConfigError(f"{_where(key)} must be a number > 0, got {value!r}")
    return float(value)


def _int_in(extra: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConnectorConfigError(f"{_where(key)} must be an integer in [{low}, {high}], got {value!r}")
    return value
