"""status.kvOffload (issue 40 part 4): the host-memory tier the engines were configured with, in the status the
operator writes and its status model accepts; absent without spec.kvOffload (negative control)."""

from __future__ import annotations

import datetime

import yaml

from pdfleet.operator.api import DisaggregatedInferenceStatus, parse
from pdfleet.operator.plan import offload
from pdfleet.operator.reconcile_plan.status import StatusInputs, build_status
from pdfleet.operator.rollout.paired import Decision, RolloutState

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
STABLE = Decision("r1", "r1", frozenset({"r1"}), RolloutState(serving="r1"), "Stable")
TINY = """
apiVersion: pdfleet.io/v1alpha1
kind: DisaggregatedInference
metadata: {name: tiny}
spec:
  model: {name: m}
  engine: {blockSize: 32}
  prefill: {resources: {gpus: 0}}
  decode: {resources: {gpus: 0}}
  kvTransfer: {bufferDevice: cpu}
"""


def status_of(kv_offload):
    cr = yaml.safe_load(TINY)
    if kv_offload is not None:
        cr["spec"]["kvOffload"] = kv_offload
    tier = offload.status(parse(cr).spec)
    return build_status(StatusInputs(generation=1, previous={}, decision=STABLE, kv_offload=tier), now=T0)


def test_the_tier_is_in_status_and_the_status_model_accepts_it():
    st = status_of({"cpu": {"capacity": "16Gi"}, "roles": ["decode"], "blockSize": 64})
    assert st["kvOffload"] == {"capacity": "16Gi", "capacityBytes": 16 * 2**30, "roles": ["decode"], "blockSize": 64}
    assert DisaggregatedInferenceStatus.model_validate(st).kv_offload.capacity_bytes == 16 * 2**30


def test_without_the_tier_status_has_none():
    assert "kvOffload" not in status_of(None)
