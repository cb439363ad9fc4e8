"""Scale to zero's I/O edge: read the fleet's front ends' /metrics (the waiting gauge, the activations and
request counters, what is in flight), call the pure decision (scale_to_zero.py) and write both scalers through
``/scale`` by server-side apply as SCALE_TO_ZERO_MANAGER, so that an HPA's or KEDA's writes (updates of
``/scale``) and GitOps (which never sets a scaler) keep working. Called by the reconciler after the planner,
so that its writes are the last word; the reconcile is requeued for the next read.

A write is remembered until the scaler shows it (or someone else changed the value meanwhile): a
reconcile that runs before the watch brings the new value back never writes it a second time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

from pdfleet.operator.api import DisaggregatedInference
from pdfleet.operator.api import event_reasons as reasons
from pdfleet.operator.api import scaler as scaler_api
from pdfleet.operator.api.rules import scale_to_zero_on
from pdfleet.operator.autoscale import scale_to_zero as stz
from pdfleet.operator.autoscale.scalers import SCALER_KIND, ScalingPlan
from pdfleet.operator.kube import front_ends
from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.kube.observed import ObservedPod

logger = logging.getLogger("pdfleet.operator")
SCALE_TO_ZERO_MANAGER = "pdfleet-scale-to-zero"
Key = tuple[str, str]
PostEvent = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]
Fetch = Callable[[str], Awaitable[str]]
EVENTS = {stz.ACTIVATE: reasons.PAIR_ACTIVATED, stz.RETIRE: reasons.PAIR_RETIRED, stz.COMPLETE: reasons.PAIR_COMPLETED}


@dataclass(frozen=True)
class ScaleToZeroOutcome:
    requeue_after: Optional[float] = None
    condition: Optional[tuple[bool, str, str]] = None   # ScaledToZero (status, reason, message)
    action: str = stz.HOLD


@dataclass
class _Fleet:
    samples: Optional[dict[str, stz.FrontEndSample]] = None
    state: stz.PairState = stz.PairState()
    pending: Optional[dict[str, tuple[int, int]]] = None   # role -> (value seen when written, value written)
    next_read: float = -1e18
    waiting: int = 0


def effective(requested: Mapping[str, int], pending: Mapping[str, tuple[int, int]]) -> tuple[dict[str, int],
                                                                                          dict[str, tuple[int, int]]]:
    """The scalers' values with this edge's writes the watch has not shown yet (pure); the writes still pending."""
    out, still = dict(requested), {}
    for role, (seen, wrote) in pending.items():
        if requested.get(role) == seen:   # not caught up yet, and nobody else changed it
            out[role] = wrote
            still[role] = (seen, wrote)
    return out, still


class ScaleToZeroEdge:
    def __init__(self, client: KubeClient, post_event: PostEvent, *, fetch: Fetch,
                 clock: Callable[[], float] = time.monotonic,
                 count: Callable[[str, str, str], None] = lambda action, namespace, name: None):
        self.client = client
        self.post_event = post_event
        self.fetch = fetch
        self.clock = clock
        self.count = count
        self._fleets: dict[Key, _Fleet] = {}

    def forget(self, key: Key) -> None:
        self._fleets.pop(key, None)

    async def run(self, key: Key, body: Mapping[str, Any], cr: DisaggregatedInference, pods: Sequence[ObservedPod],
                  plan: ScalingPlan) -> ScaleToZeroOutcome:
        spec = cr.spec.scaling.scale_to_zero
        if spec is None or not scale_to_zero_on(cr.spec) or plan.result is None or len(plan.autoscaled) < 2:
            self.forget(key)
            return ScaleToZeroOutcome()
        fleet = self._fleets.setdefault(key, _Fleet())
        replicas, fleet.pending = effective(plan.result.requested, fleet.pending or {})
        now = self.clock()
        if now >= fleet.next_read:
            replicas = await self._step(key, body, cr, pods, fleet, replicas, plan.result.requested, now,
                                        float(spec.idle_seconds))
            fleet.next_read = now + stz.poll_interval(replicas, float(spec.idle_seconds))
        ready = {r: sum(1 for p in pods if p.role == r and p.ready and not p.deleting) for r in stz.ROLES}
        return ScaleToZeroOutcome(max(0.05, fleet.next_read - now), stz.condition(replicas, ready, fleet.waiting))

    async def _step(self, key: Key, body: Mapping[str, Any], cr: DisaggregatedInference, pods: Sequence[ObservedPod],
                    fleet: _Fleet, replicas: dict[str, int], observed: Mapping[str, int], now: float,
                    idle_seconds: float) -> dict[str, int]:
        cur, _ = await front_ends.scrape(front_ends.metrics_targets(pods, cr.spec.router.port), self.fetch,
                                                stz.parse_front_end)
        obs = stz.observe(fleet.samples, cur) if cur else None
        if cur:
            fleet.samples = cur
            fleet.waiting = obs.waiting if obs is not None else 0
        decision = stz.decide(now, obs, replicas, fleet.state, idle_seconds)
        fleet.state = decision.state
        if not decision.writes:
            return replicas
        changed = []
        for role, value in decision.writes.items():
            name = scaler_api.scaler_name(cr.metadata.name, role)
            try:
                await self.client.apply_scale(SCALER_KIND, key[0], name, value, SCALE_TO_ZERO_MANAGER)
            except ApiFailure as exc:
                logger.warning("%s/%s: scale to zero could not scale %s to %d: %s", key[0], key[1], name, value, exc)
                continue
            fleet.pending = {**(fleet.pending or {}), role: (observed[role], value)}
            changed.append(f"{role} {replicas[role]} -> {value}")
            replicas = {**replicas, role: value}
        if changed:
            self.count(decision.action, *key)
            message = f"{', '.join(changed)}: {decision.reason}"
            logger.info("%s/%s: scale to zero: %s", key[0], key[1], message)
            await self.post_event(body, reasons.NORMAL, EVENTS[decision.action], message)
        return replicas
