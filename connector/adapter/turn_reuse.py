"""Decode's KV reused by the next turn's prefill (issue 40, part 3): the decisions, pure.

- a prefill pulls the longest prefix of the decode's held blocks whose hashes equal its own prompt's
  (``matched_blocks``; vLLM's prefix-caching hashes chain each block to all before it, so equal hashes
  at block i mean equal tokens up to the end of block i), less what it has cached itself, and only when
  that is at least the router's threshold (``tokens_to_pull``; below it recomputing is cheaper);
- a decode keeps at most ``HOLD_SHARE`` of its KV blocks held for next turns; over that it releases
  its oldest holds first (``holds_to_release``): a turn's blocks are worth less the longer they wait.
"""

from __future__ import annotations

from collections.abc import Sequence

# The share of a decode's KV blocks it may keep held for conversations' next turns.
HOLD_SHARE = 0.5


def matched_blocks(held: Sequence[bytes], own: Sequence[bytes]) -> int:
    """How many leading blocks the decode's held hashes and the prefill's own prompt hashes share."""
    n = 0
    for a, b in zip(held, own):
        if a != b:
            break
        n += 1
    return n


def tokens_to_pull(matched: int, *, block_size: int, num_prompt_tokens: int, num_computed_tokens: int,
                   min_tokens: int) -> int:
    """Tokens the prefill loads from the decode: the matched full blocks inside the prompt past what it
    computed itself; 0 when that is below ``min_tokens`` (or nothing)."""
    if block_size <= 0 or matched <= 0:
        return 0
    usable = min(matched, num_prompt_tokens // block_size) * block_size
    pull = usable - num_computed_tokens
    return pull if pull > 0 and pull >= min_tokens else 0


def hold_budget(num_blocks: int, share: float = HOLD_SHARE) -> int:
    """Blocks a decode of ``num_blocks`` may keep held for next turns."""
    return max(0, int(num_blocks * share))


def holds_to_release(holds: Sequence[tuple[str, int]], budget: int) -> tuple[str, ...]:
    """``holds``: (request id, blocks) oldest first. The ids to release, oldest first, so that what stays
    held fits ``budget``."""
    total = sum(n for _, n in holds)
    out = []
    for rid, n in holds:
        if total <= budget:
            break
        out.append(rid)
        total -= n
    return tuple(out)
