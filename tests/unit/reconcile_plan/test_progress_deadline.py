"""The progress deadline (pure; issue 39): a fleet not complete spec.progressDeadlineSeconds after the
current generation started progressing is Stalled=True (ProgressDeadlineExceeded); times are given."""

from __future__ import annotations

import datetime

import pytest
from fleet_builders import NOW, Fleet, applied, observed

from pdfleet.operator import api
from pdfleet.operator.reconcile_plan.plan import guard, reconcile_plan, settle
from pdfleet.operator.reconcile_plan.progress import progressing_since, seconds_left
from pdfleet.operator.rollout.paired import format_time

T = format_time(NOW)
EARLIER = format_time(NOW - datetime.timedelta(seconds=100))


@pytest.mark.parametrize("previous, prev_gen, gen, running, expected", [
    (None, None, 1, True, T),          # first reconcile of a fleet coming up: the clock starts
    (EARLIER, 1, 1, True, EARLIER),    # still coming up: the clock keeps its start
    (EARLIER, 1, 2, True, T),          # a new spec: a new clock
    (EARLIER, 1, 1, False, None),      # complete (or a canary runs): no clock
    ("junk", 1, 1, True, T),
])
def test_the_clock(previous, prev_gen, gen, running, expected):
    assert progressing_since(previous, prev_gen, gen, running=running, now=NOW) == expected


def test_seconds_left():
    assert seconds_left(EARLIER, 1800, NOW) == 1700
    assert seconds_left(EARLIER, 60, NOW) == -40
    assert seconds_left(None, 60, NOW) is None


def _settle(body, *, ready=False, at=NOW):
    children, pods = applied(body, ready=ready)
    plan = reconcile_plan(observed(body, children, pods, now=at))
    return settle(plan, guard(plan, name="llama"), now=at)


def _cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_not_ready_past_the_deadline_is_stalled_and_before_it_is_not():
    started = NOW - datetime.timedelta(seconds=600)
    fleet = Fleet().spec(progressDeadlineSeconds=600).status(observedGeneration=1,
                                                            progressingSince=format_time(started))
    # Negative control: one second before the deadline, still progressing, and woken at the deadline.
    before = _settle(fleet.body(), at=NOW - datetime.timedelta(seconds=1))
    assert _cond(before.status, "Stalled")["status"] == "False"
    assert _cond(before.status, "Reconciling")["status"] == "True"
    assert before.requeue_after == pytest.approx(2.0)
    assert not [e for e in before.events if e.reason == "ProgressDeadlineExceeded"]
    done = _settle(fleet.body())
    for type_, status in (("Stalled", "True"), ("Degraded", "True"), ("Progressing", "False"),
                          ("Reconciling", "False")):  # kstatus reads Reconciling first: it must be False
        cond = _cond(done.status, type_)
        assert (cond["status"], cond["reason"]) == (status, "ProgressDeadlineExceeded"), (type_, cond)
    message = _cond(done.status, "Stalled")["message"]
    assert "600 s (spec.progressDeadlineSeconds)" in message and "waiting for ready pods: prefill, decode" in message
    assert done.status["progressingSince"] == format_time(started)
    assert [e.type for e in done.events if e.reason == "ProgressDeadlineExceeded"] == ["Warning"]
    # Once posted, not again.
    again = _settle(Fleet().spec(progressDeadlineSeconds=600).status(**done.status).body())
    assert not [e for e in again.events if e.reason == "ProgressDeadlineExceeded"]


def test_ready_clears_the_clock_and_stalled():
    stalled = Fleet().spec(progressDeadlineSeconds=60).status(
        observedGeneration=1, progressingSince=format_time(NOW - datetime.timedelta(hours=1)))
    done = _settle(stalled.body(), ready=True)
    assert _cond(done.status, "Ready")["reason"] == "Ready"
    assert _cond(done.status, "Stalled")["status"] == "False" and "progressingSince" not in done.status


def test_a_new_generation_restarts_the_clock():
    old = Fleet().spec(progressDeadlineSeconds=60).generation(2).status(
        observedGeneration=1, progressingSince=format_time(NOW - datetime.timedelta(hours=1)))
    done = _settle(old.body())
    assert done.status["progressingSince"] == T and _cond(done.status, "Stalled")["status"] == "False"


def test_the_default_is_sized_for_a_download_and_must_be_positive():
    assert api.parse(Fleet().body()).spec.progress_deadline_seconds == 1800
    for bad in (0, -5, "ten"):
        with pytest.raises(api.InvalidResource) as err:
            api.parse(Fleet().spec(progressDeadlineSeconds=bad).body())
        assert "spec.progressDeadlineSeconds" in str(err.value)
