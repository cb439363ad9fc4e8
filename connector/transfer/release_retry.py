"""When a decode resends a lease release (pure).

Decode tells a prefill "I will not read these" (nothing to pull: the prompt was cached on decode;
params refused; a failed pull) so that the prefill frees the blocks now instead of at the end of
the lease. The params leave the prefill when its scheduler finishes the request, but its worker
holds the lease only at its next step; on a loaded machine decode's release can arrive first. The
source ignores a release for an id it does not hold yet (a release must never poison a later
hold: only a reader the lease was handed to may end it), so a release sent once could be lost and
the blocks held for a whole lease.

A release is therefore answered like a heartbeat: each id comes back as ``gone`` (released, or
ended otherwise), as held (``remaining``: the source keeps it; another reader has it), or as
neither (not held *yet*). Decode resends the release for the ids not held yet, and for all of
them when no answer came, with exponential backoff from ``first_delay`` to ``max_delay``, for at
most ``budget_seconds`` from the first send and ``max_sends`` sends; then the lease runs its
course, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from pdfleet.connector.transfer.retry import check_backoff

__all__ = ["ReleaseRetry", "ReleaseDecision", "release_retry", "unconfirmed"]


@dataclass(frozen=True)
class ReleaseRetry:
    budget_seconds: float = 15.0
    first_delay: float = 0.05
    max_delay: float = 1.0
    max_sends: int = 12

    def __post_init__(self) -> None:
        check_backoff(self, "budget_seconds", "first_delay", "max_delay")
        if not isinstance(self.max_sends, int) or isinstance(self.max_sends, bool) or self.max_sends < 1:
            raise ValueError(f"ReleaseRetry.max_sends must be an int >= 1, got {self.max_sends!r}")


@dataclass(frozen=True)
class ReleaseDecision:
    ids: tuple[str, ...] = ()  # to send again (empty: done, or given up)
    delay: float = 0.0  # seconds until then
    why: str = ""  # when ids remain unconfirmed and are not resent: which bound ended it


def unconfirmed(ids: Sequence[str], *, answered: bool, remaining: Collection[str],
                gone: Collection[str]) -> tuple[str, ...]:
    """The ids a release has not reached yet: all of them without an answer; with one, those the
    source neither ended (``gone``) nor holds (``remaining``: it kept the lease, another reader's)."""
    if not answered:
        return tuple(ids)
    return tuple(i for i in ids if i not in gone and i not in remaining)


def release_retry(policy: ReleaseRetry, ids: Sequence[str], *, now: float, first_sent: float,
                  sends: int) -> ReleaseDecision:
    """Resend the release of the unconfirmed ``ids`` (after ``delay``), or give up (``why``).
    Times are monotonic seconds; ``sends`` counts the sends made so far (the first included)."""
    if not ids:
        return ReleaseDecision()
    if sends >= policy.max_sends:
        return ReleaseDecision(why=f"not confirmed after {sends} sends")
    delay = min(policy.max_delay, policy.first_delay * (2 ** max(0, sends - 1)))
    if now + delay - first_sent > policy.budget_seconds:
        return ReleaseDecision(why=f"not confirmed within {policy.budget_seconds:g}s")
    return ReleaseDecision(tuple(ids), delay=delay)
