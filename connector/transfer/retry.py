"""What a pull does when a lease heartbeat goes unanswered (pure).

A heartbeat can go unanswered while the lease still has time: the source's side-channel thread
was slow (a loaded machine, an engine sharing its CPU) or a message was lost. Failing the pull
then throws away a transfer the source still holds blocks for, and the request is recomputed.
Retrying forever is worse: a pull whose source never answers would hold decode's KV blocks until
its lease ran out, and the requests queued behind it would reach decode after their own leases
(the cascade seen when an unbounded retry was tried, docs/reliability.md).

So a pull retries an unanswered heartbeat only while all of these hold:
- it knows a lease deadline (from an ack, or the expiry advertised with the request): without
  one there is nothing to wait on;
- that deadline is more than ``margin_seconds`` away;
- it has been failing for less than ``budget_seconds`` (per pull, from the first failure; an
  answered heartbeat resets it).
Retries back off exponentially from ``first_delay`` to ``max_delay``, never past the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeartbeatRetry", "RetryDecision", "check_backoff", "heartbeat_retry"]


def check_backoff(policy: object, *names: str) -> None:
    """Refuse a backoff policy whose ``names`` are not numbers >= 0, or whose first_delay exceeds
    max_delay (the error names the field)."""
    kind = type(policy).__name__
    for name in names:
        value = getattr(policy, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"{kind}.{name} must be a number >= 0, got {value!r}")
    if policy.first_delay > policy.max_delay:
        raise ValueError(f"{kind}.first_delay must not exceed max_delay")


@dataclass(frozen=True)
class HeartbeatRetry:
    budget_seconds: float = 8.0
    first_delay: float = 0.05
    max_delay: float = 1.0
    margin_seconds: float = 0.25

    def __post_init__(self) -> None:
        check_backoff(self, "budget_seconds", "first_delay", "max_delay", "margin_seconds")


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay: float = 0.0  # seconds until the next heartbeat, when retry
    why: str = ""  # when not retrying: which bound ended it


def heartbeat_retry(policy: HeartbeatRetry, *, now: float, deadline: float | None, failing_since: float,
                    retries: int) -> RetryDecision:
    """Retry an unanswered heartbeat (after ``delay``), or give up (``why``). Times are monotonic seconds;
    ``retries`` counts the retries already made since ``failing_since``."""
    if deadline is None:
        return RetryDecision(False, why="no lease deadline known (the source never confirmed the lease)")
    left = deadline - now
    if left <= policy.margin_seconds:
        return RetryDecision(False, why=f"the lease ends in {max(left, 0.0):.2f}s")
    if now - failing_since >= policy.budget_seconds:
        return RetryDecision(False, why=f"unanswered for {now - failing_since:.1f}s"
                                        f" (retry budget {policy.budget_seconds:g}s)")
    delay = min(policy.max_delay, policy.first_delay * (2 ** max(0, retries)))
    return RetryDecision(True, delay=min(delay, left - policy.margin_seconds))
