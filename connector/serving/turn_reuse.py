"""Decode's KV reused by the next turn's prefill (issue 40, part 3): the router's half.

A P/D turn's decode leg asks the decode to hold the turn's blocks (``kv_params.hold_for_next_turn``); a
non-streamed answer carries the decode's offer (its produced params plus each held block's hash), which the
router keeps under the conversation's key (canary.py's ``conversation_key``: the client's session id,
``prompt_cache_key`` or ``user``, else the first turn). The conversation's next turn takes it (single use):
when it goes P/D and the offer holds at least ``decode_reuse_min_tokens`` tokens with lease time left, the
prefill leg carries it (``kv_params.reuse_request``) and the prefill pulls the blocks its prompt starts with;
otherwise (decode alone, too few tokens, a newer offer for the same conversation, the table full) the router
releases the hold at the decode with the lease release every unread lease gets (lease_release.py), so the
decode's blocks return at once instead of at the lease's end. Streamed answers carry no params (vLLM returns
them only whole): such turns are not asked to hold.

Pure: ``usable`` (the decision) and ``Offers`` (the bounded table); the I/O is the pipeline's and the decode
leg's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdfleet.contract.kv_params import lease_deadline, reuse_offer, reuse_offer_tokens

# Conversations whose last turn's offer the router keeps; past it the oldest offer is released.
MAX_CONVERSATIONS = 4096

UNUSED_DECODE_ALONE = "decode_alone"
UNUSED_TOO_FEW_TOKENS = "too_few_tokens"
UNUSED_LEASE_SHORT = "lease_short"
UNUSED_REPLACED = "replaced"
UNUSED_EVICTED = "evicted"


@dataclass(frozen=True)
class Offer:
    """A decode's offer for a conversation's next turn, as the router received it."""

    url: str  # the decode that holds the blocks (releases go there)
    params: dict[str, Any]
    received_at: float  # monotonic


def usable(offer: Offer, *, now: float, min_tokens: int, block_size: int, margin_s: float) -> str | None:
    """None when the next P/D turn's prefill should get ``offer``; else why not (the hold is released)."""
    if reuse_offer_tokens(offer.params, block_size) < max(min_tokens, 1):
        return UNUSED_TOO_FEW_TOKENS
    try:
        deadline = lease_deadline(offer.params, offer.received_at)
    except ValueError:  # a version this router cannot read
        deadline = None
    if deadline is None or deadline - now <= margin_s:
        return UNUSED_LEASE_SHORT
    return None


class Offers:
    """The last turn's offer per conversation key, at most ``limit`` (oldest out first)."""

    def __init__(self, limit: int = MAX_CONVERSATIONS) -> None:
        self.limit = limit
        self._by_key: OrderedDict[str, Offer] = OrderedDict()

    def remember(self, key: str, offer: Offer) -> list[tuple[Offer, str]]:
        """Keep ``offer`` for ``key``; returns the offers it pushes out, with why (to release)."""
        out = []
        old = self._by_key.pop(key, None)
        if old is not None:
            out.append((old, UNUSED_REPLACED))
        self._by_key[key] = offer
        while len(self._by_key) > self.limit:
            _, evicted = self._by_key.popitem(last=False)
            out.append((evicted, UNUSED_EVICTED))
        return out

    def take(self, key: str) -> Offer | None:
        """The offer for ``key``, removed (each offer serves one turn)."""
        return self._by_key.pop(key, None)

    def __len__(self) -> int:
        return len(self._by_key)


def offer_of(answer_params: Any) -> dict[str, Any] | None:
    """A decode answer's ``kv_transfer_params`` if they are a reuse offer (lenient)."""
    return dict(answer_params) if reuse_offer(answer_params) and isinstance(answer_params, Mapping) else None
