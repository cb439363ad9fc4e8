"""InferencePoolAccepted (pure): the gateways' status.parents on the fleet's InferencePool, summed up."""

from __future__ import annotations

import datetime

import pytest

from pdfleet.operator.kube.observed import observe_child
from pdfleet.operator.kube.pool_status import ParentCondition, parse_parents, pool_condition
from pdfleet.operator.reconcile_plan.children import ChildRef, ObservedChild
from pdfleet.operator.rollout.paired import Decision, RolloutState
from pdfleet.operator.reconcile_plan.status import StatusInputs, build_status


def parent(name, accepted="True", resolved="True", reason="", message=""):
    conds = []
    for type_, status in (("Accepted", accepted), ("ResolvedRefs", resolved)):
        if status is not None:
            conds.append({"type": type_, "status": status, "reason": reason or type_, "message": message,
                          "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1})
    return {"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gw", "name": name},
            "conditions": conds}


# case, status.parents, (status, reason, message contains)
CASES = [
    ("no gateway yet", [], ("Unknown", "NoParent", "HTTPRoute")),
    ("accepted", [parent("a")], ("True", "Accepted", "Gateway/gw/a")),
    ("two gateways", [parent("a"), parent("b")], ("True", "Accepted", "Gateway/gw/a, Gateway/gw/b")),
    ("not accepted", [parent("a", accepted="False", reason="NotSupportedByGateway", message="no ext_proc")],
     ("False", "NotSupportedByGateway", "Accepted=False (NotSupportedByGateway) no ext_proc")),
    ("picker unresolved", [parent("a", resolved="False", reason="InvalidExtensionRef")],
     ("False", "InvalidExtensionRef", "ResolvedRefs=False")),
    ("one of two fails", [parent("a"), parent("b", accepted="False", reason="X")], ("False", "X", "Gateway/gw/b")),
    ("resolved not said yet", [parent("a", resolved=None)], ("Unknown", "Pending", "Gateway/gw/a ResolvedRefs")),
    ("unknown status", [parent("a", accepted="Unknown")], ("Unknown", "Pending", "Accepted")),
]


@pytest.mark.parametrize("case,parents,want", CASES, ids=[c[0] for c in CASES])
def test_the_gateways_word_summed_up(case, parents, want):
    status, reason, message = pool_condition(True, parse_parents({"parents": parents}))
    assert (status, reason) == want[:2]
    assert want[2] in message


def test_no_pool_no_condition_and_malformed_parents_are_skipped():
    assert pool_condition(False, ()) is None
    junk = {"parents": ["x", {"parentRef": "y"}, {"parentRef": {"name": "a"}, "conditions": ["z", {"type": "Other"}]}]}
    assert parse_parents(junk) == ()
    assert parse_parents(None) == () and parse_parents({"parents": "no"}) == ()
    assert len(parse_parents({"parents": [parent(str(i)) for i in range(40)]})) == 64  # 32 parents kept


def test_the_watch_reads_a_pools_parents_and_nothing_elses():
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "f", "namespace": "ns", "labels": {"pdfleet.io/fleet": "f"}},
            "spec": {}, "status": {"parents": [parent("a")]}}
    assert observe_child(pool).pool_parents == (
        ParentCondition("Gateway/gw/a", "Accepted", "True", "Accepted"),
        ParentCondition("Gateway/gw/a", "ResolvedRefs", "True", "ResolvedRefs"))
    svc = {**pool, "apiVersion": "v1", "kind": "Service"}
    assert observe_child(svc).pool_parents == ()


STABLE = Decision("r1", "r1", frozenset({"r1"}), RolloutState(serving="r1"), "Stable")


def fleet_status(children, epp_enabled):
    return build_status(StatusInputs(generation=1, previous={}, decision=STABLE, children=children,
                                     desired={"prefill": 1, "decode": 1, "router": 1, "epp": 1},
                                     epp_enabled=epp_enabled),
                        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))


def test_the_fleet_condition_is_there_with_the_pool_only():
    pool = ObservedChild(ChildRef("inference.networking.k8s.io/v1", "InferencePool", "ns", "f"),
                         pool_parents=parse_parents({"parents": [parent("a", accepted="False", reason="R")]}))
    st = fleet_status([pool], epp_enabled=True)
    (c,) = [c for c in st["conditions"] if c["type"] == "InferencePoolAccepted"]
    assert (c["status"], c["reason"]) == ("False", "R")
    st = fleet_status([], epp_enabled=True)  # the pool not observed yet
    (c,) = [c for c in st["conditions"] if c["type"] == "InferencePoolAccepted"]
    assert (c["status"], c["reason"]) == ("Unknown", "NoParent")
    assert not [c for c in fleet_status([pool], epp_enabled=False)["conditions"] if c["type"] == "InferencePoolAccepted"]
