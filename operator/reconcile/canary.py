"""The canary's I/O edge (issue 22): each reconcile of a fleet whose rollout strategy is Canary,
read the router pods' /metrics for the new revision pair, call the pure core
(operator/rollout/canary.py: ``decide``) and post an event when it advances, promotes or aborts.

What it decides reaches the cluster through the reconcile's normal writes only: the weight as the
``pdfleet.io/canary-weight`` label on the new pair's engine Services (the router reads it from their
EndpointSlices; its own pod template never changes), the state in status.rollout (written once,
with the rest of the status). A step's window starts at the first scrape after the step began; an
operator restart starts a new window in the same step (the pause, kept in status as a wall-clock
time, is not restarted), so it never advances on figures it did not see.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

import aiohttp

from pdfleet.contract.labels import ROLE_DECODE, ROLLOUT
from pdfleet.contract.ports import HTTP_NAME
from pdfleet.operator.api import DisaggregatedInference
from pdfleet.operator.autoscale.planner_edge import _fetch
from pdfleet.operator.observability.metrics_text import WENT_DOWN, MetricsError
from pdfleet.operator.kube import front_ends
from pdfleet.operator.reconcile_plan.children import ObservedPod
from pdfleet.operator.api import event_reasons as reasons
from pdfleet.operator.rollout.paired import CanaryOutcome, CanaryRecord, Decision
from pdfleet.operator.rollout import canary
from pdfleet.operator.rollout.signals import (
    RevisionSample,
    decode_recomputed,
    parse_decode_recomputed,
    parse_revision_sample,
    step_signals,
    went_down,
)

Key = tuple[str, str]
PostEvent = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]
Fetch = Callable[[str], Awaitable[str]]
Window = tuple[str, int]  # (revision, step index)


@dataclass(frozen=True)
class Snapshot:
    """One scrape: every ready router pod's figures for the revision, and (when the analysis has a
    maxRecomputeRate) every ready decode pod of the revision's recomputed count."""

    routers: Mapping[str, RevisionSample]
    decodes: Optional[Mapping[str, float]] = None  # None: not read (not needed)


def steps_of(cr: DisaggregatedInference) -> tuple[canary.Step, ...]:
    c = cr.spec.rollout.canary
    return tuple(canary.Step(s.weight, float(s.pause_seconds)) for s in c.steps) if c else ()


def analysis_of(cr: DisaggregatedInference) -> canary.Analysis:
    c = cr.spec.rollout.canary
    if c is None:
        return canary.Analysis()
    a = c.analysis
    return canary.Analysis(a.ttft_ms, a.itl_ms, a.max_error_rate, a.min_requests, a.max_recompute_rate)


class CanaryEdge:
    def __init__(self, post_event: PostEvent, *, fetch: Fetch = _fetch, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 count_rejected: Callable[[str, int], None] = lambda reason, n: None):
        self.post_event = post_event
        self.fetch = fetch
        self.count_rejected = count_rejected  # figures skipped (a router's counts went down within a step)
        self.interval_s = interval_s
        self.clock = clock
        self._baseline: dict[Key, tuple[Window, Snapshot]] = {}
        self._last: dict[Key, tuple[Window, float, canary.Signals, Optional[str], Optional[Snapshot]]] = {}

    def forget(self, key: Key) -> None:
        self._baseline.pop(key, None)
        self._last.pop(key, None)

    async def step(self, key: Key, body: Mapping[str, Any], cr: DisaggregatedInference,
                   pods: Sequence[ObservedPod], decision: Decision, record: Optional[CanaryRecord],
                   now: float) -> CanaryOutcome:
        """``decision``: the paired rollout's, computed with hold; ``record``: from status; ``now``: unix s."""
        if cr.spec.rollout.strategy != "Canary" or cr.spec.rollout.canary is None:
            self.forget(key)
            return CanaryOutcome()
        target = decision.target
        rec = record if record is not None and record.revision == target else None
        if decision.phase != "Canary" or (rec is not None and rec.state.phase != canary.PROGRESSING):
            # no new pair ready to compare yet, or the canary is over: report what is known
            weight = None
            if rec is not None and decision.serving != target:
                weight = 0 if rec.state.phase == canary.ABORTED else rec.weight
            return CanaryOutcome(rec, weight)

        steps, analysis = steps_of(cr), analysis_of(cr)
        annotation = ((body.get("metadata") or {}).get("annotations") or {}).get(ROLLOUT)
        if rec is None:
            stale, _ = canary.effective_override(annotation, None)
            rec = CanaryRecord(target, canary.State(canary.PROGRESSING, 0, now), steps[0].weight,
                               "started: waiting for the first analysis", stale)
            await self.post_event(body, reasons.NORMAL, reasons.CANARY_STARTED,
                                  f"revision {target} takes {steps[0].weight}% of new requests beside "
                                  f"{decision.serving} (step 1 of {len(steps)})")
        override, stale = canary.effective_override(annotation, rec.stale_override)
        window = (target, rec.state.step)
        signals, trouble, samples = await self._signals(key, window, pods, cr)
        d = canary.decide(rec.state, steps, analysis, signals, now, override)
        why = f"{trouble}; {d.reason}" if trouble and d.action == "hold" else d.reason
        new = CanaryRecord(target, d.state, d.weight, why, stale)
        if d.action == "advance":
            if samples is not None:  # the next step's window starts now
                self._baseline[key] = ((target, d.state.step), samples)
            self._last.pop(key, None)
            await self.post_event(body, reasons.NORMAL, reasons.CANARY_STEP_ADVANCED,
                                  f"{d.reason}; step {d.state.step + 1} of {len(steps)}: {d.weight}% of new "
                                  f"requests to {target}")
        elif d.action == canary.PROMOTE:
            self.forget(key)
            await self.post_event(body, reasons.NORMAL, reasons.CANARY_PROMOTED, f"revision {target} promoted: {d.reason}")
        elif d.action == canary.ABORT:
            self.forget(key)
            await self.post_event(body, reasons.WARNING, reasons.CANARY_ABORTED, f"revision {target} aborted, weight 0: {d.reason}")
        requeue = None
        if d.state.phase == canary.PROGRESSING:
            left = steps[d.state.step].pause_s - (now - d.state.step_started)
            requeue = max(0.05, min(self.interval_s, left)) if left > 0 else self.interval_s
        return CanaryOutcome(new, d.weight if d.state.phase != canary.PROMOTED else None, requeue)

    async def _signals(self, key: Key, window: Window, pods: Sequence[ObservedPod], cr: DisaggregatedInference,
                       ) -> tuple[canary.Signals, Optional[str], Optional[Snapshot]]:
        """The window's figures, scraped at most once per interval (reconciles come often)."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and last[0] == window and now - last[1] < self.interval_s:
            return last[2], last[3], last[4]
        routers, failures = await self._scrape(pods, cr, window[0])
        decodes: Optional[dict[str, float]] = None
        trouble: Optional[str] = None
        if analysis_of(cr).max_recompute_rate is not None:
            decodes, decode_failures = await self._scrape_decodes(pods, cr, window[0])
            if decode_failures or not decodes:
                trouble = f"waiting: no decode metrics ({'; '.join(decode_failures) or 'no ready decode pod'})"
        base = self._baseline.get(key)
        snapshot: Optional[Snapshot] = None
        if not routers:
            signals = canary.Signals(0, 0)
            trouble = f"waiting: no router metrics ({'; '.join(failures) or front_ends.NONE_READY})"
        elif trouble is not None:  # a window never starts on figures it cannot see in full
            signals = canary.Signals(0, 0)
        else:
            snapshot = Snapshot(routers, decodes)
            if base is None or base[0] != window:
                self._baseline[key] = (window, snapshot)
                signals = canary.Signals(0, 0)
            else:
                recomputed = None
                if decodes is not None:
                    recomputed = decode_recomputed(base[1].decodes or {}, decodes,
                                                   cr.spec.decode.tensor_parallel_size)
                if down := went_down(base[1].routers, routers):  # not monotonic: skipped, counted
                    self.count_rejected(WENT_DOWN, len(down))
                    rebased = replace(base[1], routers={**base[1].routers, **{p: routers[p] for p in down}})
                    self._baseline[key] = base = (window, rebased)
                signals = step_signals(base[1].routers, routers, recomputed)
        self._last[key] = (window, now, signals, trouble, snapshot)
        return signals, trouble, snapshot

    async def _scrape_decodes(self, pods: Sequence[ObservedPod], cr: DisaggregatedInference,
                              revision: str) -> tuple[dict[str, float], list[str]]:
        """The revision's ready decode pods' recomputed counts (their vLLM server's /metrics)."""
        decodes = [p for p in pods if p.role == ROLE_DECODE and p.revision == revision and p.ready and p.ip
                   and not p.deleting and not p.worker]

        async def one(pod: ObservedPod) -> tuple[str, Any]:
            port = dict(pod.ports).get(HTTP_NAME, cr.spec.engine.port)
            try:
                return pod.name, parse_decode_recomputed(await self.fetch(f"http://{pod.ip}:{port}/metrics"))
            except (MetricsError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return pod.name, f"{pod.name}: {type(exc).__name__} {exc}".strip()

        results = await asyncio.gather(*(one(p) for p in decodes))
        return ({name: r for name, r in results if isinstance(r, float)},
                [r for _, r in results if isinstance(r, str)])

    async def _scrape(self, pods: Sequence[ObservedPod], cr: DisaggregatedInference,
                      revision: str) -> tuple[dict[str, RevisionSample], list[str]]:
        """Every ready front end's figures for the revision: the routers' and the Endpoint Pickers'
        (kube/front_ends.py), so a canary served through the Gateway is judged on what it served."""
        return await front_ends.scrape(front_ends.metrics_targets(pods, cr.spec.router.port), self.fetch,
                                       lambda text: parse_revision_sample(text, revision))
