"""Replay synthetic traces against a capacity model of prefill and decode replicas and compare
three sizing policies in one run:

  fixed    a fleet fixed at the smallest size that meets both SLOs at the trace's peak
  hpa      an HPA-like policy on one queue metric per role (prefill legs in flight per replica,
           decode streams per replica), with HPA's 10% tolerance and 300 s scale-down window
  planner  pdfleet's planner (pdfleet.operator.autoscale.planner.decide, the function the
           operator calls), steering to p90 TTFT and ITL targets

Per trace and in total: SLO attainment (intervals in which p90 TTFT and p90 ITL both met
their targets) and replica-seconds, with each policy's replica-seconds as a ratio of fixed's
measured in the same run.

The capacity model (fluid, per 30 s interval; all numbers are illustrative, not a GPU):
- prefill: a replica processes PREFILL_TOKENS_PER_S prompt tokens a second; time to first
  token = service + queueing (Sakasegawa's M/M/c approximation) + one decode step; demand
  above capacity builds a backlog that later intervals drain;
- decode: ITL = ITL0 + ITL_PER_STREAM x streams in the replica's batch; streams per replica
  follow from Little's law (arrival rate x output tokens x ITL); a replica holds at most
  MAX_BATCH streams, the rest wait (and count against TTFT);
- a new replica serves STARTUP_S after it was asked for (but is paid for from then);
- measured p90s carry a little multiplicative noise (seeded).

Usage: python bench/planner.py [--hours 6] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

from pdfleet.operator.autoscale.clamp import Bounds, Ratio, clamp
from pdfleet.operator.autoscale.planner import PlannerConfig, PlannerState, RoleSignal, decide

args_verbose = False
INTERVAL_S = 30.0
STARTUP_S = 60.0
TTFT_TARGET_S, ITL_TARGET_S = 0.8, 0.060
PREFILL_TOKENS_PER_S = 16_000.0
ITL0_S, ITL_PER_STREAM_S, MAX_BATCH = 0.015, 0.0005, 256
OUTPUT_TOKENS = 400
PEAK_RPS = 40.0
BOUNDS = {"prefill": Bounds(1, 32), "decode": Bounds(1, 48)}
RATIO = Ratio(0.1, 4.0)
P90_SPREAD = {"ttft": 2.3, "itl": 1.15}   # p90 / mean of the interval's distribution
HPA_TOLERANCE, HPA_DOWN_WINDOW_S = 0.1, 300.0


# ---------------------------------------------------------------------------- traces

@dataclass(frozen=True)
class Point:
    rps: float
    prompt: float   # tokens


def trace(name: str, hours: float, rng: random.Random) -> list[Point]:
    n = int(hours * 3600 / INTERVAL_S)
    out = []
    for i in range(n):
        t = i * INTERVAL_S
        frac = i / n
        noise = 1 + rng.gauss(0, 0.04)
        if name == "steady":
            rps, prompt = 0.6 * PEAK_RPS, 2000
        elif name == "diurnal":
            rps, prompt = PEAK_RPS * (0.12 + 0.88 * (1 - math.cos(2 * math.pi * frac)) / 2), 2000
        elif name == "bursts":
            in_burst = (t % 3600) >= 1800 and (t % 3600) < 2400   # 10 minutes each hour
            rps, prompt = PEAK_RPS * (1.0 if in_burst else 0.25), 2000
        elif name == "prompt-shift":
            rps, prompt = 0.5 * PEAK_RPS, (1500 if frac < 0.5 else 4500)
        else:
            raise ValueError(name)
        out.append(Point(max(0.0, rps * noise), prompt))
    return out


TRACES = ("steady", "diurnal", "bursts", "prompt-shift")


# ---------------------------------------------------------------------------- capacity model

@dataclass
class Fleet:
    """Replicas asked for, with the time each became (or becomes) ready."""
    asked: dict[str, int]
    ready_at: dict[str, list[float]] = field(default_factory=lambda: {"prefill": [], "decode": []})
    backlog_tokens: float = 0.0

    @classmethod
    def start(cls, sizes: dict[str, int]) -> "Fleet":
        f = cls(dict(sizes))
        f.ready_at = {r: [-1e9] * n for r, n in sizes.items()}
        return f

    def resize(self, now: float, sizes: dict[str, int]) -> None:
        for role, n in sizes.items():
            have = self.ready_at[role]
            if n > len(have):
                have += [now + STARTUP_S] * (n - len(have))
            else:
                del have[n:]  # scale down: the newest go first
            self.asked[role] = n

    def ready(self, now: float, role: str) -> int:
        return sum(1 for t in self.ready_at[role] if t <= now)


@dataclass(frozen=True)
class Observation:
    ttft_p90: float
    itl_p90: float
    prefill_load: float    # prefill legs in flight
    decode_load: float     # decode streams (running + waiting)

    def met(self) -> bool:
        return self.ttft_p90 <= TTFT_TARGET_S and self.itl_p90 <= ITL_TARGET_S


def _mmc_wait(service: float, rho: float, c: int) -> float:
    return service * rho ** (math.sqrt(2 * (c + 1)) - 1) / (c * (1 - rho))


def step(point: Point, prefill: int, decode: int, backlog: float, rng: Optional[random.Random],
         ) -> tuple[Observation, float]:
    """One interval at these ready sizes: what the router would measure, and the next backlog."""
    demand = point.rps * point.prompt                      # prompt tokens / s
    capacity = max(prefill, 0) * PREFILL_TOKENS_PER_S
    service = point.prompt / PREFILL_TOKENS_PER_S
    backlog = max(0.0, backlog + (demand - capacity) * INTERVAL_S)
    if prefill <= 0:
        wait = 60.0
    else:
        rho = min(demand / capacity, 0.999)
        wait = _mmc_wait(service, rho, prefill) + backlog / capacity
    # decode: streams per replica b = rate * out * itl(b) / n  ->  b = r*o*itl0 / (n - r*o*k)
    work = point.rps * OUTPUT_TOKENS
    if decode > 0 and decode - work * ITL_PER_STREAM_S > 0:
        batch = work * ITL0_S / (decode - work * ITL_PER_STREAM_S)
    else:
        batch = float("inf")
    queued = 0.0
    if batch > MAX_BATCH:
        batch = MAX_BATCH
        streams_possible = decode * MAX_BATCH
        needed = work * (ITL0_S + ITL_PER_STREAM_S * MAX_BATCH)
        queued = max(0.0, needed - streams_possible)   # requests waiting for a decode slot
    itl = ITL0_S + ITL_PER_STREAM_S * batch
    decode_wait = queued / max(point.rps, 1e-9) if queued else 0.0
    noise = (lambda: math.exp(rng.gauss(0, 0.05))) if rng else (lambda: 1.0)
    obs = Observation(
        ttft_p90=(service + P90_SPREAD["ttft"] * (wait + decode_wait) + itl) * noise(),
        itl_p90=itl * P90_SPREAD["itl"] * noise(),
        prefill_load=point.rps * (service + wait),
        decode_load=batch * max(decode, 1) + queued,
    )
    return obs, backlog


def peak_size(points: list[Point]) -> dict[str, int]:
    """Smallest fixed fleet meeting both SLOs in every interval of the trace (no noise)."""
    decode = next(d for d in range(1, 200) if all(step(p, 200, d, 0.0, None)[0].itl_p90 <= ITL_TARGET_S
                                                 for p in points))
    prefill = next(n for n in range(1, 200) if all(step(p, n, decode, 0.0, None)[0].met() for p in points))
    return {"prefill": prefill, "decode": decode}


# ---------------------------------------------------------------------------- policies

Policy = Callable[[float, Observation, dict[str, int], dict[str, int]], dict[str, int]]


def fixed_policy(size: dict[str, int]) -> Policy:
    return lambda now, obs, current, ready: dict(size)


def hpa_targets(points: list[Point], peak: dict[str, int]) -> dict[str, float]:
    """HPA targets as an operator would calibrate them: 80% of the per-replica queue metrics of
    the fixed fleet at the trace's busiest interval (where it just meets the SLOs)."""
    busiest = max(points, key=lambda p: p.rps * p.prompt)
    obs, _ = step(busiest, peak["prefill"], peak["decode"], 0.0, None)
    return {"prefill": 0.8 * obs.prefill_load / peak["prefill"], "decode": 0.8 * obs.decode_load / peak["decode"]}


def hpa_policy(targets: dict[str, float]) -> Policy:
    history: list[tuple[float, dict[str, int]]] = []

    def policy(now: float, obs: Observation, current: dict[str, int], ready: dict[str, int]) -> dict[str, int]:
        metrics = {"prefill": obs.prefill_load / max(current["prefill"], 1),
                   "decode": obs.decode_load / max(current["decode"], 1)}
        desired = {}
        for role in ("prefill", "decode"):
            ratio = metrics[role] / targets[role]
            want = current[role] if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(current[role] * ratio)
            want = min(want, max(current[role] + 4, 2 * current[role]))   # HPA's default scale-up policy
            want = max(BOUNDS[role].min, min(BOUNDS[role].max, want))
            desired[role] = want
        history.append((now, desired))
        while history and history[0][0] < now - HPA_DOWN_WINDOW_S:
            history.pop(0)
        # scale up at once; scale down to the highest recommendation of the window
        out = {r: max(d[r] for _, d in history) for r in ("prefill", "decode")}
        return {r: max(out[r], desired[r]) for r in out}

    return policy


def planner_policy() -> Policy:
    cfg = PlannerConfig(targets_s={"prefill": TTFT_TARGET_S, "decode": ITL_TARGET_S}, scale_down_delay_s=300.0,
                        bounds=BOUNDS, ratio=RATIO)
    state = {"s": PlannerState()}

    def policy(now: float, obs: Observation, current: dict[str, int], ready: dict[str, int]) -> dict[str, int]:
        signals = {"prefill": RoleSignal(obs.ttft_p90, obs.prefill_load, ready["prefill"]),
                   "decode": RoleSignal(obs.itl_p90, obs.decode_load, ready["decode"])}
        decision = decide(now, signals, current, state["s"], cfg)
        state["s"] = decision.state
        if args_verbose:
            print(f"  t={now:6.0f} ttft={obs.ttft_p90:6.3f} itl={obs.itl_p90:6.3f} load={obs.prefill_load:6.1f}/"
                  f"{obs.decode_load:6.1f} {current} -> {decision.replicas} {decision.reasons}")
        return decision.replicas

    return policy


@dataclass
class Result:
    met: int = 0
    intervals: int = 0
    replica_seconds: float = 0.0

    @property
    def attainment(self) -> float:
        return self.met / self.intervals if self.intervals else 0.0


def replay(points: list[Point], policy: Policy, start: dict[str, int], seed: int) -> Result:
    rng = random.Random(seed)
    fleet = Fleet.start(start)
    res = Result()
    for i, point in enumerate(points):
        now = i * INTERVAL_S
        obs, fleet.backlog_tokens = step(point, fleet.ready(now, "prefill"), fleet.ready(now, "decode"),
                                         fleet.backlog_tokens, rng)
        res.intervals += 1
        res.met += obs.met()
        res.replica_seconds += (fleet.asked["prefill"] + fleet.asked["decode"]) * INTERVAL_S
        ready = {r: fleet.ready(now, r) for r in ("prefill", "decode")}
        fleet.resize(now + INTERVAL_S, clamp(policy(now, obs, dict(fleet.asked), ready), BOUNDS, RATIO).replicas)
    return res


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", choices=TRACES, action="append", help="only these traces (default: all)")
    parser.add_argument("--verbose", action="store_true", help="print every planner decision")
    args = parser.parse_args(argv)
    global args_verbose
    args_verbose = args.verbose

    rows = []
    totals = {p: Result() for p in ("fixed", "hpa", "planner")}
    peaks = []
    for name in args.trace or TRACES:
        points = trace(name, args.hours, random.Random(f"{name}-{args.seed}"))
        peak = peak_size(points)
        peaks.append((peak, len(points)))
        start = dict(peak)   # the CR's replicas: the starting size
        results = {
            "fixed": replay(points, fixed_policy(peak), peak, args.seed),
            "hpa": replay(points, hpa_policy(hpa_targets(points, peak)), start, args.seed),
            "planner": replay(points, planner_policy(), start, args.seed),
        }
        for policy, r in results.items():
            t = totals[policy]
            t.met, t.intervals, t.replica_seconds = t.met + r.met, t.intervals + r.intervals, \
                t.replica_seconds + r.replica_seconds
            rows.append((name, policy, r, r.replica_seconds / results["fixed"].replica_seconds,
                         f"{peak['prefill']}P+{peak['decode']}D" if policy == "fixed" else ""))
    for policy, t in totals.items():
        rows.append(("ALL", policy, t, t.replica_seconds / totals["fixed"].replica_seconds, ""))

    print(f"SLOs: p90 TTFT <= {TTFT_TARGET_S * 1000:.0f} ms and p90 ITL <= {ITL_TARGET_S * 1000:.0f} ms per "
          f"{INTERVAL_S:.0f} s interval; {args.hours:g} h per trace; replicas start in {STARTUP_S:.0f} s; seed {args.seed}")
    print(f"{'trace':<13} {'policy':<8} {'SLO met':>8} {'replica-s':>11} {'vs fixed':>9}  size")
    for name, policy, r, vs, note in rows:
        print(f"{name:<13} {policy:<8} {r.attainment * 100:7.1f}% {r.replica_seconds:11.0f} {vs:8.2f}x  {note}")
    p, h, f = totals["planner"], totals["hpa"], totals["fixed"]
    goal = p.attainment >= 0.95 and p.replica_seconds <= 0.70 * f.replica_seconds and p.attainment > h.attainment
    print(f"goal (planner >= 95% attainment, <= 0.70x fixed's replica-seconds, beats hpa on attainment): "
          f"{'MET' if goal else 'NOT MET'} against each trace's own peak size")
    # The looser reading of "a fleet fixed at peak size": one fleet sized for the peak of every trace.
    fleet_peak = {r: max(pk[r] for pk, _ in peaks) for r in ("prefill", "decode")}
    fleet_rs = sum((fleet_peak["prefill"] + fleet_peak["decode"]) * n * INTERVAL_S for _, n in peaks)
    print(f"against one fleet fixed at the peak of all traces ({fleet_peak['prefill']}P+{fleet_peak['decode']}D, "
          f"{fleet_rs:.0f} replica-s): planner {p.replica_seconds / fleet_rs:.2f}x, hpa {h.replica_seconds / fleet_rs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
