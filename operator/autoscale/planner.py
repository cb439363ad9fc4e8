"""pdfleet's SLO planner: one decision per interval (pure).

Inputs are what the router measured over the last interval (p90 TTFT and ITL, the
prefill legs and decode streams in flight) and the current sizes. Per role:

- the SLO's *pressure* is p90 / target (prefill: TTFT, decode: ITL);
- the role's *capacity*, the load one replica is known to carry within its target, is
  learned from what is observed: the highest per-replica load seen while the target held,
  probed upwards slowly while the target holds with much room (latency is far from linear
  near saturation: never a leap), and shrunk when the target is missed (load / pressure,
  at most 30% per interval);
- while replicas it asked for are still starting, it does not ask for more (their
  capacity is on its way);
- above UP_PRESSURE it scales up at once: load / (capacity x HEADROOM),
  at least one more replica, at most double per step (replicas take time to start);
- below DOWN_PRESSURE and when load / (capacity x DOWN_HEADROOM) needs fewer replicas, it
  scales down, but
  only once a lower size has been wanted for scaleDownDelaySeconds without interruption,
  and by at most 30% per step (each step waits the delay again);
- in between (hysteresis) nothing moves;
- then min/max and the ratio (clamp.py), as for any other scaler value.

TTFT also depends on decode (the first token comes from decode), and ITL on prefill
only little: each role is steered by its own SLO, the ratio keeps them in proportion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from pdfleet.operator.autoscale.clamp import Bounds, Ratio, clamp

ROLES = ("prefill", "decode")
DOWN_PRESSURE = 0.7      # scale down only while p90 is below 70% of the target
UP_PRESSURE = 0.9        # scale up from 90% of the target, before it is missed
DOWN_STEP = 0.7          # a step down keeps at least 70% of the replicas
DOWN_HEADROOM = 0.75     # and leaves each replica at most 75% of its known capacity
HEADROOM = 0.85          # size for 85% of the learned capacity
GROW = 1.10              # capacity grows at most 10% per interval while the SLO holds
SHRINK = 0.7             # and shrinks at most 30% per interval when it is missed
MAX_STEP = 3.0           # at most triple per decision


@dataclass(frozen=True)
class RoleSignal:
    p90_s: Optional[float]   # None: nothing finished in the interval
    load: float              # prefill legs / decode streams in flight, averaged over the interval
    ready: Optional[int] = None   # ready replicas; fewer than current: a scale-up is under way


@dataclass(frozen=True)
class RoleState:
    capacity: Optional[float] = None     # load per replica within the target (learned)
    low_since: Optional[float] = None    # when a lower size started being wanted


@dataclass(frozen=True)
class PlannerState:
    roles: Mapping[str, RoleState] = field(default_factory=lambda: {r: RoleState() for r in ROLES})


@dataclass(frozen=True)
class PlannerConfig:
    targets_s: Mapping[str, float]       # prefill: TTFT, decode: ITL
    scale_down_delay_s: float
    bounds: Mapping[str, Bounds]
    ratio: Ratio = Ratio()


@dataclass(frozen=True)
class PlannerDecision:
    replicas: dict[str, int]
    state: PlannerState
    reasons: dict[str, str]

    def summary(self) -> str:
        return "; ".join(f"{r} {self.replicas[r]}: {self.reasons[r]}" for r in ROLES if r in self.reasons)


def _learn(capacity: Optional[float], per_replica: float, pressure: Optional[float]) -> Optional[float]:
    if pressure is None or per_replica <= 0:
        return capacity
    if pressure > 1.0:
        seen = per_replica / min(pressure, MAX_STEP)
        return seen if capacity is None else min(capacity, max(seen, capacity * SHRINK))
    if pressure > UP_PRESSURE:
        return capacity
    # Held: one replica carried this much within the target; far within it, a little more
    # (at most 1.5x what it carried, and 10% more per interval: probing, never leaping).
    seen = per_replica * (min(DOWN_PRESSURE / pressure, 1.5) if pressure < DOWN_PRESSURE else 1.0)
    if capacity is None:
        return per_replica
    return max(capacity, min(seen, capacity * GROW))


def _role(now: float, role: str, sig: RoleSignal, current: int, state: RoleState, cfg: PlannerConfig,
          ) -> tuple[int, RoleState, str]:
    target = cfg.targets_s[role]
    pressure = None if sig.p90_s is None else sig.p90_s / target
    capacity = _learn(state.capacity, sig.load / current if current else 0.0, pressure)
    p_text = "no traffic" if pressure is None else f"p90 {sig.p90_s * 1000:.0f}ms of {target * 1000:.0f}ms"

    # Fewer replicas carry more load each, and queueing grows faster than load: keep a margin.
    needed = math.ceil(sig.load / (capacity * DOWN_HEADROOM) - 1e-9) if capacity else current
    cap_text = f"load {sig.load:.1f}, capacity {capacity:.2f}/replica" if capacity else f"load {sig.load:.1f}"
    hot = pressure is not None and pressure > UP_PRESSURE
    if hot and sig.ready is not None and sig.ready < current:
        return current, RoleState(capacity, None), f"hold: {p_text}, {current - sig.ready} replica(s) still starting"
    if hot:
        wanted = math.ceil(sig.load / (capacity * HEADROOM) - 1e-9) if capacity else current
        if hot:
            wanted = max(wanted, current + 1)
        wanted = int(min(max(wanted, current + 1), max(current * MAX_STEP, current + 1)))
        return wanted, RoleState(capacity, None), f"up: {p_text}, {cap_text}"
    wanted = needed
    if wanted < current and (pressure is None or pressure < DOWN_PRESSURE):
        since = state.low_since if state.low_since is not None else now
        if now - since >= cfg.scale_down_delay_s:
            wanted = max(wanted, current - max(1, math.floor(current * (1 - DOWN_STEP))))
            # still low: the next step needs no new delay (the delay guards against dips, not slopes)
            return wanted, RoleState(capacity, since), f"down: {p_text}, {cap_text}"
        left = cfg.scale_down_delay_s - (now - since)
        return current, RoleState(capacity, since), f"hold: {wanted} wanted, down in {left:.0f}s if it stays so"
    return current, RoleState(capacity, None), f"hold: {p_text}, {cap_text}"


def decide(now: float, signals: Mapping[str, RoleSignal], current: Mapping[str, int], state: PlannerState,
           cfg: PlannerConfig, roles: tuple[str, ...] = ROLES) -> PlannerDecision:
    """Sizes for the roles the planner drives (`roles`); the others stay at `current`."""
    wanted = dict(current)
    states = dict(state.roles)
    reasons: dict[str, str] = {}
    for role in roles:
        wanted[role], states[role], reasons[role] = _role(now, role, signals[role], current[role],
                                                          states.get(role, RoleState()), cfg)
    result = clamp(wanted, cfg.bounds, cfg.ratio)
    for role, why in result.reasons.items():
        reasons[role] = f"{reasons.get(role, '')}; clamped: {why}".lstrip("; ")
    return PlannerDecision(dict(result.replicas), replace(state, roles=states), reasons)
