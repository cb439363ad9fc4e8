"""Status (pure): kstatus fields, lastTransitionTime only on flips, invalid spec, model agreement."""

from __future__ import annotations

import datetime

from pdfleet.operator.api import DisaggregatedInferenceStatus
from pdfleet.operator.reconcile_plan.children import ChildRef, ObservedChild
from pdfleet.operator.rollout.paired import Decision, Endpoint, RolloutState
from pdfleet.operator.reconcile_plan.status import StatusInputs, build_status, merge_conditions, Cond

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
T1 = T0 + datetime.timedelta(minutes=5)


def sts(role, rev, *, ready, replicas=1, gen=1, observed=1):
    return ObservedChild(ChildRef("apps/v1", "StatefulSet", "ns", f"f-{role}-{rev}"), uid="u", role=role,
                         revision=rev, generation=gen, replicas=replicas, observed_generation=observed,
                         status_replicas=replicas, ready_replicas=ready, updated_replicas=replicas)


def router(ready):
    return ObservedChild(ChildRef("apps/v1", "Deployment", "ns", "f-router"), role="router", generation=1,
                         replicas=1, observed_generation=1, status_replicas=1, ready_replicas=ready,
                         updated_replicas=1)


STABLE = Decision("r1", "r1", frozenset({"r1"}), RolloutState(serving="r1"), "Stable")
DESIRED = {"prefill": 1, "decode": 1, "router": 1}


def inputs(children, endpoints=(), previous=None, **kw):
    return StatusInputs(generation=3, previous=previous or {}, decision=kw.pop("decision", STABLE),
                        children=children, endpoints=endpoints, url="http://f-router.ns.svc:8000", desired=DESIRED, **kw)


def cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_ready_fleet_status_is_kstatus_current():
    ep = [Endpoint("f-prefill-r1-0", "10.0.0.2", 5600, 8000, "r1")]
    st = build_status(inputs([sts("prefill", "r1", ready=1), sts("decode", "r1", ready=1), router(1)], ep), now=T0)
    assert st["observedGeneration"] == 3
    assert (cond(st, "Ready")["status"], cond(st, "Ready")["reason"]) == ("True", "Ready")
    assert cond(st, "Progressing")["status"] == "False" and cond(st, "Degraded")["status"] == "False"
    assert st["endpoints"]["prefill"][0] == {"pod": "f-prefill-r1-0", "ip": "10.0.0.2", "sideChannelPort": 5600,
                                             "httpPort": 8000, "revision": "r1"}
    assert st["prefill"] == {"replicas": 1, "desiredReplicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    # The lead's status model accepts what the operator writes.
    DisaggregatedInferenceStatus.model_validate(st)


def test_no_children_yet_is_not_ready():
    st = build_status(inputs([]), now=T0)
    assert cond(st, "Ready")["status"] == "False" and cond(st, "Progressing")["status"] == "True"


def test_same_world_same_status_and_transition_time_moves_only_on_flips():
    world = [sts("prefill", "r1", ready=1), sts("decode", "r1", ready=1), router(1)]
    ep = [Endpoint("f-prefill-r1-0", "10.0.0.2", 5600, 8000, "r1")]
    first = build_status(inputs(world, ep), now=T0)
    again = build_status(inputs(world, ep, previous=first), now=T1)
    assert again == first  # nothing to write
    flipped = build_status(inputs([sts("prefill", "r1", ready=0), sts("decode", "r1", ready=1), router(1)],
                                  previous=first), now=T1)
    assert cond(flipped, "Ready")["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    assert cond(flipped, "Degraded")["lastTransitionTime"] == cond(first, "Degraded")["lastTransitionTime"]


def test_invalid_spec_keeps_the_rest_and_names_the_field():
    previous = build_status(inputs([sts("prefill", "r1", ready=1)]), now=T0)
    st = build_status(StatusInputs(generation=4, previous=previous,
                                   invalid=["spec.decode.extraArgs[0]: --port is set by pdfleet"]), now=T1)
    assert (cond(st, "Ready")["status"], cond(st, "Ready")["reason"]) == ("False", "InvalidSpec")
    assert "spec.decode.extraArgs[0]" in cond(st, "Ready")["message"]
    assert st["observedGeneration"] == 4 and st["revision"] == previous["revision"]


def test_apply_failure_is_degraded():
    st = build_status(inputs([], error="apply StatefulSet/x: 500 boom"), now=T0)
    assert cond(st, "Degraded")["status"] == "True" and cond(st, "Ready")["reason"] == "ApplyFailed"


def test_merge_conditions_negative_control():
    before = merge_conditions([], [Cond("Ready", True, "Ready")], now=T0, generation=1)
    after = merge_conditions(before, [Cond("Ready", False, "Waiting")], now=T1, generation=1)
    assert before[0]["lastTransitionTime"] != after[0]["lastTransitionTime"]


def kstatus(status):
    """What kstatus (Flux, `helm --wait`) concludes: it reads only Reconciling and Stalled."""
    by_type = {c["type"]: c["status"] for c in status["conditions"]}
    if by_type.get("Stalled") == "True":
        return "Failed"
    if by_type.get("Reconciling") == "True":
        return "InProgress"
    return "Current"


def test_kstatus_sees_progress_failure_and_completion():
    ep = [Endpoint("f-prefill-r1-0", "10.0.0.2", 5600, 8000, "r1")]
    done = build_status(inputs([sts("prefill", "r1", ready=1), sts("decode", "r1", ready=1), router(1)], ep), now=T0)
    # serving already (Ready=True) but one decode of two still starting: kstatus must keep waiting
    partial = build_status(inputs([sts("prefill", "r1", ready=1), sts("decode", "r1", ready=1, replicas=2),
                                   router(1)], ep), now=T0)
    invalid = build_status(StatusInputs(generation=4, previous=done, invalid=["spec.x: bad"]), now=T1)
    assert (kstatus(done), kstatus(build_status(inputs([]), now=T0)), kstatus(invalid)) == (
        "Current", "InProgress", "Failed")
    assert cond(partial, "Ready")["status"] == "True" and kstatus(partial) == "InProgress"
    # negative control: without the mirrored conditions kstatus would call an empty fleet Current
    bare = {"conditions": [c for c in build_status(inputs([]), now=T0)["conditions"]
                           if c["type"] not in ("Reconciling", "Stalled")]}
    assert kstatus(bare) == "Current"


def test_not_owned_wins_over_everything_else():
    """Issue 20 rows 2-3: an object in the way makes the fleet not Ready, whatever else holds."""
    from pdfleet.operator.reconcile_plan import status as st
    from pdfleet.operator.rollout.paired import decide
    import datetime
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    d = decide("r1", __import__("pdfleet.operator.rollout.paired", fromlist=["RolloutState"]).RolloutState(
        serving=None, previous=None, switched_at=None), [], set(), now=now, drain_seconds=30)
    out = st.build_status(st.StatusInputs(generation=1, previous={}, decision=d, error="apply X: 500",
                                          not_owned="Deployment/x already exists ..."), now=now)
    conds = {c["type"]: c for c in out["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "NotOwned")
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", "NotOwned")
    plain = st.build_status(st.StatusInputs(generation=1, previous={}, decision=d, error="apply X: 500"), now=now)
    assert {c["type"]: c for c in plain["conditions"]}["Ready"]["reason"] == "ApplyFailed"  # negative control
