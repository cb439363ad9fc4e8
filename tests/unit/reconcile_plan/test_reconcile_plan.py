"""The reconcile's plan (pure, no server): one table row per situation, each read off one Plan.

Rows: a new fleet, a fleet at rest, a spec change (rollout start), the switch, a canary step, its
promotion and its abort, scaling, the child diff (pruning, another owner's object), a refused spec.
Every row that says "nothing happens" has a neighbour where the same check sees something happen.
"""

from __future__ import annotations

import dataclasses

import pytest
from fleet_builders import NAME, NOW, SETTINGS, UID, Fleet, applied, observed, revision

from pdfleet.contract import labels
from pdfleet.operator.api import event_reasons as reasons
from pdfleet.operator.autoscale.scalers import ObservedScaler, scaling_condition
from pdfleet.operator.kube.observed import ChildRef, ObservedChild
from pdfleet.operator.reconcile_plan.plan import (
    Plan, Settings, canary_gate, guard, reconcile_plan, settle,
)
from pdfleet.operator.rollout import canary as core
from pdfleet.operator.rollout.paired import CanaryOutcome, CanaryRecord

OLD = Fleet().engine_arg(16)
NEW = Fleet().engine_arg(32)
R_OLD, R_NEW = revision(OLD.body()), revision(NEW.body())


def reasons_of(plan_events) -> list[str]:
    return [e.reason for e in plan_events]


def kinds_written(plan: Plan) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in plan.actions.apply)


def revisions_of(objs) -> set:
    return {(o["metadata"].get("labels") or {}).get(labels.REVISION) for o in objs} - {None}


def cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def both_pairs(*, new_ready: bool = True, serving=R_OLD, weight=None):
    """The old pair serving, the new pair applied beside it."""
    old_c, old_p = applied(OLD.body(), serving=serving)
    new_c, new_p = applied(NEW.body(), serving=serving, ready=new_ready, canary_weight=weight)
    names = {c.ref for c in old_c}
    return old_c + [c for c in new_c if c.ref not in names], old_p + new_p


# ---------------------------------------------------------------- rollout
def test_a_new_fleet_creates_every_child_and_decides_nothing_else():
    plan = reconcile_plan(observed(NEW.body()))
    assert plan.actions.delete == () and plan.actions.unchanged == 0
    assert len(plan.actions.apply) == len(plan.desired) > 0
    assert (plan.decision.serving, plan.decision.phase) == (R_NEW, "Stable")
    assert plan.events == () and plan.unmark == ()


def test_a_fleet_at_rest_writes_nothing_and_settles_ready():
    body = NEW.serving(R_NEW).body()
    children, pods = applied(body)
    plan = reconcile_plan(observed(body, children, pods))
    assert plan.actions.writes == 0 and plan.actions.unchanged == len(plan.desired)
    done = settle(plan, guard(plan, name=NAME), now=NOW)
    assert (done.result, done.error, done.events) == ("unchanged", None, ())
    assert (cond(done.status, "Ready")["status"], cond(done.status, "Ready")["reason"]) == ("True", "Ready")
    # negative control: one replica more is one write, the prefill StatefulSet
    more = NEW.serving(R_NEW).replicas(prefill=2).body()
    plan = reconcile_plan(observed(more, children, pods))
    assert kinds_written(plan) == [("StatefulSet", f"{NAME}-prefill-{R_NEW}")] and not plan.actions.delete


# (case, new pair ready, status before, phase, serving, events, old pair kept, unmarked)
ROLLOUT = [
    ("spec changed: the new pair comes up beside the old", False, {}, "RollingOut", R_OLD,
     [reasons.ROLLOUT_STARTED], True, False),
    ("started already: no second event", False, {"targetRevision": R_NEW}, "RollingOut", R_OLD, [], True, False),
    ("the new pair is ready: the router switches, the old pair drains", True, {}, "Draining", R_NEW,
     [reasons.ROLLOUT_SWITCHED], True, True),
]


@pytest.mark.parametrize("case,new_ready,roll,phase,serving,events,kept,unmarked", ROLLOUT, ids=[r[0] for r in ROLLOUT])
def test_paired_rollout(case, new_ready, roll, phase, serving, events, kept, unmarked):
    body = NEW.serving(R_OLD, **roll).body()
    children, pods = both_pairs(new_ready=new_ready)
    plan = reconcile_plan(observed(body, children, pods))
    assert (plan.decision.phase, plan.decision.serving) == (phase, serving)
    assert reasons_of(plan.events) == events
    assert not any(c.revision == R_OLD for c in plan.actions.delete) == kept
    assert bool(plan.unmark) == unmarked and all(c.revision == R_OLD for c in plan.unmark)
    assert {e.revision for e in plan.endpoints} == {serving}  # the router is never handed a mixed pair


def test_after_the_drain_the_old_pair_is_deleted():
    switched = NOW.replace(minute=0)  # 12:00 -> the drain of 30 s ended long ago
    body = NEW.serving(R_NEW, previousRevision=R_OLD, switchedAt="2026-01-01T11:00:00Z").body()
    children, pods = both_pairs(serving=R_NEW)
    plan = reconcile_plan(observed(body, children, pods, now=switched.replace(hour=12)))
    assert plan.decision.phase == "Stable"
    assert {c.revision for c in plan.actions.delete} == {R_OLD}
    # negative control: within the drain the old pair stays
    within = reconcile_plan(observed(body, children, pods, now=switched.replace(hour=11, second=10)))
    assert within.decision.phase == "Draining" and not within.actions.delete


# ---------------------------------------------------------------- canary
def record(phase: str, weight: int, step: int = 0) -> CanaryRecord:
    return CanaryRecord(R_NEW, core.State(phase, step, NOW.timestamp()), weight, "why")


def weights(plan: Plan) -> set:
    return {o["metadata"]["labels"].get(labels.CANARY_WEIGHT) for o in plan.desired
            if o["kind"] == "Service" and o["metadata"]["labels"].get(labels.REVISION) == R_NEW}


# (case, canary outcome, phase, serving, the new pair's weight label, new pair rendered)
CANARY = [
    ("no answer yet: held, no weight", CanaryOutcome(), "Canary", R_OLD, {None}, True),
    ("a step: held, the new pair's Services carry its weight",
     CanaryOutcome(record(core.PROGRESSING, 20), 20, 5.0), "Canary", R_OLD, {"20"}, True),
    ("promoted: the switch happens", CanaryOutcome(record(core.PROMOTED, 100)), "Draining", R_NEW, {None}, True),
    ("aborted, Keep: the old pair is the fleet, the new one stays for inspection",
     CanaryOutcome(record(core.ABORTED, 0), 0), "Stable", R_OLD, {"0"}, True),
]


@pytest.mark.parametrize("case,outcome,phase,serving,weight,rendered", CANARY, ids=[r[0] for r in CANARY])
def test_canary_application(case, outcome, phase, serving, weight, rendered):
    body = NEW.canary(20, 50).serving(R_OLD).body()
    children, pods = both_pairs()
    obs = observed(body, children, pods)
    gate = canary_gate(obs)
    assert gate.decision.phase == "Canary" and gate.decision.serving == R_OLD  # held for the canary edge
    plan = reconcile_plan(dataclasses.replace(obs, canary=outcome), gate)
    assert (plan.decision.phase, plan.decision.serving) == (phase, serving)
    assert weights(plan) == weight
    assert (R_NEW in revisions_of(plan.desired)) == rendered


def test_a_canary_aborted_with_delete_is_not_rendered_again_and_is_deleted():
    body = NEW.canary(20, on_abort="Delete").serving(R_OLD).body()
    children, pods = both_pairs()
    plan = reconcile_plan(observed(body, children, pods, canary=CanaryOutcome(record(core.ABORTED, 0), 0)))
    assert R_NEW not in revisions_of(plan.desired)
    assert {c.revision for c in plan.actions.delete} == {R_NEW}
    # negative control: Paired would have switched to the ready new pair
    paired = reconcile_plan(observed(NEW.serving(R_OLD).body(), children, pods))
    assert paired.decision.serving == R_NEW and not any(c.revision == R_NEW for c in paired.actions.delete)


# ---------------------------------------------------------------- scaling
def test_a_scalers_replicas_replace_the_spec_clamped():
    body = NEW.serving(R_NEW).spec(prefill={"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}).body()
    children, pods = applied(body)
    scaler = ObservedScaler(namespace="ns", name=f"{NAME}-prefill", role="prefill", uid="s1", owner_uids=(UID,),
                            replicas=9)
    plan = reconcile_plan(observed(body, children, pods, scalers=(scaler,)))
    assert plan.scaling.autoscaled == ("prefill",) and plan.scaling.result.replicas["prefill"] == 4
    sts = {o["metadata"]["name"]: o["spec"]["replicas"] for o in plan.actions.apply if o["kind"] == "StatefulSet"}
    assert sts == {f"{NAME}-prefill-{R_NEW}": 4} and plan.want["prefill"] == 4
    done = settle(plan, guard(plan, name=NAME), now=NOW, scaling_condition=scaling_condition(plan.scaling))
    limited = cond(done.status, "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "Clamped") and "prefill 9 -> 4" in limited["message"]
    # negative control: no scaler yet, the spec's replicas stand and one is to be created
    plan = reconcile_plan(observed(body, children, pods))
    assert plan.actions.writes == 0 and len(plan.scaling.create) == 1


# ---------------------------------------------------------------- the child diff and its guard
def test_the_diff_prunes_what_the_plan_dropped_but_never_another_owners_object():
    body = NEW.serving(R_NEW).body()
    children, pods = applied(body)
    ours = ObservedChild(ChildRef("v1", "ConfigMap", "ns", f"{NAME}-leftover"), uid="c1", owner_uids=(UID,),
                         controller_uid=UID, revision="gone")
    theirs = dataclasses.replace(ours, ref=ChildRef("v1", "ConfigMap", "ns", "theirs"), uid="c2",
                                 owner_uids=("someone",), controller_uid="someone")
    plan = reconcile_plan(observed(body, children + [ours, theirs], pods))
    assert [c.ref.name for c in plan.actions.delete] == [f"{NAME}-leftover"]
    assert ("ConfigMap", "theirs", "c2", "not controlled by this fleet") in plan.gate.ignored


def test_guard_writes_nothing_over_an_object_the_fleet_does_not_own():
    plan = reconcile_plan(observed(NEW.body()))
    first = plan.actions.apply[0]
    ref = ChildRef.of(first)
    g = guard(plan, foreign=[ref], name=NAME)
    assert ref not in {ChildRef.of(o) for o in g.actions.apply} and len(g.actions.apply) == len(plan.actions.apply) - 1
    assert reasons_of(g.events_before) == [reasons.NOT_OWNED] and str(ref) in g.not_owned
    assert guard(plan, foreign=[ref], name=NAME, last_not_owned=g.not_owned).events_before == ()  # once per change
    # a key Secret someone else made: no workload at all
    g = guard(plan, secret_foreign="Secret/x", name=NAME)
    assert not any(o["kind"] in ("StatefulSet", "Deployment") for o in g.actions.apply)
    # negative control: nothing in the way, everything goes, and the events say what was created
    g = guard(plan, name=NAME)
    assert g.actions == plan.actions and g.not_owned is None and reasons_of(g.events_after) == [reasons.CREATED]


def test_settle_reports_failed_writes():
    plan = reconcile_plan(observed(NEW.body()))
    done = settle(plan, guard(plan, name=NAME), now=NOW, errors=["apply StatefulSet/x: 500 boom"])
    assert reasons_of(done.events) == [reasons.APPLY_FAILED] and "500 boom" in done.error
    assert (cond(done.status, "Degraded")["status"], cond(done.status, "Degraded")["reason"]) == ("True", "ApplyFailed")
    assert done.result == "changed"
    ok = settle(plan, guard(plan, name=NAME), now=NOW)
    assert ok.error is None and ok.events == () and cond(ok.status, "Degraded")["status"] == "False"


# ---------------------------------------------------------------- a refused spec
GANG = Fleet().spec(decode={"replicas": 1, "tensorParallelSize": 2, "nodesPerReplica": 2, "resources": {"gpus": 1}},
                    scheduling={"gang": {"provider": "volcano"}})
REFUSED = [
    ("an invalid field", Fleet().spec(prefill={"replicas": -1}), SETTINGS, "spec.prefill.replicas"),
    ("a gang provider the operator may not write", GANG, SETTINGS, "spec.scheduling.gang.provider"),
]


@pytest.mark.parametrize("case,fleet,settings,field", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_spec_writes_nothing_and_says_why_once(case, fleet, settings, field):
    body = fleet.body()
    plan = reconcile_plan(observed(body, settings=settings))
    assert plan.refused and field in plan.refused[0]
    assert plan.actions.writes == 0 and plan.desired == () and plan.decision is None
    assert (cond(plan.status, "Ready")["reason"], cond(plan.status, "Stalled")["status"]) == ("InvalidSpec", "True")
    assert reasons_of(plan.events) == [reasons.INVALID_SPEC] and field in plan.events[0].message
    again = reconcile_plan(observed(body, settings=settings, reported=plan.report))
    assert again.refused == plan.refused and again.events == () and again.report is None


def test_the_gang_provider_is_admitted_once_enabled():
    """Negative control of the refusal above: the same spec with the provider enabled is planned."""
    body = GANG.body()
    plan = reconcile_plan(observed(body, settings=Settings(SETTINGS.default_image, 30.0, ("volcano",))))
    assert not plan.refused and plan.actions.apply
