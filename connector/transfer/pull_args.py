"""A sink's and a pull's arguments checked, and where a pull's source rank listens (pure).

``KVSink.pull`` never raises for bad input: it reports the request failed with the ``ValueError``
(or ``InvalidBlockIds``/``IncompatibleLayout``) raised here, which names the argument and what is
allowed.
"""

from __future__ import annotations

import math
from typing import Any

from typing import Sequence

from pdfleet.connector.transfer.descriptors import validate_block_ids
from pdfleet.connector.transfer.layout import KVLayout, Region, remote_rank_for
from pdfleet.connector.transfer.release_retry import ReleaseRetry
from pdfleet.connector.transfer.retry import HeartbeatRetry
from pdfleet.contract.connector_config import ConnectorExtraConfig
from pdfleet.contract.kv_params import is_lease_id, lease_id_bytes

__all__ = ["Endpoint", "check_sink_args", "check_pull_args", "readers_per_rank", "source_port"]

Endpoint = tuple[str, int]


def _time_or_none(value: Any) -> bool:
    return value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value))


def check_sink_args(engine_id: Any, regions: Sequence[Region], settings: ConnectorExtraConfig,
                    heartbeat_retry_policy: Any, release_retry_policy: Any, unknown_grace: float) -> None:
    """``KVSink``'s own arguments; a ValueError names the one that is wrong."""
    if not isinstance(engine_id, str) or not engine_id:
        raise ValueError("engine_id must be a non-empty string")
    if not regions:
        raise ValueError("regions must list at least one registered KV region")
    if not isinstance(heartbeat_retry_policy, HeartbeatRetry):
        raise ValueError("heartbeat_retry_policy must be a HeartbeatRetry")
    if not isinstance(release_retry_policy, ReleaseRetry):
        raise ValueError("release_retry_policy must be a ReleaseRetry")
    if not settings.handshake_timeout > 0:
        raise ValueError("handshake_timeout must be > 0 seconds")
    if not unknown_grace >= 0:
        raise ValueError("unknown_grace must be >= 0 seconds")
    if type(settings.handshake_retries) is not int or settings.handshake_retries < 0:
        raise ValueError("handshake_retries must be an int >= 0")


def check_pull_args(layout: KVLayout, local_num_blocks: int, *, request_id: Any, host: Any, port: Any,
                    remote_engine_id: Any, remote_instance_id: Any, remote_block_ids: Any, local_block_ids: Any,
                    remote_tp_size: int | None, remote_lease_expiry: Any, remote_lease_deadline: Any,
                    lease_id: Any) -> tuple[Endpoint, list[int], list[int]]:
    """The source rank's endpoint and the (remote, local) block ids of a valid pull; raises otherwise."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty string, got {host!r}")
    if type(port) is not int or not 0 < port <= 65535:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")
    if not isinstance(remote_engine_id, str) or not remote_engine_id:
        raise ValueError(f"remote_engine_id must be a non-empty string, got {remote_engine_id!r}")
    if remote_instance_id is not None and not isinstance(remote_instance_id, str):
        raise ValueError(f"remote_instance_id must be a string or None, got {remote_instance_id!r}")
    if not _time_or_none(remote_lease_expiry):
        raise ValueError(f"remote_lease_expiry must be a unix time or None, got {remote_lease_expiry!r}")
    if not _time_or_none(remote_lease_deadline):
        raise ValueError(f"remote_lease_deadline must be a monotonic time or None, got {remote_lease_deadline!r}")
    if lease_id is not None and not is_lease_id(lease_id):
        raise ValueError(f"lease_id must be {lease_id_bytes} bytes or None, got {lease_id!r}")
    remote_ids, local_ids = validate_block_ids(remote_block_ids, local_block_ids, local_num_blocks=local_num_blocks)
    rank = remote_rank_for(layout, layout.tp_size if remote_tp_size is None else remote_tp_size)
    if port + rank > 65535:
        raise ValueError(f"port {port} + remote rank {rank} is out of range")
    return (host, port + rank), remote_ids, local_ids


def source_port(layout: KVLayout, port: Any, remote_tp_size: int | None) -> int:
    """The port of the source rank this decode rank reads from (``port`` is the source's base port)."""
    rank = remote_rank_for(layout, layout.tp_size if remote_tp_size is None else remote_tp_size)
    if type(port) is not int or not 0 < port + rank <= 65535:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")
    return port + rank


def readers_per_rank(layout: KVLayout, remote_tp_size: int | None) -> int:
    """Readers per source rank: decode TP / prefill TP (the source binds a lease to that many agents)."""
    remote = layout.tp_size if remote_tp_size is None else remote_tp_size
    return max(1, layout.tp_size // remote) if isinstance(remote, int) and remote > 0 else 1
