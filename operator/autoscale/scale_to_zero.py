"""Scale to zero as a P/D pair (issue 41), the decisions (pure).

The pair is the unit: both roles' scalers go to 0 together and leave 0 together, and a fleet is never
left with one role at 0 while the other is not.

- activation: a role is at 0 and a front end holds a request (its waiting gauge above 0, or its
  activations counter moved since the previous scrape, which a scrape between two held episodes
  cannot miss) -> every role at 0 goes to 1, one write each;
- retirement: both roles above 0, nothing held, nothing in flight at the front ends (no prefill or
  decode leg waiting, no decode stream: the drain of the requests and their leases is done), and no
  request answered for ``idleSeconds`` -> both to 0. Idleness is measured from the front ends' request
  counters by observation time (monotonic): any counter that moved (or a front end seen for the first
  time, or restarted) is activity at the time it was seen. A request that arrives while the pair
  retires is held by the front ends and turns the retirement around (activation above);
- a half pair (one role at 0, by hand or by another scaler): the role at 0 goes to 1 unless the pair is
  idle, then the other goes to 0 too.
Without any front end read there is no decision: nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from pdfleet.contract import metrics as names
from pdfleet.contract import scale_to_zero as stz
from pdfleet.operator.api import conditions
from pdfleet.operator.observability.metrics_text import total, usable_samples

ROLES = ("prefill", "decode")
ACTIVATE, RETIRE, COMPLETE, HOLD = "activate", "retire", "complete", "hold"
REQUESTS = f"{names.ROUTER_REVISION_REQUESTS}_total"
ACTIVATIONS = f"{stz.ROUTER_ACTIVATIONS}_total"
# How often a fleet's front ends are read: at 0 (and while waking) often enough to activate within a
# second of the first held request; serving, often enough to see idleSeconds pass (a tenth of it).
POLL_AT_ZERO_S = 0.5
MAX_POLL_SERVING_S = 10.0


@dataclass(frozen=True)
class FrontEndSample:
    """One scrape of one front end (router or Endpoint Picker)."""

    waiting: float = 0.0       # requests held in its waiting room (gauge)
    activations: float = 0.0   # cold episodes it asked activation for (counter)
    requests: float = 0.0      # generate requests answered (counter, every revision and outcome)
    in_flight: float = 0.0     # legs waiting for an engine and decode streams being relayed (gauges)


def parse_front_end(text: str) -> FrontEndSample:
    found = usable_samples(text)
    return FrontEndSample(waiting=total(found, stz.ROUTER_WAITING_REQUESTS),
                          activations=total(found, ACTIVATIONS),
                          requests=total(found, REQUESTS),
                          in_flight=total(found, names.ROUTER_LEGS_WAITING, names.ROUTER_STREAMS))


@dataclass(frozen=True)
class Observation:
    """The fleet's front ends at one scrape, against the previous one."""

    waiting: int = 0
    activated: bool = False    # an activations counter moved: an episode began since the last scrape
    activity: bool = False     # a request counter moved, a front end is new or restarted, or work is held/in flight
    in_flight: float = 0.0


def observe(prev: Optional[Mapping[str, FrontEndSample]], cur: Mapping[str, FrontEndSample]) -> Observation:
    """Counters are compared per front end pod; one first seen (or whose counter went down: a restart)
    counts as activity, so that idleness is never inferred from a counter that was not watched."""
    prev = prev or {}
    waiting = int(sum(s.waiting for s in cur.values()))
    in_flight = sum(s.in_flight for s in cur.values())
    moved = any(pod not in prev or s.requests != prev[pod].requests or s.activations != prev[pod].activations
                for pod, s in cur.items())
    activated = any(pod in prev and s.activations > prev[pod].activations for pod, s in cur.items())
    return Observation(waiting=waiting, activated=activated,
                       activity=moved or waiting > 0 or in_flight > 0, in_flight=in_flight)


@dataclass(frozen=True)
class PairState:
    last_active: Optional[float] = None   # monotonic time activity was last observed


@dataclass(frozen=True)
class Decision:
    action: str
    writes: Mapping[str, int] = field(default_factory=dict)   # role -> replicas to write on its scaler
    reason: str = ""
    state: PairState = PairState()
    idle_s: float = 0.0


def decide(now: float, obs: Optional[Observation], replicas: Mapping[str, int], state: PairState,
           idle_seconds: float) -> Decision:
    """What to write on the scalers (``replicas``: each role's scaler value as last written or seen)."""
    if obs is None:
        return Decision(HOLD, reason="no front end read", state=state)
    last = now if obs.activity or state.last_active is None else state.last_active
    state = PairState(last)
    idle_s = now - last
    at_zero = [r for r in ROLES if replicas.get(r, 0) == 0]
    wanted = obs.waiting > 0 or obs.activated
    if at_zero and wanted:
        return Decision(ACTIVATE, {r: 1 for r in at_zero}, f"{obs.waiting} request(s) held by the front ends",
                        state, idle_s)
    idle = idle_s >= idle_seconds and not obs.activity
    if len(at_zero) == 1:
        if idle:
            busy = next(r for r in ROLES if r not in at_zero)
            return Decision(COMPLETE, {busy: 0}, f"{at_zero[0]} is at 0 and no request for {idle_s:.0f}s",
                            state, idle_s)
        return Decision(COMPLETE, {at_zero[0]: 1}, f"{at_zero[0]} is at 0 while the pair serves", state, idle_s)
    if not at_zero and idle:
        return Decision(RETIRE, {r: 0 for r in ROLES}, f"no request for {idle_s:.0f}s (idleSeconds "
                        f"{idle_seconds:.0f}), none held or in flight", state, idle_s)
    return Decision(HOLD, state=state, idle_s=idle_s)


def poll_interval(replicas: Mapping[str, int], idle_seconds: float) -> float:
    """When to read the front ends again."""
    if any(replicas.get(r, 0) == 0 for r in ROLES):
        return POLL_AT_ZERO_S
    return min(MAX_POLL_SERVING_S, max(POLL_AT_ZERO_S, idle_seconds / 10))


def condition(replicas: Mapping[str, int], ready: Mapping[str, int], waiting: int) -> tuple[bool, str, str]:
    """The ScaledToZero condition (status, reason, message) from the scalers and the roles' ready pods."""
    if all(replicas.get(r, 0) == 0 for r in ROLES):
        return True, conditions.SCALED_TO_ZERO, ("prefill and decode are at 0 (idle); the front ends hold the first request "
                                      "and it wakes both")
    if any(ready.get(r, 0) == 0 for r in ROLES):
        held = f"; {waiting} request(s) held" if waiting else ""
        return False, conditions.ACTIVATING, ("waking the pair: " + ", ".join(
            f"{r} {ready.get(r, 0)}/{replicas.get(r, 0)} ready" for r in ROLES) + held)
    return False, conditions.ACTIVE, "the pair serves"
