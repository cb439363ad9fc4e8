"""The fabric verdict: what the preflight writes is what the operator and the connector read."""

from __future__ import annotations

import pytest

from pdfleet.connector.fabric.exported import info_labels
from pdfleet.connector.fabric.verdict import ProbeRecord, decide
from pdfleet.contract.fabric import MAX_BYTES, FabricVerdict, parse_verdict
from pdfleet.operator.reconcile_plan.kvtransport import from_pod_status


def pod_status(message: str) -> dict:
    return {"initContainerStatuses": [{"name": "kv-preflight", "state": {"terminated": {"message": message}}}]}


@pytest.mark.parametrize("record", [
    ProbeRecord(want="any", gbps=5.2, bytes_ok=True, ucx_log=""),
    ProbeRecord(want="rdma", gbps=0.3, bytes_ok=True),
    ProbeRecord(want="any", error="no usable transports"),
])
def test_operator_and_connector_read_what_the_probe_writes(record):
    verdict = decide(record)
    text = verdict.to_json()
    assert parse_verdict(text) == FabricVerdict(verdict.status, verdict.reason, verdict.message, verdict.transport,
                                                None if verdict.gbps is None else round(verdict.gbps, 3))
    seen = from_pod_status(pod_status(text))
    assert seen is not None and seen.status == ("True" if verdict.status else "False")
    assert seen.reason == verdict.reason
    assert info_labels(text)["reason"] == verdict.reason


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"status": "maybe"}', '{"status": "True"' + " " * MAX_BYTES + "}"])
def test_garbage_is_no_verdict(text):
    assert parse_verdict(text) is None
    assert from_pod_status(pod_status(text)) is None
    assert info_labels(text)["status"] == "Unknown"
