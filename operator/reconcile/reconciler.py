"""One reconcile of one DisaggregatedInference, the I/O edge: gather, execute, write the status.

What to write and report is decided by the pure steps of reconcile_plan/plan.py; this module gathers
what they read and carries out what they decide. It reads the API only where no watch can see:
the CR comes from the watch (kopf event handler), children and pods from kopf indexes fed by
label-selected watches. It writes only what differs, and the status once, only when it changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

from pdfleet.contract import labels as label_keys
from pdfleet.operator import api
from pdfleet.operator.autoscale.edge import ScalingEdge
from pdfleet.operator.autoscale.planner_edge import PlannerEdge, _fetch
from pdfleet.operator.autoscale.scale_to_zero import ACTIVATE, RETIRE
from pdfleet.operator.autoscale.scale_to_zero_edge import ScaleToZeroEdge
from pdfleet.operator.observability import prefix_routing
from pdfleet.operator.observability.metrics_text import rejected_values
from pdfleet.operator.kube.observed import LWS_NAME_LABEL, ObservedReplicaSet
from pdfleet.operator.autoscale.scalers import ObservedScaler, scaling_condition
from pdfleet.operator.plan import kinds
from pdfleet.operator.plan.drain import rollout_drain_seconds
from pdfleet.operator.reconcile_plan import children as ch
from pdfleet.operator.reconcile_plan import status as st
from pdfleet.operator.reconcile_plan.plan import (
    Event, Observed, Plan, Settings, canary_gate, check_spec, guard, owned_children, reconcile_plan, refusal, settle,
)
from pdfleet.operator.rollout import paired as rollout
from pdfleet.operator.reconcile.canary import CanaryEdge
from pdfleet.operator.reconcile.auth_secret import AuthSecrets
from pdfleet.operator.reconcile.referenced_secrets import ReferencedSecrets
from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.reconcile.logs import fleet_extra
from pdfleet.operator.reconcile_plan.ownership import ownership
from pdfleet.operator.reconcile.metrics import OperatorMetrics
from pdfleet.operator.reconcile.workqueue import WorkQueue

logger = logging.getLogger("pdfleet.operator")

Key = tuple[str, str]  # (namespace, name)
CR_KIND = ch.Kind(api.API_VERSION, api.KIND, api.PLURAL)


@dataclasses.dataclass
class ReconcileOptions:
    default_image: str = "ghcr.io/pdfleet/pdfleet-runtime:latest"
    drain_seconds: float = float(rollout_drain_seconds())  # derived from the router's timeouts (plan/drain.py)
    workers: int = 4
    apply_concurrency: int = 8
    instance: str = "pdfleet-operator"
    # Gang providers whose PodGroup CRD the cluster has and the operator may write (chart values).
    gang_providers: tuple[str, ...] = ()
    canary_interval_s: float = 5.0  # a canary's analysis scrapes the routers at most this often
    prefix_routing_interval_s: float = 30.0  # the front ends' tokenizer state is read at most this often


class ReconcileError(Exception):
    """Some writes failed (after retries); the status says so and the fleet is retried later."""

    expected = True  # logged without a traceback: the API said no, the code did not break


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 patch turning `old` into `new` (lists are replaced whole)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old or old[k] != v:
            out[k] = merge_patch(old.get(k), v) if isinstance(v, dict) else v
    return out


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.timezone.utc)


class Reconciler:
    def __init__(self, client: KubeClient, metrics: OperatorMetrics, options: ReconcileOptions,
                 snapshot: Callable[[Key], tuple[list[ch.ObservedChild], list[ch.ObservedPod]]],
                 *, clock: Callable[[], datetime.datetime] = _utcnow,
                 scalers: Callable[[Key], list[ObservedScaler]] = lambda key: [],
                 autoscalers: Callable[[Key], list[str]] = lambda scaler_key: [],
                 replicasets: Callable[[Key], list[ObservedReplicaSet]] = lambda key: []):
        self.client = client
        self.metrics = metrics
        self.options = options
        self.snapshot = snapshot
        self.clock = clock
        self.crs: dict[Key, dict[str, Any]] = {}
        self.recently_applied: dict[Key, dict[ch.ChildRef, str]] = {}
        self._reported: dict[Key, tuple[Any, ...]] = {}
        self._not_owned_reported: dict[Key, Optional[str]] = {}
        self._secret_missing_reported: dict[Key, Optional[str]] = {}
        self._causes_reported: dict[Key, frozenset[tuple[str, str, str]]] = {}  # pods' causes with an event
        self._prefix_read: dict[Key, tuple[float, Any]] = {}  # when PrefixRouting was read, and what it said
        self._unowned_seen: dict[Key, set[tuple[str, str, str]]] = {}  # (kind, name, uid) counted and logged
        self.replicasets = replicasets
        self.queue = WorkQueue(self.reconcile, workers=options.workers)
        self.auth_secrets = AuthSecrets(client)
        self.referenced_secrets = ReferencedSecrets(client)
        self._apply_slots = asyncio.Semaphore(options.apply_concurrency)
        self.runs = 0
        self.scalers = scalers
        self.scaling = ScalingEdge(client, self._event)
        self.autoscalers = autoscalers   # (namespace, scaler name) -> HPAs that target it
        self.planner = PlannerEdge(client, self._event, fetch=self._screened_fetch,
                                   count_rejected=self._count_rejected)
        self.scale_to_zero = ScaleToZeroEdge(client, self._event, fetch=self._screened_fetch,
                                             count=self._count_pair)
        self.canary = CanaryEdge(self._event, interval_s=options.canary_interval_s, fetch=self._screened_fetch,
                                 count_rejected=self._count_rejected)

    @property
    def settings(self) -> Settings:
        return Settings(self.options.default_image, self.options.drain_seconds, tuple(self.options.gang_providers))

    async def _prefix_routing(self, key: Key, plan: Any) -> tuple[Optional[tuple[str, str, str]], Optional[float]]:
        """PrefixRouting from the front ends' /metrics, read at most once per interval per fleet (monotonic);
        until it is True (no front end read yet, a tokenizer loading or failing), read again after the interval:
        a fix (a Secret, a mount) may come with no event on the fleet."""
        interval = self.options.prefix_routing_interval_s
        now = time.monotonic()
        last = self._prefix_read.get(key)
        if last is None or now - last[0] >= interval:
            last = self._prefix_read[key] = (now, await prefix_routing.read(plan.cr.spec, plan.gate.pods,
                                                                           self._screened_fetch))
        cond = last[1]
        return cond, (interval if cond is not None and cond[0] != "True" else None)

    async def _screened_fetch(self, url: str) -> str:
        """A router's /metrics page; the values the parsers will skip (NaN, negative) are counted here."""
        text = await _fetch(url)
        for reason, n in rejected_values(text).items():
            self._count_rejected(reason, n)
        return text

    def _count_rejected(self, reason: str, n: int = 1) -> None:
        self.metrics.scraped_rejected.labels(reason).inc(n)

    def _count_pair(self, action: str, namespace: str, name: str) -> None:
        counter = {ACTIVATE: self.metrics.pair_activations, RETIRE: self.metrics.pair_retirements}.get(action)
        if counter is not None:
            counter.labels(namespace, name).inc()

    # ------------------------------------------------------------------ watch side
    def on_cr_event(self, event_type: Optional[str], body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        if event_type == "DELETED":
            self.crs.pop(key, None)
            self.recently_applied.pop(key, None)
            self._reported.pop(key, None)
            self._not_owned_reported.pop(key, None)
            self._secret_missing_reported.pop(key, None)
            self._causes_reported.pop(key, None)
            self._prefix_read.pop(key, None)
            self.referenced_secrets.forget(key[0])
            self._unowned_seen.pop(key, None)
            self.scaling.forget(key)
            self.planner.forget(key)
            self.scale_to_zero.forget(key)
            self.canary.forget(key)
            self.auth_secrets.forget(*key)
            self.queue.forget(key)
            self.metrics.forget_fleet(*key)
        else:
            self.crs[key] = dict(body)
            self.queue.add(key)
        self.metrics.fleets.set(len(self.crs))

    def on_child_event(self, event_type: Optional[str], body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        fleet = (meta.get("labels") or {}).get(ch.FLEET_LABEL)
        if not fleet:
            return
        key = (meta.get("namespace") or "", fleet)
        if event_type == "DELETED" and body.get("kind") != "Pod":
            self.recently_applied.get(key, {}).pop(ch.ChildRef.of(body), None)
        if key in self.crs:
            self.queue.add(key)

    # ------------------------------------------------------------------ the reconcile
    async def reconcile(self, key: Hashable) -> Optional[float]:
        assert isinstance(key, tuple)
        body = self.crs.get(key)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None  # gone or going: ownerReferences let the garbage collector remove the children
        started = time.perf_counter()
        self.runs += 1
        try:
            requeue, result = await self._reconcile(key, body)
        except Exception as exc:
            self.metrics.reconciles.labels("error").inc()
            self.metrics.errors.labels(type(exc).__name__).inc()
            raise
        finally:
            self.metrics.duration.observe(time.perf_counter() - started)
        self.metrics.reconciles.labels(result).inc()
        return requeue

    async def _lws_statefulsets(self, namespace: str, owned: list[ch.ObservedChild]) -> list[ch.ObservedChild]:
        """The LWS controller's StatefulSets of the fleet's LeaderWorkerSets (they carry no pdfleet
        label, so no watch sees them): the links from an LWS pod up to its LWS (kube/owned.py)."""
        names = sorted(c.ref.name for c in owned if c.ref.kind == kinds.LWS.kind and not c.deleting)
        if not names:
            return []
        selector = f"{LWS_NAME_LABEL} in ({','.join(names)})"
        return [ch.observe_child(o) for o in await self.client.list_labelled(kinds.STATEFULSET, namespace, selector)]

    def _observe(self, key: Key, body: Mapping[str, Any]) -> Observed:
        """What the indexes hold for the fleet (no API read)."""
        children, pods = self.snapshot(key)
        return Observed(body=body, now=self.clock(), settings=self.settings, children=tuple(children),
                        pods=tuple(pods), replicasets=tuple(self.replicasets(key)), scalers=tuple(self.scalers(key)),
                        recently_applied=self.recently_applied.get(key, {}), reported=self._reported.get(key),
                        causes_reported=self._causes_reported.get(key, frozenset()))

    async def _reconcile(self, key: Key, body: Mapping[str, Any]) -> tuple[Optional[float], str]:
        """gather -> plan (pure) -> execute -> settle (pure) -> status write (reconcile_plan/plan.py)."""
        namespace, name = key
        log = logging.LoggerAdapter(logger, fleet_extra(namespace, name))

        # gather: the indexes (no API read), the LWS controller's StatefulSets no watch sees, the canary's scrape
        observed = self._observe(key, body)
        cr, problems = check_spec(body, self.settings)
        if cr is None:
            return await self._refuse(key, body, refusal(observed, problems), log)
        lws = await self._lws_statefulsets(namespace, owned_children(observed.children, observed.uid))
        observed = dataclasses.replace(observed, lws_statefulsets=tuple(lws))
        gate = canary_gate(observed, cr)
        assert gate is not None
        observed = dataclasses.replace(observed, canary=await self.canary.step(
            key, body, gate.cr, gate.pods, gate.decision, gate.record, observed.now.timestamp()))
        plan = reconcile_plan(observed, gate)
        assert plan.gate is not None and plan.cr is not None and plan.decision is not None
        self._report_unowned(key, log, plan.gate.ignored)
        self.metrics.children.labels(namespace, name).set(len(plan.desired))

        # execute: the key Secret, the owner checks, the writes
        recent = self.recently_applied.setdefault(key, {})
        for ref in plan.caught_up:
            recent.pop(ref, None)
        errors: list[str] = []
        # The side-channel key Secret the engines mount (created once; its data never read).
        secret_error, secret_foreign = await self.auth_secrets.ensure(namespace, name, plan.cr.spec, plan.owner)
        if secret_error:
            errors.append(secret_error)
        foreign, unchecked, errs = await self._foreign(plan.actions.apply, observed.children, plan.gate.owned,
                                                       recent, observed.uid)
        errors += errs
        # The Secrets the spec names (read, their key names kept): no workload is written while one is missing.
        seen = await self.referenced_secrets.check(namespace, plan.secret_refs)
        guarded = guard(plan, foreign=foreign, unchecked=unchecked, secret_foreign=secret_foreign, name=name,
                        last_not_owned=self._not_owned_reported.get(key), secrets_seen=seen,
                        last_secret_missing=self._secret_missing_reported.get(key))
        if self._secret_missing_reported.get(key) != guarded.secret_missing:
            self._secret_missing_reported[key] = guarded.secret_missing
            if guarded.secret_missing:
                log.warning("%s", guarded.secret_missing)
        if self._not_owned_reported.get(key) != guarded.not_owned:  # one event per change, not per retry
            self._not_owned_reported[key] = guarded.not_owned
            if guarded.not_owned:
                log.warning("%s", guarded.not_owned)
        await self._post(body, guarded.events_before)
        actions = guarded.actions
        if actions.apply or actions.delete:
            errors += await self._write_children(key, actions, plan.gate.owned)
            log.info("created %d, updated %d, deleted %d children (%d unchanged)%s",
                     guarded.created, guarded.updated, len(actions.delete), actions.unchanged,
                     f"; {len(errors)} failed" if errors else "")
            await self._post(body, guarded.events_after)
        errors += await self._merge_patch_children("unmark", [(c, rollout.unmark_serving()) for c in plan.unmark])
        for child, keys in guarded.actions.strip:
            logger.warning("removing labels %s from %s: the plan does not set them", ", ".join(keys), child.ref)
        errors += await self._merge_patch_children("strip labels of", [(c, ch.strip_labels_patch(k))
                                                                       for c, k in guarded.actions.strip])
        errors += await self.scaling.sync(key, body, plan.scaling, plan.gate.owned, serving=plan.decision.serving,
                                          target=plan.gate.target)
        conflicts = [f"HorizontalPodAutoscaler/{h}" for role in plan.scaling.autoscaled
                     for h in self.autoscalers((namespace, f"{name}-{role}"))]
        planned = await self.planner.run(key, body, plan.cr, plan.gate.pods, plan.scaling, conflicts)
        # after the planner: the pair's 0 <-> 1 is the last word of this reconcile
        zero = await self.scale_to_zero.run(key, body, plan.cr, plan.gate.pods, plan.scaling)

        # settle: the last events and the status, written once
        prefix_condition, prefix_requeue = await self._prefix_routing(key, plan)
        done = settle(plan, guarded, now=observed.now, errors=errors, planner_status=planned.status,
                      planner_requeue=planned.requeue_after, scaling_condition=scaling_condition(plan.scaling),
                      prefix_routing=prefix_condition, prefix_requeue=prefix_requeue,
                      scaled_to_zero=zero.condition, scale_to_zero_requeue=zero.requeue_after)
        await self._post(body, done.events)
        self._causes_reported[key] = done.causes_reported
        await self._write_status(key, body, plan.previous, done.status)
        self.metrics.observe_fleet(namespace, name, done.status, plan.want)
        if done.error:  # retried with backoff: the user may remove what is in the way
            raise ReconcileError(done.error)
        return done.requeue_after, done.result

    async def _refuse(self, key: Key, body: Mapping[str, Any], plan: Plan,
                      log: logging.LoggerAdapter) -> tuple[Optional[float], str]:
        """An invalid spec: the status says why, one event per change; nothing else is written."""
        assert plan.status is not None
        await self._write_status(key, body, plan.previous, plan.status)
        self.metrics.observe_fleet(*key, plan.status, {})
        if plan.report is not None:
            self._reported[key] = plan.report
            log.warning("invalid spec: %s", "; ".join(plan.refused))
            await self._post(body, plan.events)
        return None, "invalid"

    async def _post(self, body: Mapping[str, Any], events: Sequence[Event]) -> None:
        for e in events:
            await self._event(body, e.type, e.reason, e.message)

    def _report_unowned(self, key: Key, log: logging.LoggerAdapter,
                        ignored: Sequence[tuple[str, str, str, str]]) -> None:
        """Count and log each ignored object once (not per reconcile)."""
        seen = self._unowned_seen.setdefault(key, set())
        now = {(kind, name, uid) for kind, name, uid, _ in ignored}
        for kind, name, uid, why in ignored:
            if (kind, name, uid) not in seen:
                self.metrics.unowned_ignored.labels(kind).inc()
                log.warning("ignoring %s/%s: it has the fleet's labels but %s", kind, name, why)
        seen.intersection_update(now)
        seen.update(now)

    async def _merge_patch_children(self, what: str, patches: Sequence[tuple[ch.ObservedChild, Mapping[str, Any]]]
                                    ) -> list[str]:
        """Label patches after the writes: the previous revision's serving marks (after the new
        revision's were set, in the writes before this) and the fleet's labels put on by hand."""
        errors = []
        for child, patch in patches:
            try:
                await self.client.merge_patch(child.ref, ch.kind_of({"apiVersion": child.ref.api_version,
                                                                    "kind": child.ref.kind}), patch)
            except ApiFailure as exc:
                if exc.status != 404:  # gone (e.g. the drain ended): nothing left to patch
                    errors.append(f"{what} {child.ref}: {exc.status} {exc.message}")
        return errors

    async def _foreign(self, apply: Sequence[Mapping[str, Any]], observed: Sequence[ch.ObservedChild],
                       owned: Sequence[ch.ObservedChild], recent: Mapping[ch.ChildRef, str],
                       uid: str) -> tuple[list[ch.ChildRef], list[ch.ChildRef], list[str]]:
        """Children about to be written over an object the fleet does not own, those whose
        owner could not be checked (not written either), and the read errors.

        The watches see only labelled objects: one of a child's name without the fleet's
        labels (a user's own Deployment) is looked up once, metadata only, before the
        first write; ours from a moment ago (not yet watched) is in `recent`."""
        owned_refs = {c.ref for c in owned}
        seen = {c.ref: c for c in observed}
        foreign, unchecked, errors = [], [], []
        for obj in apply:
            ref = ch.ChildRef.of(obj)
            if ref in owned_refs or ref in recent:
                continue
            if ref in seen:  # labelled like ours, not controlled by this fleet
                foreign.append(ref)
                continue
            try:
                meta = await self.client.get_metadata(ch.kind_of(obj), ref.namespace, ref.name)
            except ApiFailure as exc:
                unchecked.append(ref)
                errors.append(f"check owner of {ref}: {exc.status or 'connection error'} {exc.message}")
                continue
            if ownership(meta, uid) == "foreign":
                foreign.append(ref)
        return foreign, unchecked, errors

    async def _write_children(self, key: Key, actions: ch.Actions, owned: Sequence[ch.ObservedChild]) -> list[str]:
        recent = self.recently_applied.setdefault(key, {})

        async def apply(obj: Mapping[str, Any]) -> Optional[str]:
            async with self._apply_slots:
                try:
                    await self.client.apply(obj)
                except ApiFailure as exc:
                    return f"apply {ch.ChildRef.of(obj)}: {exc.status} {exc.message}"
            recent[ch.ChildRef.of(obj)] = obj["metadata"]["annotations"][ch.HASH_ANNOTATION]
            return None

        async def delete(child: ch.ObservedChild) -> Optional[str]:
            async with self._apply_slots:
                try:
                    await self.client.delete(child.ref, ch.kind_of({"apiVersion": child.ref.api_version,
                                                                    "kind": child.ref.kind}), uid=child.uid)
                except ApiFailure as exc:
                    return f"delete {child.ref}: {exc.status} {exc.message}"
            recent.pop(child.ref, None)
            return None

        # Service accounts, roles and configs first: pods that start need them.
        first = [o for o in actions.apply if o["kind"] not in ch.WORKLOAD_KINDS]
        then = [o for o in actions.apply if o["kind"] in ch.WORKLOAD_KINDS]
        results = list(await asyncio.gather(*(apply(o) for o in first)))
        results += await asyncio.gather(*(apply(o) for o in then))
        results += await asyncio.gather(*(delete(c) for c in actions.delete))
        return [r for r in results if r]

    async def _write_status(self, key: Key, body: Mapping[str, Any], previous: Mapping[str, Any],
                            status: Mapping[str, Any]) -> None:
        if st.status_equal(previous, status):
            return
        namespace, name = key
        try:
            updated = await self.client.patch_status(CR_KIND, namespace, name, merge_patch(dict(previous), dict(status)))
        except ApiFailure as exc:
            if exc.status == 404:
                return  # the CR is gone
            raise
        if isinstance(updated, dict) and key in self.crs:
            self.crs[key] = updated  # our own write; the watch event confirms it shortly

    async def _event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        now = ch_time(self.clock())
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "name": meta["name"],
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "pdfleet-operator"},
            "reportingComponent": label_keys.REPORTING_COMPONENT, "reportingInstance": self.options.instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.client.post_event(meta.get("namespace"), event)
        except ApiFailure as exc:  # events are best effort: never fail a reconcile for one
            logger.warning("could not post event %s for %s/%s: %s", reason, meta.get("namespace"), meta["name"], exc)


def ch_time(when: datetime.datetime) -> str:
    return rollout.format_time(when)
