"""Desired vs observed (pure): hash stamping, what to apply, what to prune."""

from __future__ import annotations

from pdfleet.operator.plan import PlanOptions, plan
from pdfleet.operator.reconcile_plan.children import (
    HASH_ANNOTATION,
    ChildRef,
    diff,
    manifest_hash,
    observe_child,
    owner_reference,
    stamp,
    stray_labels,
    strip_labels_patch,
)

CR = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
      "metadata": {"name": "f", "namespace": "ns", "uid": "uid-1", "generation": 1},
      "spec": {"model": {"name": "m"}}}
OWNER = owner_reference(CR)


def desired(**spec):
    body = {**CR, "spec": {**CR["spec"], **spec}}
    return [stamp(o, OWNER, "ns") for o in plan(body, PlanOptions(default_image="img"))]


def as_observed(objs, **override):
    out = []
    for o in objs:
        live = {**o, "metadata": {**o["metadata"], "uid": "c-" + o["metadata"]["name"], **override}}
        out.append(observe_child(live))
    return out


def test_stamp_sets_owner_and_a_stable_hash():
    a, b = desired(), desired()
    assert a == b
    for o in a:
        assert o["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert o["metadata"]["annotations"][HASH_ANNOTATION] == manifest_hash(o)


def test_nothing_changed_nothing_to_write():
    want = desired()
    actions = diff(want, as_observed(want), owner_uid="uid-1")
    assert actions.writes == 0 and actions.unchanged == len(want)


def test_changed_and_missing_children_are_applied():
    want = desired()
    observed = as_observed(want[1:])
    scaled = desired(prefill={"replicas": 3})
    actions = diff(scaled, observed, owner_uid="uid-1")
    applied = {ChildRef.of(o) for o in actions.apply}
    assert ChildRef.of(want[0]) in applied
    assert any(r.kind == "StatefulSet" and "prefill" in r.name for r in applied)
    assert not actions.delete


def test_prune_respects_owner_and_kept_revisions():
    old = desired()
    new = desired(engine={"blockSize": 32})
    observed = as_observed(old)
    old_rev = next(o["metadata"]["labels"]["pdfleet.io/revision"] for o in old if o["kind"] == "StatefulSet")
    pruned = {c.ref.name for c in diff(new, observed, owner_uid="uid-1").delete}
    assert f"f-prefill-{old_rev}" in pruned and f"f-kv-{old_rev}" in pruned
    kept = diff(new, observed, owner_uid="uid-1", keep_revisions={old_rev}).delete
    assert all(c.revision != old_rev for c in kept)
    # Objects of another owner (a re-created CR with the same name) are never pruned by this one.
    assert diff(new, observed, owner_uid="someone-else").delete == ()


def test_recently_applied_covers_the_watch_lag():
    want = desired()
    recent = {ChildRef.of(o): o["metadata"]["annotations"][HASH_ANNOTATION] for o in want}
    assert diff(want, [], owner_uid="uid-1", recently_applied=recent).writes == 0
    assert diff(want, [], owner_uid="uid-1").writes == len(want)  # negative control


def test_replicas_changed_by_hand_are_put_back():
    want = desired()
    observed = as_observed(want)
    sts = next(i for i, o in enumerate(want) if o["kind"] == "StatefulSet")
    drifted = want[sts] | {"spec": {**want[sts]["spec"], "replicas": 7}}
    observed[sts] = as_observed([drifted])[0]  # same hash annotation, other replicas
    actions = diff(want, observed, owner_uid="uid-1")
    assert [ChildRef.of(o) for o in actions.apply] == [ChildRef.of(want[sts])]


def test_a_kept_current_revision_still_loses_what_the_plan_dropped():
    """Scaling a gang role down drops a per-replica LeaderWorkerSet and PodGroup of the current revision."""
    gang = dict(decode={"replicas": 2, "tensorParallelSize": 2, "nodesPerReplica": 2, "resources": {"gpus": 1}},
                scheduling={"gang": {"provider": "volcano"}})
    before = desired(**gang)
    after = desired(**{**gang, "decode": {**gang["decode"], "replicas": 1}})
    rev = next(o["metadata"]["labels"]["pdfleet.io/revision"] for o in after if o["kind"] == "LeaderWorkerSet")
    observed = as_observed(before)
    dropped = {(c.ref.kind, c.ref.name) for c in
               diff(after, observed, owner_uid="uid-1", keep_revisions={rev}, current_revision=rev).delete}
    assert dropped == {("LeaderWorkerSet", f"f-decode-{rev}-1"), ("PodGroup", f"f-decode-{rev}-1")}
    # Without naming the current revision, keep_revisions protects them (the behaviour for old revisions).
    assert diff(after, observed, owner_uid="uid-1", keep_revisions={rev}).delete == ()


def _relabelled(obj, labels):
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def test_hand_added_fleet_labels_come_off_and_others_stay():
    """Issue 30: the operator owns the pdfleet.io/ label keys on its children; one the plan does not
    set (a canary weight on a Service with no canary) is stripped, anybody else's label stays."""
    want = desired()
    svc = next(o for o in want if o["kind"] == "Service" and "decode" in o["metadata"]["name"])
    labels = svc["metadata"]["labels"]
    rows = [
        # (hand-made labels, keys to strip)
        ({**labels, "pdfleet.io/canary-weight": "100"}, ("pdfleet.io/canary-weight",)),
        ({**labels, "pdfleet.io/canary-weight": "100", "pdfleet.io/x": "1"}, ("pdfleet.io/canary-weight", "pdfleet.io/x")),
        ({**labels, "team": "a", "example.com/pdfleet.io": "y"}, ()),
        (dict(labels), ()),
    ]
    for hand, keys in rows:
        observed = as_observed([_relabelled(o, hand) if o is svc else o for o in want])
        actions = diff(want, observed, owner_uid="uid-1")
        assert [(c.ref.name, k) for c, k in actions.strip] == ([(svc["metadata"]["name"], keys)] if keys else [])
    assert stray_labels(svc, observe_child({**_relabelled(svc, {"pdfleet.io/a": "1"}),
                                            "metadata": {**svc["metadata"], "labels": {"pdfleet.io/a": "1"},
                                                         "deletionTimestamp": "now"}})) == ()
    assert strip_labels_patch(["pdfleet.io/a"]) == {"metadata": {"labels": {"pdfleet.io/a": None}}}
