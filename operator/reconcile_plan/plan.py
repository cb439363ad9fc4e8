"""One reconcile's decisions (pure), as named steps; modelled on LWS's disaggregatedset planner
(ComputeNextStep -> PlanResult) beside its executor, and on jobset's Reconcile read as a list of steps.

The reconcile is: gather (reconcile/reconciler.py: the CR from the watch, children and pods from the
indexes, the canary edge's scrape) -> ``reconcile_plan`` (here) -> execute (the reconciler: the key
Secret, owner checks, writes, scalers, the planner) -> ``settle`` (here: events and status from what
the writes returned) -> status write. The plan comes in steps because the API answers twice mid-way
(the canary's scrape, the owner checks):

1. ``check_spec`` (else ``refusal``), then ``canary_gate``: the fleet's own children and pods, the
   rollout decision with the switch held while a canary runs: what the canary edge needs to scrape;
2. ``reconcile_plan``: with the canary's outcome, the rollout decision, scaling, the desired children,
   the diff, the serving marks to take off, the events the plan itself decides; or a refusal;
3. ``guard``: the diff less the children whose name an object the fleet does not own holds (found by
   the executor's owner checks), with the NotOwned report and the write events;
4. ``settle``: the status, the last events and the requeue, from the write errors and the planner.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from pdfleet.contract import labels as label_keys
from pdfleet.operator import api
from pdfleet.operator.api import conditions as condition
from pdfleet.operator.api import event_reasons as reasons
from pdfleet.operator.autoscale.scalers import ObservedScaler, ScalingPlan, plan_scaling
from pdfleet.operator.kube.observed import ObservedReplicaSet
from pdfleet.operator.kube.owned import fleet_workloads, owned_pods
from pdfleet.operator.plan import kinds, offload
from pdfleet.operator.reconcile_plan import causes as pod_causes
from pdfleet.operator.reconcile_plan import children as ch
from pdfleet.operator.reconcile_plan import progress
from pdfleet.operator.reconcile_plan import status as st
from pdfleet.operator.reconcile_plan.kvtransport import RoleTransport, role_transport
from pdfleet.operator.reconcile_plan.ownership import not_owned_message
from pdfleet.operator.reconcile_plan.secret_refs import SecretRef, Seen, missing_message, referenced_secrets
from pdfleet.operator.reconcile_plan.planning import (
    desired_children,
    revision_kv_events_ports,
    revision_ports,
    router_url,
    target_revision,
)
from pdfleet.operator.rollout import paired as rollout
from pdfleet.operator.rollout.canary import PROMOTED
from pdfleet.operator.rollout.paired import CanaryOutcome

__all__ = ["Event", "Gate", "Guarded", "Observed", "Plan", "Settings", "Settlement", "canary_gate", "check_spec",
           "guard", "owned_children", "reconcile_plan", "refusal", "settle"]


@dataclass(frozen=True)
class Settings:
    """The operator's own settings the decisions read (ReconcileOptions' share)."""

    default_image: str
    drain_seconds: float
    gang_providers: tuple[str, ...] = ()  # providers whose PodGroup CRD the operator may write


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile knows, gathered before any decision: no API read happens after this but
    the owner checks of children about to be written (``guard``)."""

    body: Mapping[str, Any]                     # the CR as the watch delivered it
    now: datetime.datetime
    settings: Settings
    children: tuple[ch.ObservedChild, ...] = ()     # labelled with the fleet's name, owned or not
    pods: tuple[ch.ObservedPod, ...] = ()
    replicasets: tuple[ObservedReplicaSet, ...] = ()
    lws_statefulsets: tuple[ch.ObservedChild, ...] = ()  # the LWS controller's, of the fleet's LWSs
    scalers: tuple[ObservedScaler, ...] = ()
    recently_applied: Mapping[ch.ChildRef, str] = field(default_factory=dict)  # ref -> hash, not yet watched
    canary: CanaryOutcome = CanaryOutcome()     # the canary edge's answer to this reconcile's gate
    reported: Optional[tuple[Any, ...]] = None  # the refusal last reported (one event per change)
    causes_reported: frozenset[pod_causes.CauseKey] = frozenset()  # pods' causes with an event already

    @property
    def key(self) -> tuple[str, str]:
        meta = self.body["metadata"]
        return meta.get("namespace") or "", meta["name"]

    @property
    def uid(self) -> str:
        return self.body["metadata"].get("uid", "")


@dataclass(frozen=True)
class Event:
    type: str      # Normal | Warning
    reason: str    # one of api/event_reasons.py
    message: str


@dataclass(frozen=True)
class Gate:
    """What the canary edge is asked about: the paired decision with the switch held while a canary runs."""

    cr: api.DisaggregatedInference
    image: str
    target: str
    owned: tuple[ch.ObservedChild, ...]   # controlled by this fleet (by uid)
    pods: tuple[ch.ObservedPod, ...]      # run by the fleet's own workloads
    ignored: tuple[tuple[str, str, str, str], ...]  # (kind, name, uid, why) labelled like ours, not counted
    state: rollout.RolloutState           # as status remembers it
    record: Optional[rollout.CanaryRecord]
    present: frozenset[str]               # revisions with an engine workload
    decision: rollout.Decision            # held while a canary runs


@dataclass(frozen=True)
class Plan:
    """One reconcile's writes and reports, decided before any write."""

    generation: Optional[int]
    previous: Mapping[str, Any]                  # the status as read
    refused: tuple[str, ...] = ()                # "field: message": the spec is refused, nothing is written
    report: Optional[tuple[Any, ...]] = None     # the refusal reported now (None: unchanged)
    gate: Optional[Gate] = None
    decision: Optional[rollout.Decision] = None  # the rollout decision once the canary spoke
    canary: CanaryOutcome = CanaryOutcome()
    cr: Optional[api.DisaggregatedInference] = None  # with the scalers' replicas in place of the spec's
    scaling: ScalingPlan = ScalingPlan()
    owner: Mapping[str, Any] = field(default_factory=dict)
    desired: tuple[dict[str, Any], ...] = ()     # stamped manifests
    caught_up: tuple[ch.ChildRef, ...] = ()      # applied lately and now watched: no longer "recent"
    actions: ch.Actions = ch.Actions()           # the diff: applies (create or update) and deletes
    unmark: tuple[ch.ObservedChild, ...] = ()    # Services of another revision still marked serving
    events: tuple[Event, ...] = ()               # decided by the plan: a refusal, a rollout's switch or start
    want: Mapping[str, int] = field(default_factory=dict)  # replicas the spec asks for, per role
    endpoints: tuple[rollout.Endpoint, ...] = ()
    url: Optional[str] = None
    kv_transport: Mapping[str, RoleTransport] = field(default_factory=dict)
    status: Optional[dict[str, Any]] = None      # a refusal's status (a plan's own is settled after the writes)
    causes: tuple[pod_causes.RoleCause, ...] = ()  # why the fleet's own pods are not ready
    causes_reported: frozenset[pod_causes.CauseKey] = frozenset()  # as observed: those with an event already
    secret_refs: tuple[SecretRef, ...] = ()      # the Secrets the spec names: the executor reads them before guard


@dataclass(frozen=True)
class Guarded:
    """The writes that may go: the diff less what is in the way, and what to report about it."""

    actions: ch.Actions
    not_owned: Optional[str]             # the NotOwned message (None: nothing in the way)
    events_before: tuple[Event, ...]     # NotOwned, when it changed
    events_after: tuple[Event, ...]      # Created / Updated / Deleted, once the writes went
    created: int = 0
    updated: int = 0
    secret_missing: Optional[str] = None  # the SecretMissing message (None: every Secret the spec names is there)


@dataclass(frozen=True)
class Settlement:
    status: dict[str, Any]
    events: tuple[Event, ...]            # the rollout's, then ApplyFailed
    error: Optional[str]                 # raise: retried with backoff
    requeue_after: Optional[float]
    result: str                          # changed | unchanged
    causes_reported: frozenset[pod_causes.CauseKey] = frozenset()  # to hand to the next reconcile


def owned_children(children: Sequence[ch.ObservedChild], uid: str) -> list[ch.ObservedChild]:
    """Identity is ownership: only children the fleet controls count."""
    return [c for c in children if c.controller_uid == uid]


def check_spec(body: Mapping[str, Any], settings: Settings) -> tuple[Optional[api.DisaggregatedInference], list[str]]:
    """The spec parsed, or the problems that refuse it ("field: message")."""
    try:
        cr = api.parse({k: v for k, v in body.items() if k != "status"})
        provider = cr.spec.scheduling.gang.provider
        if provider in ch.GANG_KINDS and provider not in settings.gang_providers:
            raise api.InvalidResource([api.FieldError(
                "spec.scheduling.gang.provider",
                f"{provider!r} is not enabled in this operator (enabled: "
                f"{', '.join(settings.gang_providers) or 'none'}; chart value gangScheduling.{provider})")])
    except api.InvalidResource as exc:
        return None, [str(e) for e in exc.errors]
    return cr, []


def canary_gate(observed: Observed, cr: Optional[api.DisaggregatedInference] = None) -> Optional[Gate]:
    """Step 1. None: the spec is refused (``refusal`` says why); ``cr``: the spec parsed already."""
    if cr is None:
        cr, _ = check_spec(observed.body, observed.settings)
        if cr is None:
            return None
    namespace, _ = observed.key
    previous = observed.body.get("status") or {}
    image = cr.spec.image or observed.settings.default_image
    target = target_revision(cr, image)
    uid = observed.uid
    owned = owned_children(observed.children, uid)
    workloads = fleet_workloads(uid, owned, observed.replicasets, observed.lws_statefulsets)
    pods, ignored = owned_pods([p for p in observed.pods if p.namespace == namespace], workloads)
    unowned = ([("Pod", p.name, p.uid, why) for p, why in ignored]
               + [(c.ref.kind, c.ref.name, c.uid, "not controlled by this fleet")
                  for c in observed.children if c.controller_uid != uid])
    present = frozenset(c.revision for c in owned
                        if c.revision and c.ref.kind in kinds.ENGINE_WORKLOAD_KINDS and not c.deleting)
    roll = previous.get("rollout") or {}
    state = rollout.RolloutState(serving=previous.get("revision"), previous=roll.get("previousRevision"),
                                 switched_at=roll.get("switchedAt"))
    # A canary holds the switch until its core promotes the new pair (rollout/paired.py, rollout/canary.py).
    record = rollout.CanaryRecord.from_status(roll)
    hold = cr.spec.rollout.strategy == "Canary" and not (
        record is not None and record.revision == target and record.state.phase == PROMOTED)
    decision = rollout.decide(target, state, pods, present, now=observed.now,
                              drain_seconds=observed.settings.drain_seconds, hold=hold,
                              front_ends_rolled=rollout.front_ends_rolled(owned))
    return Gate(cr, image, target, tuple(owned), tuple(pods), tuple(unowned), state, record, present, decision)


def refusal(observed: Observed, problems: Sequence[str]) -> Plan:
    """A refused spec's plan: its status and, once per change, the event; nothing is written."""
    generation = observed.body["metadata"].get("generation")
    previous = dict(observed.body.get("status") or {})
    status = st.build_status(st.StatusInputs(generation, previous, invalid=list(problems)), now=observed.now)
    report = ("invalid", generation, tuple(problems))
    events = (Event(reasons.WARNING, reasons.INVALID_SPEC, "; ".join(problems)),) if observed.reported != report else ()
    return Plan(generation, previous, refused=tuple(problems), report=report if events else None, events=events,
                status=status)


def reconcile_plan(observed: Observed, gate: Optional[Gate] = None) -> Plan:
    """Step 2. ``gate``: ``canary_gate(observed)`` when the caller has it already (the spec is parsed once)."""
    gate = gate if gate is not None else canary_gate(observed)
    if gate is None:
        return refusal(observed, check_spec(observed.body, observed.settings)[1])
    namespace, _ = observed.key
    body, now, cr, target = observed.body, observed.now, gate.cr, gate.target
    generation = body["metadata"].get("generation")
    previous = dict(body.get("status") or {})
    canary = observed.canary

    decision = gate.decision
    if canary.record is not None and canary.record.state.phase == PROMOTED and decision.phase == rollout.CANARY:
        decision = rollout.decide(target, gate.state, gate.pods, gate.present, now=now,
                                  drain_seconds=observed.settings.drain_seconds)
    on_abort = cr.spec.rollout.canary.on_abort if cr.spec.rollout.canary else "Keep"
    decision = rollout.after_canary(decision, canary.record, delete_on_abort=on_abort == "Delete")

    owner = ch.owner_reference(body)
    # Autoscaled roles: the scalers' replicas, clamped, replace the spec's in the plan.
    scaling = plan_scaling(cr, observed.scalers, gate.owned, owner=owner, namespace=namespace, revision=target)
    cr = scaling.applied(cr)
    desired = [ch.stamp(obj, owner, namespace)
               for obj in desired_children(cr, owner=owner, image=gate.image, router_revision=decision.serving,
                                           canary_weight=canary.weight)]
    if target not in decision.keep:  # a canary aborted with onAbort Delete: its pair is not rendered again
        desired = [o for o in desired if (o["metadata"].get("labels") or {}).get(label_keys.REVISION) != target]

    recent = dict(observed.recently_applied)
    caught_up = tuple(c.ref for c in gate.owned if c.ref in recent and recent[c.ref] == c.applied_hash)
    for ref in caught_up:  # the watch caught up with what was applied
        del recent[ref]
    actions = ch.diff(desired, gate.owned, owner_uid=observed.uid, keep_revisions=decision.keep,
                      recently_applied=recent, current_revision=target)
    deleted = {c.ref for c in actions.delete}
    unmark = rollout.stale_serving_marks([c for c in gate.owned if c.ref not in deleted], decision.serving)

    roll = previous.get("rollout") or {}
    events: list[Event] = []
    if decision.state.serving != gate.state.serving and gate.state.serving is not None:
        events.append(Event(reasons.NORMAL, reasons.ROLLOUT_SWITCHED,
                            f"router switched from revision {gate.state.serving} to {decision.state.serving}"))
    elif decision.phase == rollout.ROLLING_OUT and roll.get("targetRevision") != target:
        events.append(Event(reasons.NORMAL, reasons.ROLLOUT_STARTED,
                            f"revision {target} is coming up beside {decision.serving}"))

    ports = revision_ports(gate.owned, cr)
    endpoints = rollout.router_endpoints(gate.pods, decision.serving, ports,
                                         kv_events_ports=revision_kv_events_ports(gate.owned))
    pool = cr.spec.gateway.inference_pool
    want = {"prefill": cr.spec.prefill.replicas, "decode": cr.spec.decode.replicas,
            "router": cr.spec.router.replicas if cr.spec.router.enabled else 0,
            label_keys.ROLE_EPP: pool.epp_replicas if pool.enabled else 0}
    kv_transport = {}
    if cr.spec.network.preflight.enabled:
        kv_transport = {role: role_transport((p.name, p.kv_transport) for p in gate.pods
                                             if p.role == role and p.revision == decision.serving and not p.deleting)
                        for role in ("prefill", "decode")}
    return Plan(generation, previous, gate=gate, decision=decision, canary=canary, cr=cr, scaling=scaling,
                owner=owner, desired=tuple(desired), caught_up=caught_up, actions=actions, unmark=tuple(unmark),
                events=tuple(events), want=want, endpoints=tuple(endpoints), url=router_url(desired, cr),
                kv_transport=kv_transport, causes=pod_causes.role_causes(gate.pods),
                causes_reported=observed.causes_reported, secret_refs=referenced_secrets(cr.spec))


def guard(plan: Plan, *, foreign: Sequence[ch.ChildRef] = (), unchecked: Sequence[ch.ChildRef] = (),
          secret_foreign: Optional[str] = None, name: str, last_not_owned: Optional[str] = None,
          secrets_seen: Mapping[str, Seen] = {}, last_secret_missing: Optional[str] = None) -> Guarded:
    """Step 3. Objects of a child's name that the fleet does not own (``foreign``) and those whose owner could
    not be checked (``unchecked``) are never written; while the key Secret is someone else's
    (``secret_foreign``), no workload is written at all: engines must never sign with a key another made.
    Nor while a Secret the spec names is absent or lacks its key (``secrets_seen``: what the executor read
    of ``plan.secret_refs``): its pods could not start; what already runs is left as it is."""
    actions = plan.actions
    namespace = (plan.cr.metadata.namespace if plan.cr is not None else None) or ""
    secret_missing = missing_message(plan.secret_refs, secrets_seen, namespace)
    hold = bool(secret_foreign or secret_missing)
    if foreign or unchecked or hold:
        skip = set(foreign) | set(unchecked)
        actions = dataclasses.replace(actions, apply=tuple(
            o for o in actions.apply if ch.ChildRef.of(o) not in skip
            and not (hold and o["kind"] in ch.WORKLOAD_KINDS)))
    foreign_names = [str(r) for r in foreign] + ([secret_foreign] if secret_foreign else [])
    not_owned = not_owned_message(name, foreign_names) if foreign_names else None
    before = (Event(reasons.WARNING, reasons.NOT_OWNED, not_owned),) if not_owned and not_owned != last_not_owned else ()
    if secret_missing and secret_missing != last_secret_missing:
        before += (Event(reasons.WARNING, reasons.SECRET_MISSING, secret_missing),)
    after: list[Event] = []
    created = updated = 0
    if actions.apply or actions.delete:
        have = {c.ref for c in plan.gate.owned} if plan.gate is not None else set()
        new = [str(ch.ChildRef.of(o)) for o in actions.apply if ch.ChildRef.of(o) not in have]
        changed = [str(ch.ChildRef.of(o)) for o in actions.apply if ch.ChildRef.of(o) in have]
        created, updated = len(new), len(changed)
        if new:
            after.append(Event(reasons.NORMAL, reasons.CREATED, summary("created", new)))
        if changed:
            after.append(Event(reasons.NORMAL, reasons.UPDATED, summary("updated", changed)))
        if actions.delete:
            after.append(Event(reasons.NORMAL, reasons.DELETED, summary("deleted", [str(c.ref) for c in actions.delete])))
    return Guarded(actions, not_owned, before, tuple(after), created, updated, secret_missing)


def settle(plan: Plan, guarded: Guarded, *, now: datetime.datetime, errors: Sequence[str] = (),
           planner_status: Optional[str] = None, planner_requeue: Optional[float] = None,
           scaling_condition: Optional[tuple[bool, str, str]] = None,
           prefix_routing: Optional[tuple[str, str, str]] = None, prefix_requeue: Optional[float] = None,
           scaled_to_zero: Optional[tuple[bool, str, str]] = None, scale_to_zero_requeue: Optional[float] = None
           ) -> Settlement:
    """Step 4. ``errors``: what the writes (the Secret's, the owner checks', the children's, the serving
    marks', the scalers') returned; ``planner_*``: the planner edge's outcome; ``scaling_condition``:
    ScalingLimited of ``plan.scaling`` (autoscale/edge.py's, handed in: that module imports the client);
    ``prefix_routing``: PrefixRouting, read from the front ends (observability/prefix_routing.py), and when
    to read it again while it is not settled; ``scaled_to_zero``: ScaledToZero (autoscale/scale_to_zero_edge.py),
    and when to read the front ends again."""
    assert plan.cr is not None and plan.decision is not None and plan.gate is not None
    cr, decision = plan.cr, plan.decision
    error = "; ".join(errors)[:1000] if errors else None
    events = list(plan.events)
    if errors:
        events.append(Event(reasons.WARNING, reasons.APPLY_FAILED, error or ""))
    status = st.build_status(st.StatusInputs(
        kv_transport=plan.kv_transport,
        generation=plan.generation, previous=plan.previous, decision=decision, children=plan.gate.owned,
        endpoints=plan.endpoints,
        router_enabled=cr.spec.router.enabled, url=plan.url,
        epp_enabled=cr.spec.gateway.inference_pool.enabled,
        error=error, pending_writes=guarded.actions.writes,
        not_owned=guarded.not_owned,
        desired=plan.want,
        scaling={**(plan.scaling.fleet_status() or {}), **({"planner": planner_status} if planner_status else {})},
        scaling_condition=scaling_condition, prefix_routing=prefix_routing, scaled_to_zero=scaled_to_zero,
        strategy=cr.spec.rollout.strategy, canary=plan.canary.record,
        causes=plan.causes, secret_missing=guarded.secret_missing,
        progress_deadline_s=cr.spec.progress_deadline_seconds,
        kv_offload=offload.status(cr.spec),
    ), now=now)
    # One Warning per new cause of the pods' (not per reconcile), remembered until the fleet is complete.
    events += [Event(reasons.WARNING, c.cause.reason, pod_causes.event_message(c))
               for c in pod_causes.new_causes(plan.causes, plan.causes_reported)]
    complete = any(c["type"] == condition.READY and c["reason"] == condition.READY for c in status["conditions"])
    events += deadline_events(plan.previous, status)
    reported = pod_causes.remembered(plan.causes, plan.causes_reported, complete=complete)
    problems = [p for p in (*errors, guarded.not_owned, guarded.secret_missing) if p]  # retried with backoff
    left = progress.seconds_left(status.get("progressingSince"), cr.spec.progress_deadline_seconds, now)
    deadline = left + 1.0 if left is not None and left > 0 else None  # a status flip no watch event brings
    requeue = min((r for r in (decision.requeue_after, planner_requeue, plan.canary.requeue_after, deadline,
                               prefix_requeue, scale_to_zero_requeue) if r is not None), default=None)
    return Settlement(status, tuple(events), "; ".join(problems) if problems else None, requeue,
                      "changed" if guarded.actions.writes else "unchanged", reported)


def deadline_events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Event]:
    """One Warning when the progress deadline passes (Progressing turns ProgressDeadlineExceeded)."""
    def reason(st: Mapping[str, Any]) -> Optional[str]:
        return next((c.get("reason") for c in st.get("conditions") or () if c.get("type") == condition.PROGRESSING),
                    None)

    now = next((c for c in status["conditions"] if c["type"] == condition.PROGRESSING), None)
    if now is None or now["reason"] != condition.PROGRESS_DEADLINE_EXCEEDED or reason(previous) == now["reason"]:
        return []
    return [Event(reasons.WARNING, reasons.PROGRESS_DEADLINE_EXCEEDED, now["message"])]


def summary(verb: str, names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:8])
    more = f" and {len(names) - 8} more" if len(names) > 8 else ""
    return f"{verb} {len(names)}: {shown}{more}"
