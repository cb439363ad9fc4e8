"""Lease heartbeats (pure): split to fit one side-channel message, and a pull's answer read as an event.

A decode may keep alive or release thousands of queued requests at once; each message carries
at most ``HEARTBEAT_MAX_IDS`` ids (the source refuses more) and about ``HEARTBEAT_MAX_ID_BYTES``
of them (the request codec's limit is 64 KiB), lease ids (params 1.4) included.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from pdfleet.connector.transfer import pull_state as ps
from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.sidechannel import Call
from pdfleet.contract.kv_params import is_lease_id, lease_id_bytes

__all__ = ["HEARTBEAT_MAX_IDS", "HEARTBEAT_MAX_ID_BYTES", "LEASE_ID_COST", "chunk_request_ids",
           "check_lease_ids", "lease_ids_field", "heartbeat_event"]

HEARTBEAT_MAX_IDS = 4096
HEARTBEAT_MAX_ID_BYTES = 48 * 1024
LEASE_ID_COST = lease_id_bytes + 2  # a lease id in a heartbeat, msgpack bin header included


def lease_ids_field(ids: Sequence[str], by_id: dict[str, bytes | None]) -> list[bytes]:
    """The heartbeat's ``lease_ids`` field for ``ids`` (b"" for none); [] when none has one."""
    out = [by_id.get(rid) or b"" for rid in ids]
    return out if any(out) else []


def check_lease_ids(request_ids: Sequence[Any], lease_ids: Sequence[Any] | None) -> dict[str, bytes | None]:
    """Request id -> lease id ({} without lease ids); a ValueError names what is wrong."""
    if lease_ids is None:
        return {}
    if len(lease_ids) != len(request_ids):
        raise ValueError(f"{len(lease_ids)} lease ids for {len(request_ids)} request ids")
    for lid in lease_ids:
        if lid is not None and not is_lease_id(lid):
            raise ValueError(f"a lease id must be {lease_id_bytes} bytes or None, got {lid!r}")
    return {str(rid): lid for rid, lid in zip(request_ids, lease_ids)}


def chunk_request_ids(ids: Sequence[str], max_ids: int = HEARTBEAT_MAX_IDS,
                      max_bytes: int = HEARTBEAT_MAX_ID_BYTES, extra_per_id: int = 0) -> list[list[str]]:
    """Split request ids into heartbeat-sized chunks (at most ``max_ids`` ids and about ``max_bytes``
    of msgpack each, ``extra_per_id`` more bytes per id: its lease id), in order; an id alone over
    ``max_bytes`` gets a chunk of its own."""
    out: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for rid in ids:
        cost = len(rid.encode()) + 5 + extra_per_id  # msgpack string header, at most
        if cur and (len(cur) >= max_ids or size + cost > max_bytes):
            out.append(cur)
            cur, size = [], 0
        cur.append(rid)
        size += cost
    if cur:
        out.append(cur)
    return out


def heartbeat_event(call: Call, request_id: str) -> ps.Event:
    """A pull's finished heartbeat as an event of its state machine."""
    try:
        reply = call.result()
    except Exception as exc:
        return ps.HeartbeatFailed(time.monotonic(), time.time(), str(exc))
    now = time.monotonic()
    if isinstance(reply, wire.ErrorReply):
        return ps.HeartbeatBad(now, f"lease heartbeat refused: {reply.reason}")
    if not isinstance(reply, wire.HeartbeatReply):
        return ps.HeartbeatBad(now, f"unexpected heartbeat reply {type(reply).__name__}")
    left = reply.remaining.get(request_id)
    return ps.HeartbeatAnswer(now, reply.instance_id, None if left is None else float(left),
                              released_by_us=request_id in reply.released_by_you, gone=request_id in reply.gone)
