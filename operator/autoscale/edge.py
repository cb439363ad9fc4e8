"""The scalers' writes (I/O edge of scalers.py): create, delete, status, events, and the
serving pair's size during a paired rollout. Called once per reconcile by the reconciler."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Mapping, Sequence

from pdfleet.operator.autoscale.scalers import SCALER_KIND, WITHIN_BOUNDS, ScalingPlan
from pdfleet.operator.plan.kinds import STATEFULSET
from pdfleet.operator.kube.observed import ChildRef, ObservedChild
from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.api import event_reasons as reasons

logger = logging.getLogger("pdfleet.operator")
STS_KIND = STATEFULSET
PostEvent = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]


class ScalingEdge:
    def __init__(self, client: KubeClient, post_event: PostEvent):
        self.client = client
        self.post_event = post_event
        self._reported: dict[tuple[str, str], str] = {}   # fleet -> last clamp summary sent as an event

    def forget(self, key: tuple[str, str]) -> None:
        self._reported.pop(key, None)

    async def sync(self, key: tuple[str, str], body: Mapping[str, Any], plan: ScalingPlan,
                   children: Sequence[ObservedChild], *, serving: str, target: str) -> list[str]:
        """Make the scalers and the serving pair match `plan`; the errors, for the fleet's status."""
        namespace = key[0]
        errors: list[str] = []
        for manifest in plan.create:
            try:
                await self.client.create(SCALER_KIND, manifest)
            except ApiFailure as exc:
                if exc.status != 409:  # already there: the watch has not told us yet
                    errors.append(f"create scaler {manifest['metadata']['name']}: {exc.status} {exc.message}")
        for scaler in plan.delete:
            try:
                await self.client.delete(ChildRef(SCALER_KIND.api_version, SCALER_KIND.kind, namespace, scaler.name),
                                         SCALER_KIND, uid=scaler.uid)
            except ApiFailure as exc:
                errors.append(f"delete scaler {scaler.name}: {exc.status} {exc.message}")
        for name, status in plan.status_patches:
            try:
                await self.client.patch_status(SCALER_KIND, namespace, name, status)
            except ApiFailure as exc:
                if exc.status != 404:
                    errors.append(f"status of scaler {name}: {exc.status} {exc.message}")
        if plan.result is not None and serving != target:
            errors += await self._scale_serving_pair(namespace, plan, children, serving)
        await self._report(key, body, plan)
        return errors

    async def _scale_serving_pair(self, namespace: str, plan: ScalingPlan, children: Sequence[ObservedChild],
                                  serving: str) -> list[str]:
        """During a paired rollout the old pair still takes all traffic: it follows the scalers too
        (the new pair gets the same size through the plan)."""
        assert plan.result is not None
        errors = []
        for c in children:
            if (c.ref.kind != STS_KIND.kind or c.revision != serving or c.deleting or c.role not in plan.autoscaled
                    or c.replicas == plan.result.replicas[c.role]):
                continue
            try:
                await self.client.merge_patch(c.ref, STS_KIND, {"spec": {"replicas": plan.result.replicas[c.role]}})
            except ApiFailure as exc:
                errors.append(f"scale {c.ref}: {exc.status} {exc.message}")
        return errors

    async def _report(self, key: tuple[str, str], body: Mapping[str, Any], plan: ScalingPlan) -> None:
        summary = plan.clamp_summary()
        if summary == self._reported.get(key, ""):
            return
        self._reported[key] = summary
        if summary:
            logger.info("%s/%s: scaler replicas clamped: %s", key[0], key[1], summary)
            await self.post_event(body, reasons.WARNING, reasons.SCALING_CLAMPED, f"scaler replicas clamped: {summary}")
        else:
            await self.post_event(body, reasons.NORMAL, reasons.SCALING_WITHIN_BOUNDS, WITHIN_BOUNDS)

