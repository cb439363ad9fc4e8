"""Pure endpoint logic: which revision serves, and which endpoint takes a leg.

Nothing here does I/O, so every rule is table-tested in tests/unit/router.

A *revision* groups the prefill and decode endpoints built from one fleet
template (label ``pdfleet.io/revision``). KV caches only move between engines
of the same revision, so both legs of a request always come from one group.

Which revision serves is the operator's to say: it labels the engine Services of
the serving revision ``pdfleet.io/serving=true`` (Kubernetes copies the label onto
their EndpointSlices). The one rule, in ``select_revision``:

1. the revision labelled serving, while it has a ready prefill and a ready decode
   endpoint (if the label is briefly on two revisions during a switch, the newer);
2. otherwise (the serving revision has no ready prefill or no ready decode, or no
   revision is labelled: static endpoints, or an operator from before the label) the
   newest revision that has both; the reason says which case it is;
3. none has both: no revision, and requests get 503.

Rule 2 is what a router did before the label existed, so an outage of the serving
revision's pods during a drain still serves from the revision being drained.

A canary (issue 22): the operator labels the engine Services of the new revision
``pdfleet.io/canary-weight=<percent>``. Beside the revision chosen above, the newest other
revision that is serviceable, not labelled serving and has a weight above 0 is the canary;
canary.py decides per request which of the two takes it (both legs on that one). A canary
without a ready prefill and a ready decode takes nothing: its share goes to the serving pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pdfleet.contract import kv_params
from pdfleet.contract.labels import ROLE_DECODE, ROLE_PREFILL

PREFILL = ROLE_PREFILL
DECODE = ROLE_DECODE
ROLES = (PREFILL, DECODE)


@dataclass(frozen=True)
class Endpoint:
    """One engine's OpenAI-compatible HTTP base URL, e.g. ``http://10.0.0.7:8000``."""

    url: str
    ready: bool = True
    kv_events: str | None = None  # the engine's KV event PUB endpoint (e.g. tcp://10.0.0.7:5557), if any
    kv_events_replay: str | None = None  # its replay ROUTER endpoint, if any


@dataclass(frozen=True)
class RevisionEndpoints:
    """The endpoints of one revision. ``created`` orders revisions (larger is newer)."""

    revision: str
    prefill: tuple[Endpoint, ...] = ()
    decode: tuple[Endpoint, ...] = ()
    created: float = 0.0
    serving: bool = False  # labelled serving by the operator
    canary_weight: int | None = None  # percent of new requests, when labelled a canary by the operator

    def ready(self, role: str) -> tuple[str, ...]:
        endpoints = self.prefill if role == PREFILL else self.decode
        return tuple(e.url for e in endpoints if e.ready)

    @property
    def serviceable(self) -> bool:
        return bool(self.ready(PREFILL)) and bool(self.ready(DECODE))


@dataclass(frozen=True)
class Selection:
    """The revision the router uses now, and why (for /health and logs)."""

    revision: RevisionEndpoints | None
    reason: str
    canary: RevisionEndpoints | None = None  # takes canary_weight percent of new requests
    canary_weight: int = 0


def select_revision(groups: Iterable[RevisionEndpoints]) -> Selection:
    """Pick the revision that serves new requests and the canary beside it, if any (the rules
    in this module's docstring). Ties on ``created`` break on the revision name so that every
    router replica picks the same one."""
    groups = list(groups)
    chosen = _select_serving(groups)
    if chosen.revision is None:
        return chosen
    canaries = [g for g in groups if g.serviceable and not g.serving and (g.canary_weight or 0) > 0
                and g.revision != chosen.revision.revision]
    if not canaries:
        return chosen
    canary = max(canaries, key=lambda g: (g.created, g.revision))
    weight = min(100, canary.canary_weight or 0)
    return Selection(chosen.revision, f"{chosen.reason}; canary {canary.revision} at {weight}%", canary, weight)


def _select_serving(groups: list[RevisionEndpoints]) -> Selection:
    groups = list(groups)
    candidates = [g for g in groups if g.serviceable]
    newest = lambda gs: max(gs, key=lambda g: (g.created, g.revision))  # noqa: E731
    marked = [g for g in candidates if g.serving]
    if marked:
        return Selection(newest(marked), "labelled serving")
    if not candidates:
        return Selection(None, "no revision has a ready prefill and a ready decode endpoint")
    labelled = sorted(g.revision for g in groups if g.serving)
    if labelled:
        return Selection(newest(candidates), f"serving revision {', '.join(labelled)} has no ready prefill and"
                                             " decode endpoint; newest serviceable")
    return Selection(newest(candidates), "no revision labelled serving; newest serviceable")


@dataclass
class Outstanding:
    """Requests in flight per endpoint URL (mutable; owned by one event loop)."""

    counts: dict[str, int] = field(default_factory=dict)

    def acquire(self, url: str) -> None:
        self.counts[url] = self.counts.get(url, 0) + 1

    def release(self, url: str) -> None:
        left = self.counts.get(url, 0) - 1
        if left > 0:
            self.counts[url] = left
        else:
            self.counts.pop(url, None)


def lease_allows_reuse(kv_transfer_params: Mapping[str, object] | None, now: float, margin_s: float, *,
                       received_at: float, wall_at_receipt: float | None = None) -> bool:
    """Whether prefill's KV blocks may still be read by another decode.

    Times are the router's monotonic clock: ``received_at`` when the prefill's response arrived,
    ``now``. The lease ends at the contract's ``lease_deadline`` (1.3: ``received_at`` + the
    params' lease seconds; older params: their unix expiry converted with ``wall_at_receipt``, the
    router's wall clock at that moment). That is an upper bound (the params were on their way for
    a while); ``margin_s`` covers it, and a reuse that comes too late is still safe: the decode's
    pull needs the prefill's ack and recomputes without it. Without a readable lease, or params of
    a version this router cannot read, the router cannot know, so it does not reuse them (a
    decode-only retry recomputes instead).
    """
    try:
        deadline = kv_params.lease_deadline(kv_transfer_params, received_at, wall_at_receipt)
    except kv_params.UnsupportedVersion:
        return False
    return deadline is not None and deadline - now >= margin_s
