"""The canary's pure parts on the operator side: the paired decision held while a canary runs, the
canary's state as status keeps it, the decision after an abort, the rollout conditions, and the weight
label in the plan (issue 22)."""

from __future__ import annotations

import datetime

import pytest

from pdfleet.contract import labels
from pdfleet.operator.api import parse
from pdfleet.operator.plan import PlanOptions, plan, revision_of
from pdfleet.operator.reconcile_plan.children import ObservedPod
from pdfleet.operator.rollout.paired import CanaryRecord, Decision, RolloutState, after_canary, decide
from pdfleet.operator.reconcile_plan.status import canary_conditions
from pdfleet.operator.rollout.canary import ABORTED, PROGRESSING, PROMOTED, State

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)


def pod(role: str, revision: str, *, ready: bool = True) -> ObservedPod:
    return ObservedPod("ns", f"f-{role}-{revision}-0", role, revision, f"10.0.{len(revision)}.2", ready, False)


BOTH_READY = [pod("prefill", "old"), pod("decode", "old"), pod("prefill", "new"), pod("decode", "new")]
NEW_HALF = [pod("prefill", "old"), pod("decode", "old"), pod("prefill", "new"), pod("decode", "new", ready=False)]


@pytest.mark.parametrize("case,pods,present,hold,phase,serving", [
    ("paired: the ready new pair takes over", BOTH_READY, {"old", "new"}, False, "Draining", "new"),
    ("canary: the ready new pair is held beside the old", BOTH_READY, {"old", "new"}, True, "Canary", "old"),
    ("canary: the new pair not ready yet", NEW_HALF, {"old", "new"}, True, "RollingOut", "old"),
    ("canary: the old pair has no pods left, nothing to compare: switch",
     [pod("prefill", "new"), pod("decode", "new")], {"new"}, True, "Stable", "new"),
])
def test_decide_holds_the_switch_for_a_canary(case, pods, present, hold, phase, serving) -> None:
    d = decide("new", RolloutState(serving="old"), pods, present, now=NOW, drain_seconds=60, hold=hold)
    assert (d.phase, d.serving) == (phase, serving), case
    if phase == "Canary":
        assert d.keep == {"old", "new"} and d.in_progress


def rec(phase: str, revision: str = "new", step: int = 1, weight: int = 20, stale=None) -> CanaryRecord:
    return CanaryRecord(revision, State(phase, step, NOW.timestamp()), weight, "why", stale)


@pytest.mark.parametrize("record", [rec(PROGRESSING), rec(PROMOTED, weight=100), rec(ABORTED, weight=0, stale="abort")])
def test_the_record_round_trips_through_status(record) -> None:
    status = record.as_status()
    assert status["step"] == record.state.step + 1 and status["weight"] == record.weight
    assert status["stepStartedAt"] == "2026-01-01T12:00:00Z"
    assert CanaryRecord.from_status(status) == record


@pytest.mark.parametrize("roll", [{}, {"targetRevision": "new"}, {"canaryRevision": "new", "phase": "Paused"},
                                  {"canaryRevision": 3, "phase": PROGRESSING}])
def test_no_record_from_a_status_without_one(roll) -> None:
    assert CanaryRecord.from_status(roll) is None


CANARY = Decision("old", "new", frozenset({"old", "new"}), RolloutState(serving="old"), "Canary")
ROLLING = Decision("old", "new", frozenset({"old", "new"}), RolloutState(serving="old"), "RollingOut")


@pytest.mark.parametrize("case,decision,record,delete,phase,target,keep", [
    ("progressing: as decided", CANARY, rec(PROGRESSING), False, "Canary", "new", {"old", "new"}),
    ("no record: as decided", ROLLING, None, True, "RollingOut", "new", {"old", "new"}),
    ("aborted, Keep: the old pair is the fleet, the new one kept", CANARY, rec(ABORTED), False, "Stable", "old",
     {"old", "new"}),
    ("aborted, Delete: the new pair is not kept", CANARY, rec(ABORTED), True, "Stable", "old", {"old"}),
    ("aborted, Delete, its pods already gone", ROLLING, rec(ABORTED), True, "Stable", "old", {"old"}),
    ("an abort of another revision does not count", CANARY, rec(ABORTED, revision="older"), True, "Canary", "new",
     {"old", "new"}),
])
def test_after_canary(case, decision, record, delete, phase, target, keep) -> None:
    d = after_canary(decision, record, delete_on_abort=delete)
    assert (d.phase, d.target, set(d.keep), d.serving) == (phase, target, keep, "old"), case


STABLE = Decision("old", "old", frozenset({"old"}), RolloutState(serving="old"), "Stable")


@pytest.mark.parametrize("case,strategy,decision,record,progressing,aborted", [
    ("paired: none", "Paired", CANARY, rec(PROGRESSING), None, None),
    ("no rollout", "Canary", STABLE, None, ("False", "NoCanary"), ("False", "NotAborted")),
    ("waiting for the pair", "Canary", ROLLING, None, ("True", "RollingOut"), ("False", "NotAborted")),
    ("a step runs", "Canary", CANARY, rec(PROGRESSING), ("True", "CanaryStep"), ("False", "NotAborted")),
    ("the pair lost its ready pods", "Canary", ROLLING, rec(PROGRESSING), ("True", "CanaryWaiting"),
     ("False", "NotAborted")),
    ("promoted", "Canary", STABLE, rec(PROMOTED), ("False", PROMOTED), ("False", "NotAborted")),
    ("aborted", "Canary", STABLE, rec(ABORTED), ("False", ABORTED), ("True", "Aborted")),
])
def test_canary_conditions(case, strategy, decision, record, progressing, aborted) -> None:
    conds = {c.type: (("True" if c.status else "False"), c.reason) for c in canary_conditions(strategy, decision, record)}
    assert conds.get("RolloutProgressing") == progressing, case
    assert conds.get("RolloutAborted") == aborted, case


def test_the_plan_labels_only_a_canary_revisions_services_with_the_weight() -> None:
    cr = parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                "metadata": {"name": "f", "namespace": "ns"}, "spec": {"model": {"name": "m"}}})
    rev = revision_of(cr)

    def service_labels(options: PlanOptions) -> list[dict[str, str]]:
        return [o["metadata"]["labels"] for o in plan(cr, options) if o["kind"] == "Service"
                and o["metadata"]["labels"].get(labels.ROLE) in labels.ENGINE_ROLES]

    canary = service_labels(PlanOptions(serving_revision="other", canary_weight=25))
    assert [l.get(labels.CANARY_WEIGHT) for l in canary] == ["25", "25"]
    assert all(labels.SERVING not in l for l in canary)
    # serving: the serving label, never a weight; no canary: no weight
    assert all(labels.CANARY_WEIGHT not in l and l[labels.SERVING] == "true"
               for l in service_labels(PlanOptions(serving_revision=rev, canary_weight=25)))
    assert all(labels.CANARY_WEIGHT not in l for l in service_labels(PlanOptions(serving_revision="other")))
    # the router's Deployment is the same whatever the weight (its pod template never changes between steps)
    routers = {str([o for o in plan(cr, PlanOptions(serving_revision="other", canary_weight=w))
                    if o["kind"] == "Deployment"]) for w in (None, 0, 10, 50)}
    assert len(routers) == 1
