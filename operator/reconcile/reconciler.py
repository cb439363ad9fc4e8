"""One reconcile of one DisaggregatedInference: validate, plan, diff, apply, status.

The reconciler never reads the API: the CR comes from the watch (kopf event handler),
children and pods from kopf indexes fed by label-selected watches. It writes only what
differs, gathers the status during the run and writes it once, only when it changed.
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
from pdfleet.operator.autoscale.edge import ScalingEdge, scaling_condition
from pdfleet.operator.autoscale.planner_edge import PlannerEdge, _fetch
from pdfleet.operator.observability.metrics_text import rejected_values
from pdfleet.operator.kube.observed import LWS_NAME_LABEL, ObservedReplicaSet
from pdfleet.operator.kube.owned import fleet_workloads, owned_pods
from pdfleet.operator.autoscale.scalers import ObservedScaler, plan_scaling
from pdfleet.operator.plan import kinds
from pdfleet.operator.plan.drain import rollout_drain_seconds
from pdfleet.operator.reconcile_plan import children as ch
from pdfleet.operator.reconcile_plan import status as st
from pdfleet.operator.rollout import paired as rollout
from pdfleet.operator.reconcile.canary import CanaryEdge
from pdfleet.operator.rollout.canary import PROMOTED
from pdfleet.operator.reconcile.auth_secret import AuthSecrets
from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.reconcile_plan.kvtransport import role_transport
from pdfleet.operator.reconcile.logs import fleet_extra
from pdfleet.operator.reconcile_plan.ownership import not_owned_message, ownership
from pdfleet.operator.reconcile.metrics import OperatorMetrics
from pdfleet.operator.reconcile_plan.planning import (
    desired_children,
    revision_kv_events_ports,
    revision_ports,
    router_url,
    target_revision,
)
from pdfleet.operator.reconcile.workqueue import WorkQueue
from pdfleet.operator.api import event_reasons as reasons

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
        self._unowned_seen: dict[Key, set[tuple[str, str, str]]] = {}  # (kind, name, uid) counted and logged
        self.replicasets = replicasets
        self.queue = WorkQueue(self.reconcile, workers=options.workers)
        self.auth_secrets = AuthSecrets(client)
        self._apply_slots = asyncio.Semaphore(options.apply_concurrency)
        self.runs = 0
        self.scalers = scalers
        self.scaling = ScalingEdge(client, self._event)
        self.autoscalers = autoscalers   # (namespace, scaler name) -> HPAs that target it
        self.planner = PlannerEdge(client, self._event, fetch=self._screened_fetch,
                                   count_rejected=self._count_rejected)
        self.canary = CanaryEdge(self._event, interval_s=options.canary_interval_s, fetch=self._screened_fetch,
                                 count_rejected=self._count_rejected)

    async def _screened_fetch(self, url: str) -> str:
        """A router's /metrics page; the values the parsers will skip (NaN, negative) are counted here."""
        text = await _fetch(url)
        for reason, n in rejected_values(text).items():
            self._count_rejected(reason, n)
        return text

    def _count_rejected(self, reason: str, n: int = 1) -> None:
        self.metrics.scraped_rejected.labels(reason).inc(n)

    # ------------------------------------------------------------------ watch side
    def on_cr_event(self, event_type: Optional[str], body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        if event_type == "DELETED":
            self.crs.pop(key, None)
            self.recently_applied.pop(key, None)
            self._reported.pop(key, None)
            self._not_owned_reported.pop(key, None)
            self._unowned_seen.pop(key, None)
            self.scaling.forget(key)
            self.planner.forget(key)
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

    async def _reconcile(self, key: Key, body: Mapping[str, Any]) -> tuple[Optional[float], str]:
        namespace, name = key
        meta = body["metadata"]
        generation = meta.get("generation")
        previous = dict(body.get("status") or {})
        now = self.clock()
        log = logging.LoggerAdapter(logger, fleet_extra(namespace, name))

        try:
            cr = api.parse({k: v for k, v in body.items() if k != "status"})
            provider = cr.spec.scheduling.gang.provider
            if provider in ch.GANG_KINDS and provider not in self.options.gang_providers:
                raise api.InvalidResource([api.FieldError(
                    "spec.scheduling.gang.provider",
                    f"{provider!r} is not enabled in this operator (enabled: "
                    f"{', '.join(self.options.gang_providers) or 'none'}; chart value gangScheduling.{provider})")])
        except api.InvalidResource as exc:
            problems = [str(e) for e in exc.errors]
            status = st.build_status(st.StatusInputs(generation, previous, invalid=problems), now=now)
            await self._write_status(key, body, previous, status)
            self.metrics.observe_fleet(namespace, name, status, {})
            if self._reported.get(key) != ("invalid", generation, tuple(problems)):
                self._reported[key] = ("invalid", generation, tuple(problems))
                log.warning("invalid spec: %s", "; ".join(problems))
                await self._event(body, "Warning", reasons.INVALID_SPEC, "; ".join(problems))
            return None, "invalid"

        image = cr.spec.image or self.options.default_image
        target = target_revision(cr, image)
        observed, pods = self.snapshot(key)
        uid = meta.get("uid", "")
        # Identity is ownership: only children the fleet controls and pods its workloads run count.
        owned = [c for c in observed if c.controller_uid == uid]
        workloads = fleet_workloads(uid, owned, self.replicasets(key), await self._lws_statefulsets(namespace, owned))
        pods, ignored = owned_pods([p for p in pods if p.namespace == namespace], workloads)
        self._report_unowned(key, log, [("Pod", p.name, p.uid, why) for p, why in ignored]
                             + [(c.ref.kind, c.ref.name, c.uid, "not controlled by this fleet")
                                for c in observed if c.controller_uid != uid])
        present = {c.revision for c in owned
                   if c.revision and c.ref.kind in kinds.ENGINE_WORKLOAD_KINDS and not c.deleting}
        roll = previous.get("rollout") or {}
        state = rollout.RolloutState(serving=previous.get("revision"), previous=roll.get("previousRevision"),
                                     switched_at=roll.get("switchedAt"))
        # A canary holds the switch until its core promotes the new pair (rollout.py, operator/rollout/canary.py).
        record = rollout.CanaryRecord.from_status(roll)
        canary_on = cr.spec.rollout.strategy == "Canary"
        hold = canary_on and not (record is not None and record.revision == target
                                  and record.state.phase == PROMOTED)
        decision = rollout.decide(target, state, pods, present, now=now, drain_seconds=self.options.drain_seconds,
                                  hold=hold)
        canary = await self.canary.step(key, body, cr, pods, decision, record, now.timestamp())
        if canary.record is not None and canary.record.state.phase == PROMOTED and decision.phase == "Canary":
            decision = rollout.decide(target, state, pods, present, now=now,
                                      drain_seconds=self.options.drain_seconds)
        on_abort = cr.spec.rollout.canary.on_abort if cr.spec.rollout.canary else "Keep"
        decision = rollout.after_canary(decision, canary.record, delete_on_abort=on_abort == "Delete")

        owner = ch.owner_reference(body)
        # Autoscaled roles: the scalers' replicas, clamped, replace the spec's in the plan.
        scaling = plan_scaling(cr, self.scalers(key), owned, owner=owner, namespace=namespace, revision=target)
        cr = scaling.applied(cr)
        desired = [ch.stamp(obj, owner, namespace)
                   for obj in desired_children(cr, owner=owner, image=image, router_revision=decision.serving,
                                               canary_weight=canary.weight)]
        if target not in decision.keep:  # a canary aborted with onAbort Delete: its pair is not rendered again
            desired = [o for o in desired if (o["metadata"].get("labels") or {}).get(label_keys.REVISION) != target]
        self.metrics.children.labels(namespace, name).set(len(desired))

        recent = self.recently_applied.setdefault(key, {})
        for c in owned:  # the watch caught up with what was applied
            if c.ref in recent and recent[c.ref] == c.applied_hash:
                del recent[c.ref]
        actions = ch.diff(desired, owned, owner_uid=uid, keep_revisions=decision.keep, recently_applied=recent,
                          current_revision=target)

        errors: list[str] = []
        # The side-channel key Secret the engines mount (created once; its data never read).
        secret_error, secret_foreign = await self.auth_secrets.ensure(namespace, name, cr.spec, owner)
        if secret_error:
            errors.append(secret_error)
        # Objects of a child's name that the fleet does not own are never written.
        foreign, unchecked, errs = await self._foreign(actions.apply, observed, owned, recent, uid)
        errors += errs
        if foreign or unchecked or secret_foreign:
            skip = set(foreign) | set(unchecked)
            # engines must never sign with a key someone else made: no workload is written meanwhile
            actions = dataclasses.replace(actions, apply=tuple(
                o for o in actions.apply if ch.ChildRef.of(o) not in skip
                and not (secret_foreign and o["kind"] in ch.WORKLOAD_KINDS)))
        foreign_names = [str(r) for r in foreign] + ([secret_foreign] if secret_foreign else [])
        not_owned = not_owned_message(name, foreign_names) if foreign_names else None
        if self._not_owned_reported.get(key) != not_owned:  # one event per change, not per retry
            self._not_owned_reported[key] = not_owned
            if not_owned:
                log.warning("%s", not_owned)
                await self._event(body, "Warning", reasons.NOT_OWNED, not_owned)
        if actions.apply or actions.delete:
            errors += await self._write_children(key, actions, owned)
            created = [str(ch.ChildRef.of(o)) for o in actions.apply if ch.ChildRef.of(o) not in {c.ref for c in owned}]
            updated = [str(ch.ChildRef.of(o)) for o in actions.apply if ch.ChildRef.of(o) in {c.ref for c in owned}]
            log.info("created %d, updated %d, deleted %d children (%d unchanged)%s",
                     len(created), len(updated), len(actions.delete), actions.unchanged,
                     f"; {len(errors)} failed" if errors else "")
            if created:
                await self._event(body, "Normal", reasons.CREATED, _summary("created", created))
            if updated:
                await self._event(body, "Normal", reasons.UPDATED, _summary("updated", updated))
            if actions.delete:
                await self._event(body, "Normal", reasons.DELETED, _summary("deleted", [str(c.ref) for c in actions.delete]))
        deleted = {c.ref for c in actions.delete}
        errors += await self._unmark_stale_serving([c for c in owned if c.ref not in deleted], decision.serving)
        errors += await self.scaling.sync(key, body, scaling, owned, serving=decision.serving, target=target)
        conflicts = [f"HorizontalPodAutoscaler/{h}" for role in scaling.autoscaled
                     for h in self.autoscalers((namespace, f"{name}-{role}"))]
        planned = await self.planner.run(key, body, cr, pods, scaling, conflicts)
        if decision.state.serving != state.serving and state.serving is not None:
            await self._event(body, "Normal", reasons.ROLLOUT_SWITCHED,
                              f"router switched from revision {state.serving} to {decision.state.serving}")
        elif decision.phase == "RollingOut" and roll.get("targetRevision") != target:
            await self._event(body, "Normal", reasons.ROLLOUT_STARTED,
                              f"revision {target} is coming up beside {decision.serving}")
        if errors:
            await self._event(body, "Warning", reasons.APPLY_FAILED, "; ".join(errors)[:1000])

        ports = revision_ports(owned, cr)
        endpoints = rollout.router_endpoints(pods, decision.serving, ports,
                                             kv_events_ports=revision_kv_events_ports(owned))
        pool = cr.spec.gateway.inference_pool
        want = {"prefill": cr.spec.prefill.replicas, "decode": cr.spec.decode.replicas,
                "router": cr.spec.router.replicas if cr.spec.router.enabled else 0,
                label_keys.ROLE_EPP: pool.epp_replicas if pool.enabled else 0}
        kv_transport = {}
        if cr.spec.network.preflight.enabled:
            kv_transport = {role: role_transport((p.name, p.kv_transport) for p in pods
                                                 if p.role == role and p.revision == decision.serving and not p.deleting)
                            for role in ("prefill", "decode")}
        status = st.build_status(st.StatusInputs(
            kv_transport=kv_transport,
            generation=generation, previous=previous, decision=decision, children=owned, endpoints=endpoints,
            router_enabled=cr.spec.router.enabled, url=router_url(desired, cr),
            epp_enabled=pool.enabled,
            error="; ".join(errors)[:1000] if errors else None, pending_writes=actions.writes,
            not_owned=not_owned,
            desired=want,
            scaling={**(scaling.fleet_status() or {}), **({"planner": planned.status} if planned.status else {})},
            scaling_condition=scaling_condition(scaling),
            strategy=cr.spec.rollout.strategy, canary=canary.record,
        ), now=now)
        await self._write_status(key, body, previous, status)
        self.metrics.observe_fleet(namespace, name, status, want)
        if errors or not_owned:  # retried with backoff: the user may remove what is in the way
            raise ReconcileError("; ".join(errors + ([not_owned] if not_owned else [])))
        requeue = min((r for r in (decision.requeue_after, planned.requeue_after, canary.requeue_after)
                       if r is not None), default=None)
        return requeue, ("changed" if actions.writes else "unchanged")

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

    async def _unmark_stale_serving(self, owned: Sequence[ch.ObservedChild], serving: str) -> list[str]:
        """After a switch: the previous revision's Services lose the serving label (after the new
        revision's got it, in the writes before this)."""
        errors = []
        for child in rollout.stale_serving_marks(owned, serving):
            try:
                await self.client.merge_patch(child.ref, ch.kind_of({"apiVersion": child.ref.api_version,
                                                                    "kind": child.ref.kind}), rollout.unmark_serving())
            except ApiFailure as exc:
                if exc.status != 404:  # gone (the drain ended): nothing left to unmark
                    errors.append(f"unmark {child.ref}: {exc.status} {exc.message}")
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


def _summary(verb: str, names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:8])
    more = f" and {len(names) - 8} more" if len(names) > 8 else ""
    return f"{verb} {len(names)}: {shown}{more}"
