"""Prepared NIXL descriptor lists: built once, then each pull is a list of block indices.

Pure (no NIXL): what to prepare and which indices a pull reads, so it can be table-tested.

A prepared list holds, per region, one strided row ``(address, length, device_id, stride,
count)`` that NIXL expands into ``count`` per-block entries (``prep_xfer_dlist`` with an Nx5
array): the local list once per sink (``local_rows``), the remote list once per peer at
handshake (``remote_rows``, with the reader's head-slice offset and length), and the READs
a pull posts (``read_groups``). A pull then names, per region, the flat index of each block
on both sides (``pull_indices``), and
``make_prepped_xfer`` merges indices consecutive on both sides into one descriptor where
both rows are dense with equal strides. That is the rule of ``descriptors.build_descriptors``,
so the descriptors NIXL posts are as many as its rows.

Each list holds one memory type; regions are grouped by type, and a pull reads one group
per (local type, remote type) pair, in the order ``build_descriptors`` uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pdfleet.connector.transfer.layout import Region, SlicePlan

__all__ = ["PrepRows", "local_rows", "remote_rows", "ReadGroup", "read_groups", "PullIndices", "pull_indices"]

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PrepRows:
    """What to prepare for one side: per memory type an Nx5 uint64 array of strided rows, and
    per region (in region order) its memory type, the flat index of its block 0 in that
    type's list, and the length and stride of its row."""

    rows: dict[str, np.ndarray]
    region_mem: tuple[str, ...]
    region_base: tuple[int, ...]
    region_len: tuple[int, ...]
    region_stride: tuple[int, ...]


def _rows(regions: Sequence[Region], offsets: Sequence[int], lengths: Sequence[int]) -> PrepRows:
    per_mem: dict[str, list[tuple[int, int, int, int, int]]] = {}
    flat: dict[str, int] = {}
    bases: list[int] = []
    for r, off, length in zip(regions, offsets, lengths):
        if off < 0 or length <= 0 or off + length > r.block_len:
            raise ValueError(f"slice {off}+{length} does not fit a block of {r.block_len} bytes")
        per_mem.setdefault(r.device, []).append((r.base + off, length, r.device_id, r.block_stride, r.num_blocks))
        bases.append(flat.get(r.device, 0))
        flat[r.device] = flat.get(r.device, 0) + r.num_blocks
        if flat[r.device] > _INT32_MAX:
            raise ValueError(f"{flat[r.device]} {r.device} blocks exceed NIXL's int32 indices")
    return PrepRows({m: np.array(v, dtype=np.uint64).reshape(-1, 5) for m, v in per_mem.items()},
                    tuple(r.device for r in regions), tuple(bases), tuple(int(n) for n in lengths),
                    tuple(r.block_stride for r in regions))


def local_rows(regions: Sequence[Region]) -> PrepRows:
    """The sink's own regions, whole blocks (a reader always writes whole local blocks)."""
    return _rows(regions, [0] * len(regions), [r.block_len for r in regions])


def remote_rows(regions: Sequence[Region], plan: SlicePlan) -> PrepRows:
    """A peer's regions as this reader reads them: the plan's offset and length in each block."""
    if len(plan.offsets) != len(regions):
        raise ValueError(f"the plan covers {len(plan.offsets)} regions, the peer has {len(regions)}")
    return _rows(regions, plan.offsets, plan.lengths)


@dataclass(frozen=True)
class PullIndices:
    """One READ of a pull: its memory types, the paired int32 indices into the two lists, and
    what NIXL will post for them (descriptors after merging, bytes)."""

    local_mem: str
    remote_mem: str
    local: np.ndarray
    remote: np.ndarray
    descriptors: int
    nbytes: int


@dataclass(frozen=True)
class ReadGroup:
    """The regions one READ covers (one (local type, remote type) pair), fixed per peer."""

    local_mem: str
    remote_mem: str
    local_base: np.ndarray  # (regions, 1) int64: flat index of each region's block 0
    remote_base: np.ndarray
    merged: int  # regions whose consecutive blocks NIXL merges into one descriptor
    single: int  # regions read one descriptor per block
    block_bytes: int  # bytes read per block id, summed over the regions


def read_groups(local: PrepRows, remote: PrepRows) -> list[ReadGroup]:
    """Group the regions by (local type, remote type) in order of first region (the grouping
    of ``descriptors.build_descriptors``); computed once per peer, so a pull only adds block ids.

    ``make_prepped_xfer`` merges indices consecutive on both sides into one descriptor when
    the local row is dense (stride == length) and both rows have the same stride: whole
    blocks of dense regions of one block size. Then a run of blocks is one descriptor,
    otherwise every block is, as in ``build_descriptors``."""
    n = len(local.region_mem)
    if n != len(remote.region_mem):
        raise ValueError(f"region count differs: local {n}, remote {len(remote.region_mem)}")
    for i in range(n):
        if local.region_len[i] != remote.region_len[i]:
            raise ValueError(f"region {i}: local reads {local.region_len[i]} bytes per block,"
                             f" remote {remote.region_len[i]}")
    pairs: dict[tuple[str, str], list[int]] = {}
    for i in range(n):
        pairs.setdefault((local.region_mem[i], remote.region_mem[i]), []).append(i)
    out = []
    for (lm, rm), regs in pairs.items():
        merged = sum(1 for i in regs if local.region_stride[i] == local.region_len[i] == remote.region_stride[i])
        out.append(ReadGroup(
            lm, rm,
            np.asarray([local.region_base[i] for i in regs], dtype=np.int64).reshape(-1, 1),
            np.asarray([remote.region_base[i] for i in regs], dtype=np.int64).reshape(-1, 1),
            merged, len(regs) - merged, sum(local.region_len[i] for i in regs),
        ))
    return out


def pull_indices(groups: Sequence[ReadGroup], local_ids: Sequence[int], remote_ids: Sequence[int]) -> list[PullIndices]:
    """The READs of one pull: per group, region by region, the block ids in request order."""
    if len(local_ids) != len(remote_ids):
        raise ValueError(f"{len(local_ids)} local block ids but {len(remote_ids)} remote ones")
    lids = np.asarray(local_ids, dtype=np.int64)
    rids = np.asarray(remote_ids, dtype=np.int64)
    # runs consecutive on both sides (descriptors.coalesce_runs); a run never leaves its region
    runs = int(np.count_nonzero((np.diff(lids) != 1) | (np.diff(rids) != 1))) + 1 if lids.size else 0
    return [
        PullIndices(g.local_mem, g.remote_mem, (g.local_base + lids).reshape(-1).astype(np.int32),
                    (g.remote_base + rids).reshape(-1).astype(np.int32),
                    g.merged * runs + g.single * lids.size, g.block_bytes * lids.size)
        for g in groups
    ]
