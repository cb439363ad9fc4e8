"""The progress deadline (pure; issue 39): ``spec.progressDeadlineSeconds`` after the current generation
started progressing, a fleet that is still not complete is Stalled, so that Argo CD, Flux and
``kubectl wait`` stop waiting (Deployment's ProgressDeadlineExceeded, for a fleet).

The clock is ``status.progressingSince``: set when a reconcile finds the fleet not complete and no
clock running, or the generation changed (a new spec starts a new clock); cleared when the fleet is
complete, and while a canary runs (its steps' pauses are progress with their own analysis). Every
answer is a function of the times given: no clock is read here.
"""

from __future__ import annotations

import datetime
from typing import Optional

from pdfleet.operator.rollout.paired import format_time, parse_time


def progressing_since(previous: Optional[str], previous_generation: Optional[int], generation: Optional[int], *,
                      running: bool, now: datetime.datetime) -> Optional[str]:
    """The clock after this reconcile. ``running``: the fleet is not complete and no canary runs."""
    if not running:
        return None
    if previous is None or previous_generation != generation or parse_time(previous) is None:
        return format_time(now)
    return previous


def seconds_left(since: Optional[str], deadline_s: int, now: datetime.datetime) -> Optional[float]:
    """Seconds until the deadline (0 or less: passed), None without a clock."""
    start = parse_time(since) if since else None
    if start is None:
        return None
    return deadline_s - (now - start).total_seconds()


def deadline_message(since: str, deadline_s: int, waiting_for: str) -> str:
    return (f"not complete {deadline_s} s (spec.progressDeadlineSeconds) after progress started at {since}"
            + (f": {waiting_for}" if waiting_for else ""))
