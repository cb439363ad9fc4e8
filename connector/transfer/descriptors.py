"""A pull's block ids checked, and the NIXL descriptors that read them (pure, table-tested).

- ``validate_block_ids``: checks request block ids (types, lengths, ranges).
- ``coalesce_runs`` / ``build_descriptors``: per-block descriptors with runs of
  consecutive blocks merged into one descriptor where memory is dense (layout.py
  describes the regions and the slice each reader copies).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pdfleet.connector.transfer.layout import InvalidBlockIds, Region, SlicePlan

__all__ = ["validate_block_ids", "coalesce_runs", "build_descriptors"]


def _check_ids(name: str, ids: Any, limit: int | None) -> list[int]:
    if not isinstance(ids, (list, tuple)):
        raise InvalidBlockIds(f"{name} must be a list of ints, got {type(ids).__name__}")
    # Fast path (every pull checks its ids twice): plain ints, all in range. Anything else
    # takes the loop below, which names the first bad id.
    if all(type(v) is int for v in ids):
        if not ids or (min(ids) >= 0 and (limit is None or max(ids) < limit)):
            return list(ids)
    out: list[int] = []
    for pos, value in enumerate(ids):
        # bool is an int subclass; numpy ints are accepted through __index__.
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise InvalidBlockIds(
                f"{name}[{pos}] must be an int, got {type(value).__name__} {value!r}"
            )
        value = int(value.__index__())
        if value < 0:
            raise InvalidBlockIds(f"{name}[{pos}] = {value}: block ids must be >= 0")
        if limit is not None and value >= limit:
            raise InvalidBlockIds(
                f"{name}[{pos}] = {value}: out of range, the cache has {limit} blocks (0..{limit - 1})"
            )
        out.append(value)
    return out


def validate_block_ids(
    remote_block_ids: Any,
    local_block_ids: Any,
    *,
    local_num_blocks: int,
    remote_num_blocks: int | None = None,
) -> tuple[list[int], list[int]]:
    """Check a request's block ids; return them as plain int lists or raise ``InvalidBlockIds``.

    ``remote_num_blocks`` is None before the handshake (the range is checked again later).
    """
    remote = _check_ids("remote_block_ids", remote_block_ids, remote_num_blocks)
    local = _check_ids("local_block_ids", local_block_ids, local_num_blocks)
    if len(remote) != len(local):
        raise InvalidBlockIds(
            f"remote_block_ids has {len(remote)} ids but local_block_ids has {len(local)}:"
            " lengths must match"
        )
    if not local:
        raise InvalidBlockIds("remote_block_ids/local_block_ids are empty: nothing to pull")
    if len(set(local)) != len(local):
        raise InvalidBlockIds("local_block_ids contains duplicates: each local block is written once")
    return remote, local


def _run_arrays(local_ids: Sequence[int], remote_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(local starts, remote starts, lengths) of maximal runs consecutive on both sides."""
    loc = np.asarray(local_ids, dtype=np.int64)
    rem = np.asarray(remote_ids, dtype=np.int64)
    if loc.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    # a run breaks wherever either side does not step by exactly one block
    breaks = np.flatnonzero((np.diff(loc) != 1) | (np.diff(rem) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [loc.size])))
    return loc[starts], rem[starts], lengths


def coalesce_runs(local_ids: Sequence[int], remote_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """Split paired block ids into maximal runs consecutive on both sides.

    Returns ``(local_start, remote_start, count)`` triples in request order.
    """
    ls, rs, n = _run_arrays(local_ids, remote_ids)
    return [(int(a), int(b), int(c)) for a, b, c in zip(ls, rs, n)]


def build_descriptors(
    local_regions: Sequence[Region],
    remote_regions: Sequence[Region],
    plan: SlicePlan,
    local_ids: Sequence[int],
    remote_ids: Sequence[int],
) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """Descriptor lists for one read, grouped by (local device, remote device).

    Each group is ``(local_mem, remote_mem, local Nx3, remote Nx3)`` (uint64) with rows
    ``(address, length, device_id)``, region by region in request order. A run of
    consecutive blocks becomes one descriptor when both regions are dense and whole
    blocks are read; otherwise each block is its own descriptor.
    """
    ls, rs, n = _run_arrays(local_ids, remote_ids)
    lids = np.asarray(local_ids, dtype=np.int64)
    rids = np.asarray(remote_ids, dtype=np.int64)
    groups: dict[tuple[str, str], tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for i, (lr, rr) in enumerate(zip(local_regions, remote_regions)):
        off, length = plan.offsets[i], plan.lengths[i]
        loc_parts, rem_parts = groups.setdefault((lr.device, rr.device), ([], []))
        merge = lr.dense and rr.dense and off == 0 and length == lr.block_len == rr.block_len
        if merge:
            l_addr, r_addr, lens = lr.base + ls * lr.block_stride, rr.base + rs * rr.block_stride, n * length
        else:
            l_addr, r_addr = lr.base + lids * lr.block_stride, rr.base + rids * rr.block_stride + off
            lens = np.full(lids.size, length, dtype=np.int64)
        loc_parts.append(np.column_stack((l_addr, lens, np.full(lens.size, lr.device_id))).astype(np.uint64))
        rem_parts.append(np.column_stack((r_addr, lens, np.full(lens.size, rr.device_id))).astype(np.uint64))
    return [
        (lm, rm, np.concatenate(loc).reshape(-1, 3), np.concatenate(rem).reshape(-1, 3))
        for (lm, rm), (loc, rem) in groups.items()
    ]
