"""The planner's I/O edge: every intervalSeconds, scrape the fleet's router pods' /metrics,
call the pure decision (planner.py) and write the result to the scalers through `/scale`,
as an HPA would. Called by the reconciler; the reconcile is requeued for the next interval.

Refused (nothing written, the reason in status.scaling.planner and a Warning event) while an
HPA targets one of the fleet's scalers (KEDA works through an HPA too): two controllers
writing one replica count undo each other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

import aiohttp

from pdfleet.operator.api import DisaggregatedInference
from pdfleet.operator.api import scaler as scaler_api
from pdfleet.operator.api.rules import replica_range, scale_to_zero_on
from pdfleet.operator.autoscale.clamp import Bounds, Ratio
from pdfleet.operator.autoscale.planner import PlannerConfig, PlannerState, decide
from pdfleet.operator.autoscale.scalers import SCALER_KIND, ScalingPlan
from pdfleet.operator.autoscale.signals import RouterSample, interval_signals, interval_went_down, parse_router_metrics
from pdfleet.operator.observability.metrics_text import WENT_DOWN, MetricsError
from pdfleet.operator.kube import front_ends
from pdfleet.operator.kube.observed import ObservedPod
from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.api import event_reasons as reasons

logger = logging.getLogger("pdfleet.operator")
SCRAPE_TIMEOUT_S = 3.0
MAX_METRICS_BYTES = 4 << 20
Key = tuple[str, str]
PostEvent = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]
Fetch = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class PlannerOutcome:
    requeue_after: Optional[float] = None
    status: Optional[str] = None


async def _fetch(url: str) -> str:
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(url) as resp:
            if resp.status != 200:
                raise MetricsError(f"HTTP {resp.status}")
            body = await resp.content.read(MAX_METRICS_BYTES + 1)
            if len(body) > MAX_METRICS_BYTES:
                raise MetricsError("metrics larger than 4 MiB")
            return body.decode("utf-8", "replace")


def config_of(cr: DisaggregatedInference) -> PlannerConfig:
    p = cr.spec.scaling.planner
    assert p is not None
    ratio = cr.spec.scaling.ratio
    return PlannerConfig(
        targets_s={"prefill": p.ttft_ms / 1000, "decode": p.itl_ms / 1000},
        scale_down_delay_s=float(p.scale_down_delay_seconds),
        bounds={role: _floor_one(cr, Bounds(*replica_range(cr.spec.role(role)))) for role in ("prefill", "decode")},
        ratio=Ratio(ratio.min, ratio.max) if ratio else Ratio(),
    )


def _floor_one(cr: DisaggregatedInference, bounds: Bounds) -> Bounds:
    """Under scaleToZero the pair's 0 <-> 1 is scale to zero's (both roles together): the planner never picks 0."""
    return Bounds(max(1, bounds.min), max(1, bounds.max)) if scale_to_zero_on(cr.spec) else bounds


class PlannerEdge:
    def __init__(self, client: KubeClient, post_event: PostEvent, *, fetch: Fetch = _fetch,
                 clock: Callable[[], float] = time.monotonic,
                 count_rejected: Callable[[str, int], None] = lambda reason, n: None):
        self.client = client
        self.count_rejected = count_rejected  # values skipped (signals.py): here, routers whose counts went down
        self.post_event = post_event
        self.fetch = fetch
        self.clock = clock
        self._samples: dict[Key, dict[str, RouterSample]] = {}
        self._state: dict[Key, PlannerState] = {}
        self._last_run: dict[Key, float] = {}
        self._status: dict[Key, str] = {}
        self._conflict_reported: dict[Key, str] = {}

    def forget(self, key: Key) -> None:
        for store in (self._samples, self._state, self._last_run, self._status, self._conflict_reported):
            store.pop(key, None)

    async def run(self, key: Key, body: Mapping[str, Any], cr: DisaggregatedInference, pods: Sequence[ObservedPod],
                  plan: ScalingPlan, conflicts: Sequence[str]) -> PlannerOutcome:
        p = cr.spec.scaling.planner
        if p is None or not p.enabled or plan.result is None:
            self.forget(key)
            return PlannerOutcome()
        if scale_to_zero_on(cr.spec) and any(plan.result.requested[r] == 0 for r in plan.autoscaled):
            self._samples.pop(key, None)   # the next interval starts when the pair is back
            return PlannerOutcome(None, "standing by: the pair is at 0 (scale to zero); the first request wakes it")
        if conflicts:
            reason = (f"refused: {', '.join(conflicts)} also scale(s) this fleet's scalers; the planner and "
                      "an HPA/KEDA must not both drive one fleet: remove the HPA/ScaledObject or disable the planner")
            if self._conflict_reported.get(key) != reason:
                self._conflict_reported[key] = reason
                logger.warning("%s/%s: planner %s", key[0], key[1], reason)
                await self.post_event(body, reasons.WARNING, reasons.PLANNER_CONFLICT, f"planner {reason}")
            self._samples.pop(key, None)
            return PlannerOutcome(None, reason)
        self._conflict_reported.pop(key, None)

        now = self.clock()
        interval = float(p.interval_seconds)
        due = self._last_run.get(key, -1e18) + interval
        if now < due:
            return PlannerOutcome(due - now, self._status.get(key))
        self._last_run[key] = now

        cur, failures = await self._scrape(pods, cr)
        prev = self._samples.get(key)
        if not cur:
            why = "; ".join(failures) or front_ends.NONE_READY
            return self._keep(key, interval, f"waiting: no router metrics ({why})")
        self._samples[key] = cur
        if prev is None:
            return self._keep(key, interval, "measuring: the first interval starts now")

        signals = interval_signals(prev, cur)
        if down := interval_went_down(prev, cur):
            self.count_rejected(WENT_DOWN, len(down))
        for role, sig in signals.items():   # replicas still starting hold further scale-ups back
            ready = sum(1 for q in pods if q.role == role and q.ready and not q.deleting)
            signals[role] = replace(sig, ready=ready)
        state = self._state.get(key, PlannerState())
        decision = decide(now, signals, plan.result.replicas, state, config_of(cr), roles=plan.autoscaled)
        self._state[key] = decision.state
        changed = []
        for role in plan.autoscaled:
            want = decision.replicas[role]
            if want != plan.result.requested[role]:
                name = scaler_api.scaler_name(cr.metadata.name, role)
                try:
                    await self.client.patch_scale(SCALER_KIND, key[0], name, want)
                    changed.append(f"{role} {plan.result.requested[role]} -> {want}")
                except ApiFailure as exc:
                    logger.warning("%s/%s: planner could not scale %s: %s", key[0], key[1], name, exc)
        summary = decision.summary()
        if changed:
            await self.post_event(body, reasons.NORMAL, reasons.PLANNER_SCALED, f"{', '.join(changed)}: {summary}")
        return self._keep(key, interval, summary)

    def _keep(self, key: Key, interval: float, status: str) -> PlannerOutcome:
        self._status[key] = status
        return PlannerOutcome(interval, status)

    async def _scrape(self, pods: Sequence[ObservedPod], cr: DisaggregatedInference,
                      ) -> tuple[dict[str, RouterSample], list[str]]:
        """Every ready front end's figures: the routers' and the Endpoint Pickers' (kube/front_ends.py)."""
        return await front_ends.scrape(front_ends.metrics_targets(pods, cr.spec.router.port), self.fetch,
                                       parse_router_metrics)
