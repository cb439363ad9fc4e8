"""The CR status, computed from what the operator observed (pure).

kstatus-compatible: `observedGeneration`, `Ready`, Progressing / Degraded, and their
kstatus spellings `Reconciling` / `Stalled` (kstatus, hence Flux and `helm --wait`, reads
only those two). A condition's `lastTransitionTime` changes only when its status flips, so
an unchanged world produces an identical status and the operator writes nothing.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from pdfleet.contract.labels import ROLE_EPP
from pdfleet.operator.api import conditions as condition
from pdfleet.operator.api import event_reasons as reasons
from pdfleet.operator.api.types import DEFAULT_PROGRESS_DEADLINE_SECONDS
from pdfleet.operator.plan.kinds import WORKLOAD_KINDS
from pdfleet.operator.kube.observed import ObservedChild
from pdfleet.operator.kube.pool_status import CONDITION_TYPE as POOL_ACCEPTED, pool_condition
from pdfleet.operator.reconcile_plan.causes import RoleCause, causes_message, first_reason
from pdfleet.operator.reconcile_plan.kvtransport import CONDITION_TYPE as KV_TRANSPORT, RoleTransport, fleet_transport
from pdfleet.operator.reconcile_plan.progress import deadline_message, progressing_since, seconds_left
from pdfleet.operator.rollout.paired import CANARY, DRAINING, ROLLING_OUT, CanaryRecord, Decision, Endpoint, format_time
from pdfleet.operator.rollout import canary as canary_core


@dataclass(frozen=True)
class Cond:
    type: str
    status: bool | str  # a bool, or "Unknown"
    reason: str
    message: str = ""


def with_kstatus(conds: list[Cond]) -> list[Cond]:
    """Mirror Progressing as Reconciling and Degraded as Stalled, which kstatus reads."""
    by_type = {c.type: c for c in conds}
    mirrors = ((condition.PROGRESSING, condition.RECONCILING), (condition.DEGRADED, condition.STALLED))
    return conds + [Cond(kstatus, by_type[src].status, by_type[src].reason, by_type[src].message)
                    for src, kstatus in mirrors if src in by_type]


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None,
    wanted: Iterable[Cond],
    *,
    now: datetime.datetime,
    generation: Optional[int],
) -> list[dict[str, Any]]:
    """New conditions; keep the previous lastTransitionTime unless the status flipped."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in wanted:
        status = cond.status if isinstance(cond.status, str) else ("True" if cond.status else "False")
        old = before.get(cond.type)
        ltt = old.get("lastTransitionTime") if old and old.get("status") == status else None
        out.append({
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": ltt or format_time(now),
            "observedGeneration": generation,
        })
    return out


@dataclass(frozen=True)
class RoleCounts:
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    desired: int = 0
    settled: bool = True   # every workload observed its latest generation

    def as_status(self) -> dict[str, int]:
        return {"replicas": self.replicas, "desiredReplicas": self.desired, "readyReplicas": self.ready,
                "updatedReplicas": self.updated}


def role_counts(children: Iterable[ObservedChild], role: str, revision: Optional[str]) -> RoleCounts:
    """Sum a role's workloads; with a revision, only that revision's."""
    replicas = ready = updated = desired = 0
    settled = True
    for c in children:
        if c.role != role or c.ref.kind not in WORKLOAD_KINDS or c.deleting:
            continue
        if revision is not None and c.revision not in (None, revision):
            continue
        replicas += c.status_replicas
        ready += c.ready_replicas
        updated += c.updated_replicas
        desired += c.replicas
        settled = settled and c.observed_generation >= c.generation
    return RoleCounts(replicas, ready, updated, desired, settled)


@dataclass(frozen=True)
class StatusInputs:
    generation: Optional[int]
    previous: Mapping[str, Any]
    decision: Optional[Decision] = None
    children: Sequence[ObservedChild] = ()
    endpoints: Sequence[Endpoint] = ()
    router_enabled: bool = True
    epp_enabled: bool = False        # spec.gateway.inferencePool: the gateway's way in needs the Endpoint Picker
    url: Optional[str] = None
    invalid: Sequence[str] = ()      # "field: message" of an operator-only rule
    error: Optional[str] = None      # last apply failure
    not_owned: Optional[str] = None  # objects of children's names the fleet does not own (never taken over)
    pending_writes: int = 0          # children written in this reconcile
    desired: Mapping[str, int] = field(default_factory=dict)   # replicas the spec asks for, per role
    scaling: Optional[Mapping[str, Any]] = None                 # autoscaled roles: requested, applied, why
    scaling_condition: Optional[tuple[bool, str, str]] = None   # ScalingLimited (status, reason, message)
    prefix_routing: Optional[tuple[str, str, str]] = None  # PrefixRouting ("True"/"False"/"Unknown", reason, message)
    scaled_to_zero: Optional[tuple[bool, str, str]] = None  # ScaledToZero (spec.scaling.scaleToZero only)
    kv_transport: Mapping[str, RoleTransport] = field(default_factory=dict)  # per role; empty: preflight off
    strategy: str = "Paired"                                    # spec.rollout.strategy
    canary: Optional[CanaryRecord] = None                       # the canary of the target revision, if any
    causes: Sequence[RoleCause] = ()                            # why the fleet's own pods are not ready
    secret_missing: Optional[str] = None                        # a Secret the spec names is absent or lacks its key
    progress_deadline_s: int = DEFAULT_PROGRESS_DEADLINE_SECONDS  # spec.progressDeadlineSeconds
    kv_offload: Optional[Mapping[str, Any]] = None              # spec.kvOffload's tier (plan/offload.status)


def canary_conditions(strategy: str, d: Decision, rec: Optional[CanaryRecord]) -> list[Cond]:
    """RolloutProgressing and RolloutAborted, for a fleet whose strategy is Canary (pure)."""
    if strategy != "Canary":
        return []
    if rec is None:
        progressing = (Cond(condition.ROLLOUT_PROGRESSING, True, ROLLING_OUT,
                            f"waiting for revision {d.target}'s prefill and decode to be ready")
                       if d.phase == ROLLING_OUT else Cond(condition.ROLLOUT_PROGRESSING, False, condition.NO_CANARY, ""))
    elif rec.state.phase == canary_core.PROGRESSING:
        progressing = (Cond(condition.ROLLOUT_PROGRESSING, True, condition.CANARY_STEP,
                            f"step {rec.state.step + 1}: {rec.weight}% of new requests to revision {rec.revision}; "
                            f"{rec.last_analysis}") if d.phase == CANARY else
                       Cond(condition.ROLLOUT_PROGRESSING, True, condition.CANARY_WAITING,
                            f"revision {rec.revision} has no ready prefill and decode: the router sends it nothing"))
    else:
        progressing = Cond(condition.ROLLOUT_PROGRESSING, False, rec.state.phase, rec.last_analysis)
    aborted = (Cond(condition.ROLLOUT_ABORTED, True, condition.ABORTED, f"revision {rec.revision}: {rec.last_analysis}")
               if rec is not None and rec.state.phase == canary_core.ABORTED
               else Cond(condition.ROLLOUT_ABORTED, False, condition.NOT_ABORTED, ""))
    return [progressing, aborted]


def build_status(inp: StatusInputs, *, now: datetime.datetime) -> dict[str, Any]:
    prev = dict(inp.previous or {})
    if inp.invalid:
        message = "; ".join(inp.invalid)
        out = {k: v for k, v in prev.items() if k not in ("conditions", "observedGeneration")}
        out["observedGeneration"] = inp.generation
        out["conditions"] = merge_conditions(prev.get("conditions"), with_kstatus([
            Cond(condition.READY, False, reasons.INVALID_SPEC, message),
            Cond(condition.PROGRESSING, False, reasons.INVALID_SPEC, "no child is changed until the spec is fixed"),
            Cond(condition.DEGRADED, True, reasons.INVALID_SPEC, message),
        ]), now=now, generation=inp.generation)
        return out

    d = inp.decision
    assert d is not None
    serving = d.serving
    want = dict(inp.desired)
    roles = {r: role_counts(inp.children, r, serving) for r in ("prefill", "decode")}
    target_roles = {r: role_counts(inp.children, r, d.target) for r in ("prefill", "decode")}
    router = role_counts(inp.children, "router", None)
    router_want = want.get("router", 0) if inp.router_enabled else 0
    epp = role_counts(inp.children, ROLE_EPP, None)
    epp_want = want.get(ROLE_EPP, 0) if inp.epp_enabled else 0

    pairs_ready = all(roles[r].ready > 0 for r in roles if want.get(r, 0) > 0)
    have_prefill_endpoint = bool(inp.endpoints) or want.get("prefill", 0) == 0
    router_ready = router_want == 0 or router.ready > 0
    epp_ready = epp_want == 0 or epp.ready > 0
    complete = (not d.in_progress and inp.pending_writes == 0 and
                all(t.settled and t.desired == want.get(r, 0) and t.ready == t.desired and t.updated == t.desired
                    for r, t in target_roles.items()) and
                (router_want == 0 or (router.settled and router.desired == router_want and router.ready == router_want)) and
                (epp_want == 0 or (epp.settled and epp.desired == epp_want and epp.ready == epp_want)))

    fabric = fleet_transport(inp.kv_transport) if inp.kv_transport else None
    fabric_bad = fabric is not None and fabric.status == "False"
    why = f"; {causes_message(inp.causes)}" if inp.causes else ""
    zero = inp.scaled_to_zero
    conds: list[Cond] = []
    if inp.not_owned:
        conds.append(Cond(condition.READY, False, reasons.NOT_OWNED, inp.not_owned))
    elif inp.error:
        conds.append(Cond(condition.READY, False, reasons.APPLY_FAILED, inp.error))
    elif fabric_bad and fabric is not None:
        # Serving over the wrong fabric (e.g. TCP where RDMA was asked) is not Ready, whatever the pods say.
        conds.append(Cond(condition.READY, False, condition.KV_TRANSPORT_DEGRADED, f"KVTransport {fabric.reason}: {fabric.message}"))
    elif inp.secret_missing:
        conds.append(Cond(condition.READY, False, condition.SECRET_MISSING, inp.secret_missing))
    elif pairs_ready and have_prefill_endpoint and router_ready and epp_ready and zero is not None and zero[0]:
        # both roles at 0 by design: ready to take requests (the front ends hold them and wake the pair)
        conds.append(Cond(condition.READY, True, condition.SCALED_TO_ZERO, zero[2] + why))
    elif pairs_ready and have_prefill_endpoint and router_ready and epp_ready:
        conds.append(Cond(condition.READY, True, condition.READY if complete else condition.SERVING,
                          f"revision {serving}: {roles['prefill'].ready} prefill, {roles['decode'].ready} decode ready"
                          + why))
    else:
        missing = [r for r in ("prefill", "decode") if roles[r].ready == 0 and want.get(r, 0) > 0]
        missing += [r for r, ok in (("router", router_ready), (ROLE_EPP, epp_ready)) if not ok]
        names = [("endpoint picker" if r == ROLE_EPP else r) for r in missing]
        conds.append(Cond(condition.READY, False, first_reason(inp.causes, missing) or condition.WAITING,
                          "waiting for ready pods: " + ", ".join(names or ["children"]) + why))

    # The progress deadline's clock runs while the fleet is not complete, except while a canary runs.
    since = progressing_since(prev.get("progressingSince"), prev.get("observedGeneration"), inp.generation,
                              running=not complete and d.phase != CANARY, now=now)
    left = seconds_left(since, inp.progress_deadline_s, now)
    stalled = (since is not None and left is not None and left <= 0
               and not (inp.not_owned or inp.error or fabric_bad))  # those say Degraded already
    if stalled and since is not None:
        message = deadline_message(since, inp.progress_deadline_s, conds[0].message)  # Ready's: what is missing
        conds.append(Cond(condition.PROGRESSING, False, condition.PROGRESS_DEADLINE_EXCEEDED, message))
    elif inp.secret_missing:
        conds.append(Cond(condition.PROGRESSING, True, condition.SECRET_MISSING, inp.secret_missing))
    elif d.phase == ROLLING_OUT:
        conds.append(Cond(condition.PROGRESSING, True, ROLLING_OUT,
                          f"revision {d.target} coming up beside {serving}; router stays on {serving}"))
    elif d.phase == CANARY:
        weight = inp.canary.weight if inp.canary is not None else 0
        conds.append(Cond(condition.PROGRESSING, True, CANARY,
                          f"revision {d.target} takes {weight}% of new requests beside {serving}"))
    elif d.phase == DRAINING:
        conds.append(Cond(condition.PROGRESSING, True, DRAINING,
                          f"router switched to {serving}; draining revision {d.state.previous}"))
    elif not complete and not inp.error:
        conds.append(Cond(condition.PROGRESSING, True, condition.RECONCILING, "children are being created or updated"))
    else:
        conds.append(Cond(condition.PROGRESSING, False, condition.COMPLETE if complete else condition.STALLED, ""))

    if inp.not_owned:
        conds.append(Cond(condition.DEGRADED, True, reasons.NOT_OWNED, inp.not_owned))
    elif inp.error:
        conds.append(Cond(condition.DEGRADED, True, reasons.APPLY_FAILED, inp.error))
    elif fabric_bad and fabric is not None:
        conds.append(Cond(condition.DEGRADED, True, fabric.reason, fabric.message))
    elif stalled:
        conds.append(Cond(condition.DEGRADED, True, condition.PROGRESS_DEADLINE_EXCEEDED, conds[1].message))
    else:
        conds.append(Cond(condition.DEGRADED, False, condition.AS_EXPECTED, ""))
    if inp.scaling_condition is not None:
        conds.append(Cond(condition.SCALING_LIMITED, *inp.scaling_condition))
    if zero is not None:
        conds.append(Cond(condition.SCALED_TO_ZERO, *zero))
    if inp.prefix_routing is not None:
        state, reason, message = inp.prefix_routing
        conds.append(Cond(condition.PREFIX_ROUTING, {"True": True, "False": False}.get(state, "Unknown"), reason,
                          message))
    conds += canary_conditions(inp.strategy, d, inp.canary)
    if inp.epp_enabled:  # informative: the router may serve while no gateway took the pool
        pools = [c for c in inp.children if c.ref.kind == "InferencePool" and not c.deleting]
        accepted = pool_condition(True, pools[0].pool_parents if pools else ())
        if accepted is not None:
            status, reason, message = accepted
            conds.append(Cond(POOL_ACCEPTED, status if status == "Unknown" else status == "True", reason, message))
    if fabric is not None:
        conds.append(Cond(KV_TRANSPORT, fabric.status if fabric.status == "Unknown" else fabric.status == "True",
                          fabric.reason, fabric.message))

    out: dict[str, Any] = {
        "observedGeneration": inp.generation,
        "conditions": merge_conditions(prev.get("conditions"), with_kstatus(conds), now=now, generation=inp.generation),
        "revision": serving,
        "prefill": roles["prefill"].as_status(),
        "decode": roles["decode"].as_status(),
        "endpoints": {"prefill": [e.as_status() for e in inp.endpoints]},
    }
    for role, rt in inp.kv_transport.items():
        if rt.status != "Unknown":  # pending shows in the KVTransport condition only
            out[role]["kvTransport"] = rt.as_status()
    if inp.router_enabled:
        out["router"] = router.as_status()
    if inp.epp_enabled:
        out[ROLE_EPP] = epp.as_status()
    if inp.url:
        out["url"] = inp.url
    rollout: dict[str, Any] = {"targetRevision": d.target, "strategy": inp.strategy}
    if inp.canary is not None:
        rollout.update(inp.canary.as_status())
    if d.state.previous:
        rollout["previousRevision"] = d.state.previous
    if d.state.switched_at:
        rollout["switchedAt"] = d.state.switched_at
    out["rollout"] = rollout
    if inp.scaling:
        out["scaling"] = dict(inp.scaling)
    if inp.kv_offload:
        out["kvOffload"] = dict(inp.kv_offload)
    if since is not None:
        out["progressingSince"] = since
    return out


def status_equal(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    return dict(a or {}) == dict(b or {})
