"""KV memory description and the pure planning of reads.

Everything here is pure (no NIXL, no sockets) so it can be table-tested:

- ``Region`` / ``KVLayout``: what a worker registers and what both sides must agree on.
- ``plan_slice``: from the reader's and the source's layouts (learned in the
  handshake), which bytes of each source block the reader copies (whole block, or
  its head slice for heterogeneous TP), or a clear ``IncompatibleLayout`` reason.
- Block ids checked and descriptors built from them: ``descriptors.py``.
- ``registration_spans``: what to register with NIXL: each backing allocation once,
  not each region (a per-layer view) inside it.
- ``choose_kv_cache_layout``: which physical KV cache layout a connector asks vLLM for.

Physical layouts are vLLM's ``KVCacheLayout`` names: the order in memory of the
logical axes L (layer), B (block), H (KV head), N (token in block), C (content).
Layer-outermost ``LBHNC`` gives one region per layer view (a block of a layer is a
page); block-outermost ``BLHNC`` / ``BHLNC`` give one region per backing allocation
whose block is the page of *all* layers, so a run of consecutive blocks is one
descriptor. ``BHLNC`` keeps a KV head's bytes of all layers together, so a decode
rank's head slice of a block is one contiguous range (heterogeneous TP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


__all__ = [
    "Region",
    "KVLayout",
    "SlicePlan",
    "IncompatibleLayout",
    "InvalidBlockIds",
    "plan_slice",
    "remote_rank_for",
    "MEMORY_TYPES",
    "KV_LAYOUTS",
    "KV_CACHE_LAYOUTS",
    "BLOCK_OUTERMOST_LAYOUTS",
    "HEAD_SLICEABLE_LAYOUTS",
    "Span",
    "registration_spans",
    "LayoutChoice",
    "choose_kv_cache_layout",
]

MEMORY_TYPES = ("DRAM", "VRAM")
KV_LAYOUTS = ("NHD", "HND")
# vLLM 0.32's KVCacheLayout names (vllm/v1/kv_cache_layout.py); kept as strings here.
KV_CACHE_LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
BLOCK_OUTERMOST_LAYOUTS = ("BLHNC", "BLNHC", "BHLNC")
# Layouts whose region block is head-major, so 1/k of the heads is one contiguous slice.
HEAD_SLICEABLE_LAYOUTS = ("LBHNC", "BHLNC")
# What the connector asks for, most preferred first (see choose_kv_cache_layout).
LAYOUT_PREFERENCE = ("BHLNC", "BLHNC")
LAYOUT_FALLBACK = "LBHNC"


class IncompatibleLayout(ValueError):
    """The two sides' KV layouts cannot be read from one another; the message says why."""


class InvalidBlockIds(ValueError):
    """Block ids of a request are malformed; the message names the field and what is allowed."""


@dataclass(frozen=True)
class Region:
    """One registered memory region, e.g. one layer's K (or V) cache.

    Block ``i`` lives at ``base + i * block_stride`` and its KV bytes are the first
    ``block_len`` bytes there.
    """

    base: int
    num_blocks: int
    block_stride: int
    block_len: int
    device: str = "DRAM"
    device_id: int = 0

    def __post_init__(self) -> None:
        for name in ("base", "num_blocks", "block_stride", "block_len", "device_id"):
            value = getattr(self, name)
            if type(value) is not int:
                raise ValueError(f"Region.{name} must be an int, got {type(value).__name__}")
        if self.base <= 0:
            raise ValueError(f"Region.base must be a positive address, got {self.base}")
        if self.num_blocks <= 0:
            raise ValueError(f"Region.num_blocks must be > 0, got {self.num_blocks}")
        if self.block_len <= 0:
            raise ValueError(f"Region.block_len must be > 0, got {self.block_len}")
        if self.block_stride < self.block_len:
            raise ValueError(
                f"Region.block_stride ({self.block_stride}) must be >= block_len ({self.block_len})"
            )
        if self.device not in MEMORY_TYPES:
            raise ValueError(f"Region.device must be one of {MEMORY_TYPES}, got {self.device!r}")
        if self.device_id < 0:
            raise ValueError(f"Region.device_id must be >= 0, got {self.device_id}")

    @property
    def nbytes(self) -> int:
        """Bytes spanned by the region (what gets registered)."""
        return (self.num_blocks - 1) * self.block_stride + self.block_len

    @property
    def dense(self) -> bool:
        """True when consecutive blocks touch, so a run of blocks is one contiguous range."""
        return self.block_stride == self.block_len


@dataclass(frozen=True)
class KVLayout:
    """What both sides must agree on; travels in the handshake."""

    block_size: int  # tokens per block
    dtype: str
    layout: str  # "NHD" or "HND" (head-major inside a block; needed for TP slices)
    num_kv_heads: int  # per rank
    head_dim: int
    tp_rank: int
    tp_size: int
    is_mla: bool = False  # MLA caches are replicated across ranks: read whole blocks
    # Physical layout of the KV cache (vLLM KVCacheLayout name). Peers must agree: a
    # mismatch is refused in the handshake. Old peers do not send it: they are LBHNC.
    kv_cache_layout: str = "LBHNC"

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_heads", "head_dim", "tp_rank", "tp_size"):
            value = getattr(self, name)
            if type(value) is not int:
                raise ValueError(f"KVLayout.{name} must be an int, got {type(value).__name__}")
        for name in ("block_size", "num_kv_heads", "head_dim", "tp_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVLayout.{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(
                f"KVLayout.tp_rank must be in [0, tp_size={self.tp_size}), got {self.tp_rank}"
            )
        if self.layout not in KV_LAYOUTS:
            raise ValueError(f"KVLayout.layout must be one of {KV_LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.dtype, str) or not self.dtype:
            raise ValueError("KVLayout.dtype must be a non-empty string")
        if type(self.is_mla) is not bool:
            raise ValueError("KVLayout.is_mla must be a bool")
        if self.kv_cache_layout not in KV_CACHE_LAYOUTS:
            raise ValueError(
                f"KVLayout.kv_cache_layout must be one of {KV_CACHE_LAYOUTS}, got {self.kv_cache_layout!r}"
            )


@dataclass(frozen=True)
class SlicePlan:
    """Which part of each source block a reader copies.

    ``offset``/``length`` are per region (bytes inside a source block). ``readers``
    is how many reader ranks read each source rank (k = reader TP / source TP) and
    ``reader_index`` which one this reader is; the source frees a request's blocks
    once all ``readers`` have reported completion.
    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    readers: int
    reader_index: int

    @property
    def whole_blocks(self) -> bool:
        return all(o == 0 for o in self.offsets)


def remote_rank_for(local: KVLayout, remote_tp_size: int) -> int:
    """Source rank a reader rank reads: reader TP must be k x source TP; rank r reads r // k."""
    if type(remote_tp_size) is not int or remote_tp_size <= 0:
        raise IncompatibleLayout(f"remote tp_size must be a positive int, got {remote_tp_size!r}")
    if local.tp_size % remote_tp_size != 0:
        raise IncompatibleLayout(
            f"decode tp_size {local.tp_size} is not a multiple of prefill tp_size {remote_tp_size}"
            " (only decode TP = k x prefill TP is supported)"
        )
    return local.tp_rank // (local.tp_size // remote_tp_size)


def plan_slice(
    local: KVLayout,
    local_regions: Sequence[Region],
    remote: KVLayout,
    remote_regions: Sequence[Region],
) -> SlicePlan:
    """Decide how the reader (``local``) copies blocks of the source (``remote``).

    Raises ``IncompatibleLayout`` with the reason when the two cannot work together.
    Physical layouts must match: regions mean different things under layer-outermost
    and block-outermost layouts, so a mismatch is refused rather than read per layer.
    """
    if local.kv_cache_layout != remote.kv_cache_layout:
        raise IncompatibleLayout(
            f"KVLayout.kv_cache_layout differs: decode {local.kv_cache_layout!r}, prefill"
            f" {remote.kv_cache_layout!r}; both engines must resolve the same physical KV cache"
            " layout (same attention backend, same VLLM_KV_CACHE_LAYOUT if set)"
        )
    for field in ("block_size", "dtype", "head_dim", "is_mla"):
        a, b = getattr(local, field), getattr(remote, field)
        if a != b:
            raise IncompatibleLayout(f"KVLayout.{field} differs: decode {a!r}, prefill {b!r}")
    expected_rank = remote_rank_for(local, remote.tp_size)
    if remote.tp_rank != expected_rank:
        raise IncompatibleLayout(
            f"decode rank {local.tp_rank}/{local.tp_size} must read prefill rank {expected_rank},"
            f" but the peer is rank {remote.tp_rank}/{remote.tp_size}"
        )
    if len(local_regions) != len(remote_regions):
        raise IncompatibleLayout(
            f"region count differs: decode {len(local_regions)}, prefill {len(remote_regions)}"
        )
    k = local.tp_size // remote.tp_size
    index = local.tp_rank % k
    offsets: list[int] = []
    lengths: list[int] = []
    if local.is_mla or k == 1:
        if not local.is_mla and local.num_kv_heads != remote.num_kv_heads:
            raise IncompatibleLayout(
                f"KVLayout.num_kv_heads differs at equal TP: decode {local.num_kv_heads},"
                f" prefill {remote.num_kv_heads}"
            )
        for i, (lr, rr) in enumerate(zip(local_regions, remote_regions)):
            if lr.block_len != rr.block_len:
                raise IncompatibleLayout(
                    f"region {i}: block_len differs: decode {lr.block_len}, prefill {rr.block_len}"
                )
            offsets.append(0)
            lengths.append(lr.block_len)
        return SlicePlan(tuple(offsets), tuple(lengths), k, index)
    # Heterogeneous TP: the reader holds 1/k of the source's heads; with a head-major
    # (HND) block that is one contiguous slice per block.
    if local.kv_cache_layout not in HEAD_SLICEABLE_LAYOUTS:
        raise IncompatibleLayout(
            f"decode TP {local.tp_size} != prefill TP {remote.tp_size} needs a physical layout in"
            f" {HEAD_SLICEABLE_LAYOUTS} (a rank's heads are one contiguous slice of a block);"
            f" both engines use {local.kv_cache_layout!r}"
        )
    if local.layout != "HND" or remote.layout != "HND":
        raise IncompatibleLayout(
            f"decode TP {local.tp_size} != prefill TP {remote.tp_size} needs layout 'HND' on both"
            f" sides (decode {local.layout!r}, prefill {remote.layout!r})"
        )
    if remote.num_kv_heads != local.num_kv_heads * k:
        raise IncompatibleLayout(
            f"prefill has {remote.num_kv_heads} KV heads per rank, decode {local.num_kv_heads}:"
            f" expected prefill = decode x {k} (replicated KV heads are not supported)"
        )
    for i, (lr, rr) in enumerate(zip(local_regions, remote_regions)):
        if rr.block_len != lr.block_len * k:
            raise IncompatibleLayout(
                f"region {i}: prefill block_len {rr.block_len} != decode block_len"
                f" {lr.block_len} x {k}"
            )
        offsets.append(index * lr.block_len)
        lengths.append(lr.block_len)
    return SlicePlan(tuple(offsets), tuple(lengths), k, index)


@dataclass(frozen=True)
class Span:
    """One range of memory registered with NIXL (a backing allocation)."""

    base: int
    nbytes: int
    device: str = "DRAM"
    device_id: int = 0

    def __post_init__(self) -> None:
        for name in ("base", "nbytes", "device_id"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"Span.{name} must be an int, got {type(getattr(self, name)).__name__}")
        if self.base <= 0 or self.nbytes <= 0:
            raise ValueError(f"Span needs a positive base and size, got base={self.base} nbytes={self.nbytes}")
        if self.device not in MEMORY_TYPES:
            raise ValueError(f"Span.device must be one of {MEMORY_TYPES}, got {self.device!r}")

    def holds(self, r: Region) -> bool:
        return (
            r.device == self.device and r.device_id == self.device_id
            and self.base <= r.base and r.base + r.nbytes <= self.base + self.nbytes
        )


def registration_spans(regions: Sequence[Region], backing: Sequence[Span] | None = None) -> list[Span]:
    """The memory to register: each backing allocation once, not each region inside it.

    With ``backing`` (the allocations the regions are views of), every region must lie
    inside one of them; the allocations that hold a region are returned once each, in
    order. Without it, regions whose spans overlap are merged (regions that merely touch
    are not: they may be separate allocations, which CUDA IPC cannot register as one).
    """
    if backing is not None:
        used: list[Span] = []
        for i, r in enumerate(regions):
            owner = next((b for b in backing if b.holds(r)), None)
            if owner is None:
                raise ValueError(
                    f"region {i} ({r.device} {r.base:#x}+{r.nbytes}) lies in none of the"
                    f" {len(backing)} backing allocation(s)"
                )
            if owner not in used:
                used.append(owner)
        return used
    out: list[Span] = []
    key = lambda r: (r.device, r.device_id, r.base)  # noqa: E731
    for r in sorted(regions, key=key):
        last = out[-1] if out else None
        if last is not None and last.device == r.device and last.device_id == r.device_id \
                and r.base < last.base + last.nbytes:
            end = max(last.base + last.nbytes, r.base + r.nbytes)
            out[-1] = Span(last.base, end - last.base, last.device, last.device_id)
        else:
            out.append(Span(r.base, r.nbytes, r.device, r.device_id))
    return out


@dataclass(frozen=True)
class LayoutChoice:
    """The physical KV cache layout to ask vLLM for, and why (logged by the caller)."""

    layout: str
    fallback: bool  # not a block-outermost layout: pulls post one descriptor per layer and run
    reason: str


def choose_kv_cache_layout(supported: Sequence[str] | None, *, kernel_split: str = "") -> LayoutChoice:
    """Which KV cache layout the connector asks for, given what the attention backends accept.

    ``supported``: the layouts every attention backend of the engine accepts (vLLM's
    ``supported_kv_cache_layouts``, intersected), or None when none declares a
    restriction (any layout works). Block-outermost first: ``BHLNC`` (a block is one
    page of all layers, heads outermost inside it, so heterogeneous TP is one slice per
    block), else ``BLHNC``; else the explicit fallback ``LBHNC`` (layer-outermost: one
    descriptor per layer and block run), else the backends' own first choice.

    ``kernel_split``: non-empty (the reason) when the backend will split each block into
    smaller kernel blocks; vLLM then needs dense per-layer pages, which block-outermost
    layouts are not (it refuses to allocate), so the choice falls back to layer-outermost.
    """
    if kernel_split:
        names = list(KV_CACHE_LAYOUTS) if supported is None else [str(s) for s in supported]
        layer_outer = [n for n in names if n not in BLOCK_OUTERMOST_LAYOUTS]
        pick = LAYOUT_FALLBACK if LAYOUT_FALLBACK in layer_outer else (layer_outer[0] if layer_outer else "")
        if not pick:
            raise ValueError(f"{kernel_split}, and the attention backends accept only block-outermost {names}")
        return LayoutChoice(pick, True, f"{kernel_split}: block-outermost pages cannot be split into kernel"
                                        f" blocks, falling back to {pick} (one descriptor per layer and block run)")
    if supported is None:
        return LayoutChoice(LAYOUT_PREFERENCE[0], False, "the attention backends accept any layout")
    names = [str(s) for s in supported]
    unknown = [n for n in names if n not in KV_CACHE_LAYOUTS]
    if unknown:
        raise ValueError(f"unknown KV cache layout(s) {unknown}; known: {KV_CACHE_LAYOUTS}")
    if not names:
        raise ValueError("the attention backends accept no KV cache layout")
    for want in LAYOUT_PREFERENCE:
        if want in names:
            return LayoutChoice(want, False, f"the attention backends accept {names}")
    if LAYOUT_FALLBACK in names:
        return LayoutChoice(
            LAYOUT_FALLBACK, True,
            f"the attention backends accept only {names}: no block-outermost layout, falling back"
            f" to {LAYOUT_FALLBACK} (one descriptor per layer and block run)",
        )
    return LayoutChoice(
        names[0], True,
        f"the attention backends accept only {names}: neither a block-outermost layout nor"
        f" {LAYOUT_FALLBACK}; using their first choice {names[0]} (per-layer reads, no heterogeneous TP)",
    )
