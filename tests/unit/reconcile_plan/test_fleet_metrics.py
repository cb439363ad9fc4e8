"""The fleet gauges: replicas per role and state, conditions as true/false series, serving revision."""

from __future__ import annotations

import pytest

from pdfleet.operator.reconcile_plan.fleet_metrics import fleet_series
from pdfleet.operator.reconcile.metrics import OperatorMetrics

STATUS = {
    "revision": "r1",
    "prefill": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2},
    "decode": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1},
    "router": {"replicas": 1, "readyReplicas": 0},
    "conditions": [{"type": "Ready", "status": "False"}, {"type": "Degraded", "status": "True"}],
}


@pytest.mark.parametrize("status, desired, role, state, want", [
    (STATUS, {"prefill": 3, "decode": 1, "router": 1}, "prefill", "desired", 3),
    (STATUS, {"prefill": 3, "decode": 1, "router": 1}, "prefill", "ready", 1),
    (STATUS, {"prefill": 3, "decode": 1, "router": 1}, "router", "updated", 0),   # absent in status: 0
    ({}, {"prefill": 2}, "prefill", "ready", 0),                                   # nothing observed yet
    ({}, {"prefill": 2}, "decode", "desired", None),                               # role neither wanted nor seen
])
def test_replicas(status, desired, role, state, want):
    assert fleet_series(status, desired).replicas.get((role, state)) == want


def test_conditions_and_revision():
    s = fleet_series(STATUS, {})
    assert s.conditions == {"Ready": False, "Degraded": True}
    assert s.revision == "r1"
    assert fleet_series({"conditions": [{"status": "True"}]}, {}).conditions == {}  # no type: skipped
    assert fleet_series({}, {}).revision is None


def test_gauges_follow_the_status_and_forget_the_old_revision():
    m = OperatorMetrics()
    m.observe_fleet("ns", "llama", STATUS, {"prefill": 3, "decode": 1})
    assert m.count("pdfleet_operator_fleet_replicas", {"fleet": "llama", "role": "prefill", "state": "desired"}) == 3
    assert m.count("pdfleet_operator_fleet_condition", {"type": "Ready", "status": "false"}) == 1
    assert m.count("pdfleet_operator_fleet_condition", {"type": "Ready", "status": "true"}) == 0
    assert m.count("pdfleet_operator_fleet_revision_info", {"revision": "r1"}) == 1

    m.observe_fleet("ns", "llama", {**STATUS, "revision": "r2",
                                     "conditions": [{"type": "Ready", "status": "True"}]}, {"prefill": 3})
    assert m.count("pdfleet_operator_fleet_revision_info", {"revision": "r1"}) == 0
    assert m.count("pdfleet_operator_fleet_revision_info", {"revision": "r2"}) == 1
    assert m.count("pdfleet_operator_fleet_condition", {"type": "Ready", "status": "true"}) == 1
    assert m.count("pdfleet_operator_fleet_condition", {"type": "Degraded"}) == 0  # gone from the status

    m.forget_fleet("ns", "llama")
    names = {s.name for metric in m.registry.collect() for s in metric.samples}
    assert not names & {"pdfleet_operator_fleet_replicas", "pdfleet_operator_fleet_condition",
                        "pdfleet_operator_fleet_revision_info"}
