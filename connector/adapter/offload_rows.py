"""Which engine KV blocks go to which host rows in one offload transfer (pure).

vLLM's OffloadingConnector describes a transfer as the engine's block ids (``GPULoadStoreSpec``: per
KV cache group a run of ``group_sizes[g]`` blocks, the first being block ``block_indices[g]`` of the
request) and the host chunks (``CPULoadStoreSpec``: chunk ids, per group in the same order). A chunk
holds ``blocks_per_chunk`` engine blocks; a group's first chunk may start before its first block
(``block_indices[g] % blocks_per_chunk`` blocks are skipped) and its last may end after its last. pdfleet's
host tier keeps chunk c's j-th block in host row ``c * blocks_per_chunk + j`` of each KV tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GroupRows", "copy_rows"]


@dataclass(frozen=True)
class GroupRows:
    group: int
    engine_blocks: tuple[int, ...]
    host_rows: tuple[int, ...]  # same length and order as engine_blocks


def copy_rows(engine_blocks: Sequence[int], group_sizes: Sequence[int], block_indices: Sequence[int],
              chunk_ids: Sequence[int], blocks_per_chunk: int) -> list[GroupRows]:
    """Per KV cache group with blocks to move: its engine blocks and the host rows they pair with.
    ValueError when the two sides do not describe the same blocks (vLLM asserts the same)."""
    if blocks_per_chunk < 1 or len(group_sizes) != len(block_indices):
        raise ValueError(f"blocks_per_chunk {blocks_per_chunk}, {len(group_sizes)} group sizes and"
                         f" {len(block_indices)} block indices")
    if sum(group_sizes) != len(engine_blocks):
        raise ValueError(f"group sizes {list(group_sizes)} do not add up to {len(engine_blocks)} engine blocks")
    out: list[GroupRows] = []
    block_at = chunk_at = 0
    for group, (size, first) in enumerate(zip(group_sizes, block_indices)):
        if size == 0:
            continue
        skip = first % blocks_per_chunk
        chunks = chunk_ids[chunk_at:chunk_at + -(-(size + skip) // blocks_per_chunk)]
        rows = [c * blocks_per_chunk + j for c in chunks for j in range(blocks_per_chunk)][skip:skip + size]
        if len(rows) != size:
            raise ValueError(f"group {group}: {size} blocks from block {first} need more than the"
                             f" {len(chunk_ids) - chunk_at} chunks left")
        out.append(GroupRows(group, tuple(engine_blocks[block_at:block_at + size]), tuple(rows)))
        block_at += size
        chunk_at += len(chunks)
    if chunk_at != len(chunk_ids):
        raise ValueError(f"{len(chunk_ids)} chunks for {chunk_at} chunks' worth of blocks")
    return out
