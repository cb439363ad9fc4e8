"""Connector settings from ``kv_connector_extra_config`` and the environment (pure + file read).

Extra config keys (all optional):

- ``lease_seconds`` (number > 0, default 30): how long prefill holds a finished
  request's blocks for decode to read; decode heartbeats extend it.
- ``backends`` (list of NIXL backend names, default ``["UCX"]``).
- ``auth_secret_file`` (path): file whose bytes are the HMAC key of the side
  channel; both sides must use the same key. The key itself never goes in the config.
  The file is re-read every few seconds: a changed key is used from then on and the
  previous one is still accepted for one lease period (rotation without downtime).
- ``allow_unauthenticated`` (bool, default false): without ``auth_secret_file`` the
  connector refuses to start unless this is true; the side channel is then open to
  anyone who reaches its port (and thereby the KV cache: a NIXL READ is one-sided).
- ``handshake_timeout`` (number > 0, default 5.0 seconds) and ``handshake_retries``
  (int >= 0, default 3).
- ``compat_extra`` (string): mixed into the compatibility hash, to keep apart fleets
  that must never exchange KV.
- ``read_floor_bandwidth`` (bytes/s > 0, default 50e6) and ``read_timeout_floor``
  (seconds > 0, default 5): a READ not complete within ``read_timeout_floor`` plus its
  bytes at ``read_floor_bandwidth`` is cancelled, fails (vLLM recomputes) and its lease
  is released.

Side channel: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (when unset, ``127.0.0.1``: never a
wildcard address) and ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5600); worker rank r
listens on port + r.
"""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["AdapterConfig", "ConfigError", "parse_adapter_config", "read_secret_file", "key_ring",
           "DEFAULT_SIDE_CHANNEL_PORT"]

DEFAULT_SIDE_CHANNEL_PORT = 5600
KNOWN_KEYS = {
    "lease_seconds", "backends", "auth_secret_file", "allow_unauthenticated", "handshake_timeout",
    "handshake_retries", "compat_extra", "read_floor_bandwidth", "read_timeout_floor",
}  # fmt: skip
MAX_SECRET_BYTES = 4096


class ConfigError(ValueError):
    """A connector setting is invalid; the message names it and what is allowed."""


@dataclass(frozen=True)
class AdapterConfig:
    side_channel_host: str
    side_channel_port: int
    lease_seconds: float = 30.0
    backends: tuple[str, ...] = ("UCX",)
    secret: bytes | None = None
    handshake_timeout: float = 5.0
    handshake_retries: int = 3
    compat_extra: str = ""
    secret_file: str | None = None
    read_floor_bandwidth: float = 50e6
    read_timeout_floor: float = 5.0


def _positive(extra: Mapping[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"kv_connector_extra_config.{key} must be a number > 0, got {value!r}")
    return float(value)


def _host(env: Mapping[str, str]) -> str:
    host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host  # a hostname; resolved when binding
    if addr.is_unspecified:
        raise ConfigError(
            f"VLLM_NIXL_SIDE_CHANNEL_HOST={host!r}: a wildcard address cannot be advertised to decode;"
            " set it to this pod's IP (downward API status.podIP)"
        )
    return host


def _port(env: Mapping[str, str]) -> int:
    raw = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT") or str(DEFAULT_SIDE_CHANNEL_PORT)
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"VLLM_NIXL_SIDE_CHANNEL_PORT must be an integer in [1, 65535], got {raw!r}") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"VLLM_NIXL_SIDE_CHANNEL_PORT must be an integer in [1, 65535], got {port}")
    return port


def _secret(extra: Mapping[str, Any]) -> bytes | None:
    path = extra.get("auth_secret_file")
    allow = extra.get("allow_unauthenticated", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"kv_connector_extra_config.allow_unauthenticated must be true or false, got {allow!r}")
    if path is None:
        if not allow:
            raise ConfigError(
                "kv_connector_extra_config.auth_secret_file is not set: the side channel would accept anyone"
                " (and a NIXL READ can then read this engine's KV cache). Mount a key file and set"
                " auth_secret_file, or set allow_unauthenticated: true to run without one"
            )
        return None
    if not isinstance(path, str) or not path:
        raise ConfigError(f"kv_connector_extra_config.auth_secret_file must be a file path, got {path!r}")
    return read_secret_file(path)


def read_secret_file(path: str) -> bytes:
    """The key in ``path`` (whitespace stripped, 16..4096 bytes); ``ConfigError`` otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"kv_connector_extra_config.auth_secret_file {path!r} cannot be read: {exc.strerror}") from None
    data = data.strip()
    if not 16 <= len(data) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"kv_connector_extra_config.auth_secret_file {path!r} must hold 16..{MAX_SECRET_BYTES} bytes of secret,"
            f" it holds {len(data)}"
        )
    return data


def parse_adapter_config(extra: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> AdapterConfig:
    """Validate the extra config and side-channel env; raise ``ConfigError`` on bad values."""
    extra = dict(extra or {})
    env = os.environ if env is None else env
    unknown = sorted(k for k in extra if k not in KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"kv_connector_extra_config has unknown keys {unknown}; allowed: {sorted(KNOWN_KEYS)}"
        )
    backends = extra.get("backends", ["UCX"])
    if (
        not isinstance(backends, (list, tuple))
        or not backends
        or not all(isinstance(b, str) and b for b in backends)
    ):
        raise ConfigError(f"kv_connector_extra_config.backends must be a non-empty list of names, got {backends!r}")
    retries = extra.get("handshake_retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"kv_connector_extra_config.handshake_retries must be an integer >= 0, got {retries!r}")
    compat_extra = extra.get("compat_extra", "")
    if not isinstance(compat_extra, str):
        raise ConfigError(f"kv_connector_extra_config.compat_extra must be a string, got {compat_extra!r}")
    return AdapterConfig(
        side_channel_host=_host(env),
        side_channel_port=_port(env),
        lease_seconds=_positive(extra, "lease_seconds", 30.0),
        backends=tuple(backends),
        secret=_secret(extra),
        handshake_timeout=_positive(extra, "handshake_timeout", 5.0),
        handshake_retries=retries,
        compat_extra=compat_extra,
        secret_file=extra.get("auth_secret_file"),
        read_floor_bandwidth=_positive(extra, "read_floor_bandwidth", 50e6),
        read_timeout_floor=_positive(extra, "read_timeout_floor", 5.0),
    )


def key_ring(cfg: AdapterConfig) -> Any:
    """The side channel's ``KeyRing`` (None without a key): follows the key file, old key kept one lease."""
    if cfg.secret is None:
        return None
    from pdfleet.connector.transfer.auth import KeyRing

    path = cfg.secret_file
    return KeyRing(cfg.secret, grace_seconds=cfg.lease_seconds,
                   loader=(lambda: read_secret_file(path)) if path else None)
