"""Paired rollouts (pure): the router's endpoint set never mixes revisions; switch and drain rules."""

from __future__ import annotations

import datetime
import itertools

import pytest

from pdfleet.operator.reconcile_plan.children import ObservedPod
from pdfleet.operator.kube.observed import observe_child
from pdfleet.operator.rollout.paired import RolloutState, decide, format_time, front_ends_rolled, router_endpoints

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
PORTS = {"old": (5600, 8000), "new": (5700, 8001), "mid": (5600, 8000)}


def pod(role: str, revision: str, i: int = 0, *, ready: bool = True, ip: str | None = "auto", deleting=False):
    return ObservedPod("ns", f"f-{role}-{revision}-{i}", role, revision,
                       f"10.0.{len(revision)}.{i + 2}" if ip == "auto" else ip, ready, deleting)


POD_POOL = [
    pod("prefill", "old", 0), pod("prefill", "old", 1, ready=False), pod("decode", "old", 0),
    pod("prefill", "new", 0), pod("prefill", "new", 1), pod("decode", "new", 0, ready=False),
    pod("prefill", "mid", 0, deleting=True), pod("prefill", "new", 2, ip=None), pod("router", "old", 0),
]


@pytest.mark.parametrize("serving", ["old", "new", "mid", "gone"])
@pytest.mark.parametrize("subset", range(0, 2 ** len(POD_POOL), 37))
def test_router_endpoints_never_mix_revisions(serving, subset):
    pods = [p for i, p in enumerate(POD_POOL) if subset >> i & 1]
    endpoints = router_endpoints(pods, serving, PORTS)
    assert {e.revision for e in endpoints} <= {serving}
    for e in endpoints:
        source = next(p for p in pods if p.name == e.pod)
        assert source.role == "prefill" and source.ready and not source.deleting and source.ip == e.ip
        assert (e.side_channel_port, e.http_port) == PORTS[serving]


def test_router_endpoints_table():
    pods = list(POD_POOL)
    assert [e.pod for e in router_endpoints(pods, "old", PORTS)] == ["f-prefill-old-0"]
    assert [e.pod for e in router_endpoints(pods, "new", PORTS)] == ["f-prefill-new-0", "f-prefill-new-1"]
    assert router_endpoints(pods, "mid", PORTS) == []       # terminating pods are not endpoints
    assert router_endpoints(pods, "gone", PORTS) == []      # no known ports: nothing
    # Negative control: a selection that ignores the revision would mix them.
    mixed = {p.revision for p in pods if p.role == "prefill" and p.ready and p.ip and not p.deleting}
    assert len(mixed) > 1


def run(target, state, pods, present, *, now=NOW, drain=30.0):
    return decide(target, state, pods, present, now=now, drain_seconds=drain)


def test_first_deploy_serves_the_target():
    d = run("new", RolloutState(), [], [])
    assert (d.serving, d.phase, d.keep) == ("new", "Stable", frozenset({"new"}))


def test_scaling_alone_is_stable():
    d = run("old", RolloutState(serving="old"), [pod("prefill", "old")], ["old"])
    assert (d.serving, d.phase, d.keep, d.requeue_after) == ("old", "Stable", frozenset({"old"}), None)


@pytest.mark.parametrize("ready_roles", [set(), {"prefill"}, {"decode"}])
def test_no_switch_until_both_new_roles_have_ready_pods(ready_roles):
    pods = [pod("prefill", "old"), pod("decode", "old")]
    pods += [pod(r, "new", ready=r in ready_roles) for r in ("prefill", "decode")]
    d = run("new", RolloutState(serving="old"), pods, ["old", "new"])
    assert (d.serving, d.phase, d.keep) == ("old", "RollingOut", frozenset({"old", "new"}))


def test_switch_then_drain_then_prune():
    pods = [pod(r, rev) for r in ("prefill", "decode") for rev in ("old", "new")]
    d = run("new", RolloutState(serving="old"), pods, ["old", "new"])
    assert (d.serving, d.phase, d.keep) == ("new", "Draining", frozenset({"old", "new"}))
    assert d.state == RolloutState(serving="new", previous="old", switched_at=format_time(NOW))
    assert d.requeue_after == pytest.approx(30.0)
    later = run("new", d.state, pods, ["old", "new"], now=NOW + datetime.timedelta(seconds=10))
    assert later.phase == "Draining" and later.requeue_after == pytest.approx(20.0)
    done = run("new", d.state, pods, ["old", "new"], now=NOW + datetime.timedelta(seconds=31))
    assert (done.phase, done.keep, done.state) == ("Stable", frozenset({"new"}), RolloutState(serving="new"))


def test_spec_change_mid_rollout_drops_the_never_served_revision():
    pods = [pod(r, "old") for r in ("prefill", "decode")] + [pod("prefill", "mid", ready=False)]
    d = run("new", RolloutState(serving="old"), pods, ["old", "mid", "new"])
    assert (d.serving, d.keep) == ("old", frozenset({"old", "new"}))


def test_nothing_to_protect_switches_at_once():
    d = run("new", RolloutState(serving="old"), [], [])
    assert d.serving == "new" and d.keep == frozenset({"new"})


def test_decisions_only_move_forward():
    """Replaying a rollout at every step: the served revision never goes back to 'old' after a switch."""
    states = [RolloutState(serving="old")]
    served = []
    for step, _new_ready in itertools.product(range(6), [False]):
        pods = [pod(r, "old") for r in ("prefill", "decode")]
        pods += [pod(r, "new", ready=step >= 2) for r in ("prefill", "decode")]
        d = run("new", states[-1], pods, ["old", "new"], now=NOW + datetime.timedelta(seconds=20 * step))
        states.append(d.state)
        served.append(d.serving)
    assert served == ["old", "old", "new", "new", "new", "new"]
    assert states[-1] == RolloutState(serving="new")


def _child(kind: str, name: str, revision: str | None, *, serving=False, deleting=False):
    from pdfleet.operator.reconcile_plan.children import ChildRef, ObservedChild

    return ObservedChild(ChildRef("v1" if kind == "Service" else "apps/v1", kind, "ns", name), revision=revision,
                         serving=serving, deleting=deleting)


@pytest.mark.parametrize("children, serving, stale", [
    ([], "new", []),
    ([_child("Service", "f-prefill-new", "new", serving=True)], "new", []),
    ([_child("Service", "f-prefill-old", "old", serving=True), _child("Service", "f-prefill-new", "new", serving=True)],
     "new", ["f-prefill-old"]),  # after the switch: the old pair loses the label
    ([_child("Service", "f-prefill-old", "old", serving=True), _child("Service", "f-prefill-new", "new")],
     "old", []),  # rolling out: the old pair keeps it, the new has none yet
    ([_child("Service", "f-prefill-old", "old")], "new", []),  # already unmarked: no write
    ([_child("Service", "f-prefill-old", "old", serving=True, deleting=True)], "new", []),  # going anyway
    ([_child("StatefulSet", "f-prefill-old", "old", serving=True)], "new", []),  # only Services carry it
])
def test_stale_serving_marks(children, serving, stale):
    from pdfleet.operator.rollout.paired import stale_serving_marks

    assert [c.ref.name for c in stale_serving_marks(children, serving)] == stale


def test_unmark_serving_removes_the_label_and_the_applied_hash():
    from pdfleet.contract import labels
    from pdfleet.operator.rollout.paired import unmark_serving

    patch = unmark_serving()
    assert patch["metadata"]["labels"] == {labels.SERVING: None}
    assert patch["metadata"]["annotations"] == {labels.APPLIED_HASH: None}


def _front_end(role: str, generation: int, observed: int, replicas: int, updated: int, deleting: bool = False):
    return observe_child({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": f"f-{role}", "namespace": "ns", "uid": role, "generation": generation,
                                       "labels": {"pdfleet.io/role": role},
                                       **({"deletionTimestamp": "x"} if deleting else {})},
                          "spec": {"replicas": replicas, "template": {}},
                          "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated}})


def test_front_ends_rolled_table():
    rows = [
        ([], True),
        ([_front_end("router", 2, 2, 2, 2)], True),
        ([_front_end("router", 2, 1, 2, 2)], False),             # the controller has not seen the change
        ([_front_end("router", 2, 2, 3, 2)], False),             # one pod of an older template left
        ([_front_end("epp", 3, 3, 2, 1)], False),
        ([_front_end("router", 2, 2, 2, 2), _front_end("epp", 2, 1, 1, 1)], False),
        ([_front_end("router", 2, 1, 2, 0, deleting=True)], True),  # going away: nobody's caller
        ([_front_end("prefill", 2, 1, 2, 0)], True),             # not a caller of the engines
    ]
    for children, want in rows:
        assert front_ends_rolled(children) is want, children


def test_a_ready_new_pair_waits_for_the_front_ends_unless_nothing_is_left_to_protect():
    pods = [pod(r, rev) for r in ("prefill", "decode") for rev in ("old", "new")]
    wait = decide("new", RolloutState(serving="old"), pods, ["old", "new"], now=NOW, drain_seconds=30,
                  front_ends_rolled=False)
    assert (wait.serving, wait.phase) == ("old", "RollingOut")
    held = decide("new", RolloutState(serving="old"), pods, ["old", "new"], now=NOW, drain_seconds=30,
                  front_ends_rolled=False, hold=True)
    assert (held.serving, held.phase) == ("old", "Canary")  # a canary's hold still says Canary
    gone = decide("new", RolloutState(serving="old"), [p for p in pods if p.revision == "new"], ["new"], now=NOW,
                  drain_seconds=30, front_ends_rolled=False)
    assert gone.serving == "new"
    # control: rolled front ends switch at once
    assert decide("new", RolloutState(serving="old"), pods, ["old", "new"], now=NOW, drain_seconds=30).serving == "new"
