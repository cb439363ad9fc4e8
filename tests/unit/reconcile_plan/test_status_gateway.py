"""Status (pure) with spec.gateway.inferencePool: the Endpoint Picker counts towards Ready, as the router does."""

from __future__ import annotations

import datetime

import pytest

from pdfleet.operator.api import DisaggregatedInferenceStatus
from pdfleet.operator.reconcile_plan.children import ChildRef, ObservedChild
from pdfleet.operator.rollout.paired import Decision, Endpoint, RolloutState
from pdfleet.operator.reconcile_plan.status import StatusInputs, build_status

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
STABLE = Decision("r1", "r1", frozenset({"r1"}), RolloutState(serving="r1"), "Stable")
EP = [Endpoint("f-prefill-r1-0", "10.0.0.2", 5600, 8000, "r1")]


def workload(kind, name, role, rev=None, *, ready, replicas=1):
    return ObservedChild(ChildRef("apps/v1", kind, "ns", name), uid="u", role=role, revision=rev, generation=1,
                         replicas=replicas, observed_generation=1, status_replicas=replicas, ready_replicas=ready,
                         updated_replicas=replicas)


def world(epp_ready, epp_replicas=2):
    out = [workload("StatefulSet", "f-prefill-r1", "prefill", "r1", ready=1),
           workload("StatefulSet", "f-decode-r1", "decode", "r1", ready=1),
           workload("Deployment", "f-router", "router", ready=1)]
    if epp_ready is not None:
        out.append(workload("Deployment", "f-epp", "epp", ready=epp_ready, replicas=epp_replicas))
    return out


def status(children, *, epp_enabled, epp_want=2):
    return build_status(StatusInputs(generation=3, previous={}, decision=STABLE, children=children, endpoints=EP,
                                     desired={"prefill": 1, "decode": 1, "router": 1, "epp": epp_want},
                                     epp_enabled=epp_enabled), now=T0)


def ready(st):
    c = next(c for c in st["conditions"] if c["type"] == "Ready")
    return c["status"], c["reason"], c["message"]


# case, epp enabled, epp ready pods (None: no Deployment), Ready, reason, message contains
CASES = [
    ("picker off: not counted", False, None, "True", "Ready", ""),
    ("picker off, a leftover not ready", False, 0, "True", "Ready", ""),
    ("picker on, not created yet", True, None, "False", "Waiting", "endpoint picker"),
    ("picker on, none ready", True, 0, "False", "Waiting", "endpoint picker"),
    ("picker on, one of two ready: serving", True, 1, "True", "Serving", ""),
    ("picker on, all ready", True, 2, "True", "Ready", ""),
]


@pytest.mark.parametrize("case,enabled,epp_ready,want,reason,message", CASES, ids=[c[0] for c in CASES])
def test_the_picker_counts_towards_ready(case, enabled, epp_ready, want, reason, message):
    st = status(world(epp_ready), epp_enabled=enabled)
    got = ready(st)
    assert got[:2] == (want, reason), got
    assert message in got[2]
    assert ("epp" in st) == enabled
    if enabled:
        assert st["epp"]["readyReplicas"] == (epp_ready or 0)
    DisaggregatedInferenceStatus.model_validate(st)  # the status model accepts what the operator writes
