"""The canary's decision core (pure: no clock, no I/O; issue 22, part 1's operator half).

Each reconcile, the edge (not built yet) reads the router's per-revision signals for the canary
pair since the current step began, and calls ``decide``. Rules, in order:

1. A finished rollout (Promoted, Aborted) stays finished.
2. The ``pdfleet.io/rollout`` annotation overrides: ``abort`` sets the weight back to 0 (Aborted),
   ``promote`` sends everything to the new pair (Promoted).
3. ``judge``: with fewer than ``min_requests`` requests in the step there is no evidence (wait);
   otherwise an error rate above ``max_error_rate``, a recompute rate above
   ``max_recompute_rate`` (requests the pair answered without moving their KV: decode-only, or
   recomputed after a refused or failed pull), or a TTFT / ITL p90 above ``ttft_ms`` /
   ``itl_ms``, is a breach (reason names the signal and both values); else a pass. With
   ``max_recompute_rate`` set but no recompute figure (decode's metrics not read), there is no
   evidence either (wait).
4. A breach aborts at once, pause or not. A pass advances only once the step's ``pause_s`` has
   passed: to the next step's weight, or after the last step to Promoted (weight 100). Without
   evidence the step holds, however long its pause (never advance blind).

``steps`` come from the spec at each reconcile, so they may have been edited since the state was
recorded: a step index past the last step (steps shortened mid-canary) continues at the new last
step, its pause starting again at the edit (``clamp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from pdfleet.contract.labels import ROLLOUT, ROLLOUT_ABORT, ROLLOUT_PROMOTE

PROGRESSING, PROMOTED, ABORTED = "Progressing", "Promoted", "Aborted"
Phase = Literal["Progressing", "Promoted", "Aborted"]
# The annotation's values name the actions they force (pdfleet.contract.labels.ROLLOUT).
PROMOTE, ABORT = ROLLOUT_PROMOTE, ROLLOUT_ABORT
Override = Optional[str]  # PROMOTE | ABORT | None


@dataclass(frozen=True)
class Step:
    weight: int  # percent of requests to the new pair
    pause_s: float


@dataclass(frozen=True)
class Analysis:
    ttft_ms: Optional[float] = None
    itl_ms: Optional[float] = None
    max_error_rate: Optional[float] = None  # 0..1
    min_requests: int = 100
    max_recompute_rate: Optional[float] = None  # 0..1


@dataclass(frozen=True)
class Signals:
    """The canary pair's figures over the current step."""

    requests: int
    errors: int  # 5xx and failed legs the router counted against the pair
    ttft_p90_s: Optional[float] = None
    itl_p90_s: Optional[float] = None
    # requests answered without their KV moving (decode-only, or recomputed); None: not measured
    recomputed: Optional[float] = None


@dataclass(frozen=True)
class State:
    phase: Phase = PROGRESSING
    step: int = 0  # index into the steps
    step_started: float = 0.0  # the edge's clock when the step began


@dataclass(frozen=True)
class Verdict:
    outcome: Literal["pass", "breach", "wait"]
    reason: str


@dataclass(frozen=True)
class Decision:
    state: State
    weight: int  # what the router should send to the new pair now
    action: str  # hold | advance | PROMOTE | ABORT | done
    reason: str


def judge(signals: Signals, analysis: Analysis) -> Verdict:
    needed = max(1, analysis.min_requests)
    if signals.requests < needed:
        return Verdict("wait", f"{signals.requests} of {needed} requests needed for an analysis")
    rate = signals.errors / signals.requests
    if analysis.max_error_rate is not None and rate > analysis.max_error_rate:
        return Verdict("breach", f"error rate {rate:.3f} > maxErrorRate {analysis.max_error_rate:g}")
    recompute = ""
    if analysis.max_recompute_rate is not None:
        if signals.recomputed is None:
            return Verdict("wait", "no recompute figure from the new pair's decodes yet (maxRecomputeRate is set)")
        share = min(1.0, max(0.0, signals.recomputed) / signals.requests)
        if share > analysis.max_recompute_rate:
            return Verdict("breach", f"recompute rate {share:.3f} > maxRecomputeRate {analysis.max_recompute_rate:g}")
        recompute = f", recompute rate {share:.3f}"
    for name, value, limit in (("TTFT", signals.ttft_p90_s, analysis.ttft_ms),
                               ("ITL", signals.itl_p90_s, analysis.itl_ms)):
        if limit is not None and value is not None and value * 1000 > limit:
            return Verdict("breach", f"{name} p90 {value * 1000:.0f} ms > {limit:g} ms")
    return Verdict("pass", f"{signals.requests} requests, error rate {rate:.3f}{recompute}, within the analysis")


def weight_of(state: State, steps: tuple[Step, ...]) -> int:
    if state.phase == PROMOTED:
        return 100
    if state.phase == ABORTED or not steps:
        return 0
    return steps[min(state.step, len(steps) - 1)].weight


def clamp(state: State, steps: tuple[Step, ...], now: float) -> tuple[State, Optional[str]]:
    """The state against the spec's steps now: a step past the last one (steps shortened while the
    canary ran) becomes the last step, whose pause starts again now; with a note saying so."""
    if state.phase != PROGRESSING or not steps or state.step < len(steps):
        return state, None
    last = len(steps) - 1
    note = (f"steps edited: step {state.step + 1} no longer exists, continuing at the last step "
            f"({last + 1} of {len(steps)}, weight {steps[last].weight})")
    return State(PROGRESSING, last, now), note


def decide(state: State, steps: tuple[Step, ...], analysis: Analysis, signals: Signals, now: float,
           override: Override = None) -> Decision:
    if state.phase != PROGRESSING:
        return Decision(state, weight_of(state, steps), "done", f"rollout {state.phase.lower()}")
    if override == ABORT:
        s = State(ABORTED, state.step, now)
        return Decision(s, 0, ABORT, f"aborted by the {ROLLOUT} annotation")
    if override == PROMOTE:
        s = State(PROMOTED, state.step, now)
        return Decision(s, 100, PROMOTE, f"promoted by the {ROLLOUT} annotation")
    if not steps:
        return Decision(State(PROMOTED, 0, now), 100, PROMOTE, "no canary steps: promoted")
    state, edited = clamp(state, steps, now)
    verdict = judge(signals, analysis)
    if verdict.outcome == "breach":
        return Decision(State(ABORTED, state.step, now), 0, ABORT, verdict.reason)
    step = steps[state.step]
    if edited is not None:  # the figures so far were taken at another weight: a new window and pause
        return Decision(state, step.weight, "hold", f"{edited}; {verdict.reason}")
    if verdict.outcome == "wait" or now - state.step_started < step.pause_s:
        why = verdict.reason if verdict.outcome == "wait" else (
            f"step {state.step + 1} of {len(steps)} passes so far; pause ends in "
            f"{step.pause_s - (now - state.step_started):.0f} s")
        return Decision(state, step.weight, "hold", why)
    if state.step + 1 >= len(steps):
        return Decision(State(PROMOTED, state.step, now), 100, PROMOTE, f"last step passed: {verdict.reason}")
    nxt = State(PROGRESSING, state.step + 1, now)
    return Decision(nxt, steps[nxt.step].weight, "advance", f"step {state.step + 1} passed: {verdict.reason}")


def effective_override(annotation: Optional[str], stale: Optional[str]) -> tuple[Override, Optional[str]]:
    """The ``pdfleet.io/rollout`` annotation as an override, and the stale value to remember.

    The operator does not write the resource's metadata (its RBAC is status only), so the annotation
    stays after it was acted on. A value already there when a canary starts is left from an earlier
    rollout (``stale``) and ignored until it is removed or changed; an unknown value is no override.
    """
    value = annotation if annotation in (PROMOTE, ABORT) else None
    if stale is not None and value == stale:
        return None, stale
    return value, None
