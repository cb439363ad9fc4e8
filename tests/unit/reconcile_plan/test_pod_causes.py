"""Why pods are not ready (pure; issue 39): one cause per pod from its status, grouped per role, in the
Ready condition and as one Warning event per new cause; only the fleet's own pods count."""

from __future__ import annotations

import dataclasses

import pod_states as ps
import pytest
from fleet_builders import Fleet, applied, observed

from pdfleet.operator.kube.observed import ObservedPod
from pdfleet.operator.kube.pod_causes import MAX_TEXT, PodCause, clip, pod_cause
from pdfleet.operator.reconcile_plan import causes as rc
from pdfleet.operator.reconcile_plan.plan import guard, reconcile_plan, settle
from fleet_builders import NOW


@pytest.mark.parametrize("status, reason, subject_has, detail_has", [
    (ps.unschedulable(), "Unschedulable", "0/3 nodes are available: 3 Insufficient rdma/ib", ""),
    (ps.image_pull_back_off(), "ImagePullBackOff", f"image {ps.IMAGE}", ""),
    (ps.err_image_pull(), "ImagePullBackOff", f"image {ps.IMAGE}", ""),  # the same cause: they alternate
    (ps.missing_secret(), "CreateContainerConfigError", 'secret "hf-token" not found', ""),
    (ps.missing_key(), "CreateContainerConfigError", "couldn't find key token in Secret team-a/hf-token", ""),
    (ps.crash_loop(), "CrashLoopBackOff", "container vllm exited 1 (Error)", "ValueError: max_model_len 131072"),
    (ps.crash_loop("", 137, "OOMKilled"), "CrashLoopBackOff", "container vllm exited 137 (OOMKilled)", ""),
])
def test_each_failing_state_has_its_cause(status, reason, subject_has, detail_has):
    cause = pod_cause(status)
    assert cause is not None and cause.reason == reason
    assert subject_has in cause.subject and detail_has in cause.detail
    assert "preemption" not in cause.subject  # the scheduler's first sentence only


@pytest.mark.parametrize("status", [
    ps.starting(), ps.running_not_ready(), None, {}, {"phase": "Pending"},
    {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]},
    {"containerStatuses": [{"name": "vllm", "state": {"waiting": {"reason": "PodInitializing"}}}]},
    {"containerStatuses": ["junk", {"state": "junk"}]},
])
def test_no_cause_for_a_pod_on_its_way(status):
    """Negative controls: scheduled and starting, running, gated, junk."""
    assert pod_cause(status) is None


def test_an_init_container_speaks_before_the_engine_and_the_scheduler_before_both():
    init = ps.image_pull_back_off("registry.example/preflight:1")["containerStatuses"]
    status = {**ps.crash_loop(), "initContainerStatuses": init}
    assert pod_cause(status).subject == "image registry.example/preflight:1"
    assert pod_cause({**status, **ps.unschedulable()}).reason == "Unschedulable"


def test_messages_are_clipped_and_a_crash_keeps_its_last_words():
    long_log = "x" * 5000 + " the last line"
    cause = pod_cause(ps.crash_loop(long_log))
    assert len(cause.detail) == MAX_TEXT and cause.detail.endswith("the last line")
    assert len(pod_cause(ps.unschedulable("y" * 5000)).subject) == MAX_TEXT
    assert clip("a\n  b") == "a b" and clip("z" * 300).endswith("…")


def _pod(name, role, cause_status, *, ready=False, deleting=False):
    return ObservedPod("ns", name, role, "r1", None, ready, deleting, cause=pod_cause(cause_status))


def test_causes_are_grouped_per_role_and_counted():
    pods = [_pod("f-decode-r1-1", "decode", ps.crash_loop()), _pod("f-decode-r1-0", "decode", ps.crash_loop("other")),
            _pod("f-prefill-r1-0", "prefill", ps.unschedulable()), _pod("f-prefill-r1-1", "prefill", ps.unschedulable()),
            _pod("f-prefill-r1-2", "prefill", ps.image_pull_back_off()),
            _pod("f-prefill-r1-3", "prefill", ps.unschedulable(), ready=True),        # ready: no cause
            _pod("f-prefill-r1-4", "prefill", ps.unschedulable(), deleting=True),     # going: no cause
            _pod("f-prefill-r1-5", "prefill", ps.starting())]
    causes = rc.role_causes(pods)
    assert [(c.role, c.cause.reason, c.pods) for c in causes] == [
        ("prefill", "Unschedulable", 2), ("prefill", "ImagePullBackOff", 1), ("decode", "CrashLoopBackOff", 2)]
    assert causes[2].pod == "f-decode-r1-0" and causes[2].cause.detail == "other"  # the first pod by name
    message = rc.causes_message(causes)
    assert message.startswith("prefill Unschedulable (2 pods): 0/3 nodes are available: 3 Insufficient rdma/ib; ")
    assert "decode CrashLoopBackOff (2 pods): container vllm exited 1 (Error): other" in message
    assert rc.first_reason(causes, ["decode"]) == "CrashLoopBackOff" and rc.first_reason(causes, ["router"]) is None


def test_the_message_is_bounded_by_count():
    pods = [_pod(f"f-decode-r1-{i}", "decode", ps.image_pull_back_off(f"img:{i}")) for i in range(7)]
    message = rc.causes_message(rc.role_causes(pods))
    assert message.count("ImagePullBackOff") == rc.MAX_SHOWN and message.endswith("; and 3 more")


def test_one_event_per_new_cause_remembered_until_complete():
    cl = rc.role_causes([_pod("f-decode-r1-0", "decode", ps.crash_loop())])
    assert rc.new_causes(cl, frozenset()) == list(cl)
    reported = rc.remembered(cl, frozenset(), complete=False)
    # The container restarts (no cause for a while), then crashes again with another log line: no new event.
    between = rc.remembered((), reported, complete=False)
    again = rc.role_causes([_pod("f-decode-r1-0", "decode", ps.crash_loop("another traceback"))])
    assert rc.new_causes(again, between) == []
    # Another cause is new; once complete, the slate is clean.
    pull = rc.role_causes([_pod("f-decode-r1-0", "decode", ps.image_pull_back_off())])
    assert rc.new_causes(pull, between) == list(pull)
    assert rc.new_causes(cl, rc.remembered((), between, complete=True)) == list(cl)


def _fleet_pods(body, status_of):
    """The fleet's engine pods (owned by its StatefulSets) with the given statuses by role."""
    children, pods = applied(body, ready=False)
    return children, [dataclasses.replace(p, cause=pod_cause(status_of.get(p.role))) for p in pods]


@pytest.mark.parametrize("state", sorted(ps.FAILING))
def test_plan_names_the_cause_in_ready_and_posts_one_warning(state):
    body = Fleet().body()
    children, pods = _fleet_pods(body, {"decode": ps.FAILING[state]()})
    plan = reconcile_plan(observed(body, children, pods))
    done = settle(plan, guard(plan, name="llama"), now=NOW)
    ready = next(c for c in done.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", state)
    assert "waiting for ready pods: prefill, decode, router; decode " + state in ready["message"]
    warnings = [e for e in done.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == [state] and warnings[0].message.startswith("decode pod llama-decode-")
    # The next reconcile, same world: the cause is remembered, no second event.
    again = reconcile_plan(observed(body, children, pods, causes_reported=done.causes_reported))
    assert [e for e in settle(again, guard(again, name="llama"), now=NOW).events if e.type == "Warning"] == []


def test_a_pod_with_the_fleets_labels_but_not_its_owner_is_no_cause():
    """Identity is ownership: a pod anyone made with the fleet's labels, failing, says nothing."""
    body = Fleet().body()
    children, pods = _fleet_pods(body, {})
    stray = dataclasses.replace(pods[0], name="llama-prefill-x-0", uid="stray", controller=None,
                                cause=PodCause("ImagePullBackOff", "image evil:1"))
    plan = reconcile_plan(observed(body, children, [*pods, stray]))
    done = settle(plan, guard(plan, name="llama"), now=NOW)
    ready = next(c for c in done.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Waiting" and "evil" not in ready["message"]
    assert not [e for e in done.events if e.type == "Warning"]
    # Control: the same cause on an owned pod is reported.
    owned = dataclasses.replace(pods[0], cause=stray.cause)
    plan = reconcile_plan(observed(body, children, [owned, *pods[1:]]))
    assert "evil" in next(c for c in settle(plan, guard(plan, name="llama"), now=NOW).status["conditions"]
                          if c["type"] == "Ready")["message"]
