"""Decode's KV reused by the next turn's prefill (issue 40, part 3): the router's half.

A P/D turn's decode leg asks the decode to hold the turn's blocks (``kv_params.hold_for_next_turn``); a
non-streamed answer carries the decode's offer (its produced params plus each held block's hash), which the
router keeps under the conversation's key (canary.py's ``explicit_key``: the client's session id,
``prompt_cache_key`` or ``user``; never the first-turn fallback, see Pipeline.conversation). The conversation's
next turn takes it (single use):
when it goes P/D and the offer holds at least ``decode_reuse_min_tokens`` tokens with lease time left, the
prefill leg carries it (``kv_params.reuse_request``) and the prefill pulls the blocks its prompt starts with;
otherwise (decode alone, too few tokens, a newer offer for the same conversation, the table full) the router
releases the hold at the decode with the lease release every unread lease gets (lease_release.py), so the
decode's blocks return at once instead of at the lease's end. Streamed answers carry no params (vLLM returns
them only whole): such turns are not asked to hold.

Between turns every offer kept is kept alive (a lease, not a fixed TTL): every ``KEEP_ALIVE_FRACTION`` of
its lease the router asks the decode that holds it to extend the hold (``keep_alive_plan``: which offers
are due, batched per decode; keep_alive.py sends them). An offer the decode refuses, or whose lease ran out
before an answer, is dropped. A decode that needs the memory still ends its oldest holds first.

Pure: ``usable`` (the decision), ``keep_alive_plan`` and ``Offers`` (the bounded table); the I/O is the
pipeline's, the decode leg's and keep_alive.py's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pdfleet.contract.kv_params import (
    lease_deadline,
    lease_seconds,
    max_keep_alive_offers,
    reuse_offer,
    reuse_offer_tokens,
)

# Conversations whose last turn's offer the router keeps; past it the oldest offer is released.
MAX_CONVERSATIONS = 4096

UNUSED_DECODE_ALONE = "decode_alone"
UNUSED_TOO_FEW_TOKENS = "too_few_tokens"
UNUSED_LEASE_SHORT = "lease_short"
UNUSED_REPLACED = "replaced"
UNUSED_EVICTED = "evicted"

# An offer is kept alive once this share of its lease has passed since it was received or last kept:
# two more tries fit before the lease would end.
KEEP_ALIVE_FRACTION = 1 / 3


@dataclass(frozen=True)
class Offer:
    """A decode's offer for a conversation's next turn, as the router received it."""

    url: str  # the decode that holds the blocks (releases go there)
    params: dict[str, Any]
    received_at: float  # monotonic; since keep-alives: when the last one the decode accepted was sent
    model: str | None = None  # the client's model, for the one-token requests about this offer


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

    def items(self) -> list[tuple[str, Offer]]:
        return list(self._by_key.items())

    def kept(self, key: str, offer: Offer, sent_at: float) -> bool:
        """The decode extended ``offer``'s hold by its lease from at least ``sent_at``; False when the
        table no longer holds that offer for ``key`` (taken or replaced meanwhile)."""
        if self._by_key.get(key) is not offer:
            return False
        self._by_key[key] = replace(offer, received_at=sent_at)  # keeps its place: eviction stays by age
        return True

    def drop(self, key: str, offer: Offer) -> bool:
        """Forget ``offer`` (its hold is gone: refused or lapsed) if the table still holds it for ``key``."""
        if self._by_key.get(key) is not offer:
            return False
        del self._by_key[key]
        return True

    def __len__(self) -> int:
        return len(self._by_key)


def offer_of(answer_params: Any) -> dict[str, Any] | None:
    """A decode answer's ``kv_transfer_params`` if they are a reuse offer (lenient)."""
    return dict(answer_params) if reuse_offer(answer_params) and isinstance(answer_params, Mapping) else None


@dataclass
class KeepAlivePlan:
    """What to do with the offers kept now: per decode URL, the requests to send (each at most
    ``max_keep_alive_offers`` offers, oldest first; one request at a time per decode); the offers whose
    lease ended (dropped, nothing to send); when the next offer falls due (None: none waits)."""

    batches: dict[str, list[list[tuple[str, Offer]]]] = field(default_factory=dict)
    lapsed: list[tuple[str, Offer]] = field(default_factory=list)
    next_due: float | None = None


def keep_alive_plan(offers: Iterable[tuple[str, Offer]], *, now: float, busy: Collection[str] = (),
                    per_request: int = max_keep_alive_offers) -> KeepAlivePlan:
    """Which kept offers to keep alive at ``now``: those past ``KEEP_ALIVE_FRACTION`` of their lease since
    received (or last kept), batched per decode; decodes in ``busy`` (a keep-alive in flight) wait for it."""
    plan = KeepAlivePlan()
    due: dict[str, list[tuple[str, Offer]]] = {}
    for key, offer in offers:
        try:
            seconds = lease_seconds(offer.params)
        except ValueError:  # a version this router cannot read
            seconds = None
        if seconds is None or offer.received_at + seconds <= now:
            plan.lapsed.append((key, offer))
            continue
        if offer.url in busy:
            continue
        at = offer.received_at + seconds * KEEP_ALIVE_FRACTION
        if at <= now:
            due.setdefault(offer.url, []).append((key, offer))
        elif plan.next_due is None or at < plan.next_due:
            plan.next_due = at
    step = max(1, per_request)
    plan.batches = {url: [entries[i:i + step] for i in range(0, len(entries), step)] for url, entries in due.items()}
    return plan
