"""Connector settings from ``kv_connector_extra_config`` and the environment (pure + file read).

The extra config's keys, defaults and validation are pdfleet.contract.connector_config
(``ConnectorExtraConfig``: the operator renders it, this module parses it and holds it as
``AdapterConfig.settings``, whose fields are named as the keys; ``KVSource`` and ``KVSink`` take
the same object). Here: the side channel's address from the environment and the key file's contents.

Side channel: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (when unset, ``127.0.0.1``: never a
wildcard address) and ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5600); worker rank r
listens on port + r. The key file is re-read every few seconds: a changed key is used
from then on and the previous one is still accepted for one lease period.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pdfleet.contract import env as env_names
from pdfleet.contract import ports
from pdfleet.contract.connector_config import (
    AUTH_SECRET_FILE,
    DEFAULTS,
    ConnectorConfigError,
    ConnectorExtraConfig,
)

__all__ = ["AdapterConfig", "ConfigError", "parse_adapter_config", "read_secret_file", "key_ring",
           "DEFAULT_SIDE_CHANNEL_PORT"]

DEFAULT_SIDE_CHANNEL_PORT = ports.SIDE_CHANNEL
MAX_SECRET_BYTES = 4096
ConfigError = ConnectorConfigError  # a connector setting is invalid; the message names it


@dataclass(frozen=True)
class AdapterConfig:
    side_channel_host: str
    side_channel_port: int
    # The validated kv_connector_extra_config, held as it is (settings.lease_seconds, ...).
    settings: ConnectorExtraConfig = DEFAULTS
    secret: bytes | None = None  # the bytes of settings.auth_secret_file


def _host(env: Mapping[str, str]) -> str:
    host = env.get(env_names.SIDE_CHANNEL_HOST) or "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host  # a hostname; resolved when binding
    if addr.is_unspecified:
        raise ConfigError(
            f"{env_names.SIDE_CHANNEL_HOST}={host!r}: a wildcard address cannot be advertised to decode;"
            " set it to this pod's IP (downward API status.podIP)"
        )
    return host


def _port(env: Mapping[str, str]) -> int:
    raw = env.get(env_names.SIDE_CHANNEL_PORT) or str(DEFAULT_SIDE_CHANNEL_PORT)
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"{env_names.SIDE_CHANNEL_PORT} must be an integer in [1, 65535], got {raw!r}") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"{env_names.SIDE_CHANNEL_PORT} must be an integer in [1, 65535], got {port}")
    return port


def read_secret_file(path: str) -> bytes:
    """The key in ``path`` (whitespace stripped, 16..4096 bytes); ``ConfigError`` otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"kv_connector_extra_config.{AUTH_SECRET_FILE} {path!r} cannot be read: {exc.strerror}") from None
    data = data.strip()
    if not 16 <= len(data) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"kv_connector_extra_config.{AUTH_SECRET_FILE} {path!r} must hold 16..{MAX_SECRET_BYTES} bytes of secret,"
            f" it holds {len(data)}"
        )
    return data


def parse_adapter_config(extra: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> AdapterConfig:
    """Validate the extra config and side-channel env; raise ``ConfigError`` on bad values."""
    env = os.environ if env is None else env
    cfg = ConnectorExtraConfig.parse(extra)
    host, port = _host(env), _port(env)
    secret = read_secret_file(cfg.auth_secret_file) if cfg.auth_secret_file is not None else None
    return AdapterConfig(side_channel_host=host, side_channel_port=port, settings=cfg, secret=secret)


def key_ring(cfg: AdapterConfig) -> Any:
    """The side channel's ``KeyRing`` (None without a key): follows the key file, old key kept one lease."""
    if cfg.secret is None:
        return None
    from pdfleet.connector.transfer.auth import KeyRing

    path = cfg.settings.auth_secret_file
    return KeyRing(cfg.secret, grace_seconds=cfg.settings.lease_seconds,
                   loader=(lambda: read_secret_file(path)) if path else None)
