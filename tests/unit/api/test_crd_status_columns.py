"""`kubectl get dinf` (issue 39): replicas as the status reports them, and the Ready condition's reason."""

from __future__ import annotations

from pdfleet.operator.api import DisaggregatedInferenceStatus
from pdfleet.operator.api.crd import crd, status_schema


def columns() -> dict[str, str]:
    return {c["name"]: c["jsonPath"] for c in crd()["spec"]["versions"][0]["additionalPrinterColumns"]}


def test_replica_columns_read_the_status_not_the_spec():
    cols = columns()
    for role in ("Prefill", "Decode"):
        assert cols[role] == f".status.{role.lower()}.desiredReplicas"  # was .spec.<role>.replicas
        assert cols[f"{role}-Ready"] == f".status.{role.lower()}.readyReplicas"
    assert not [path for path in cols.values() if ".replicas" in path and path.startswith(".spec")]


def test_reason_column_is_the_ready_conditions_reason():
    assert columns()["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'


def test_the_status_schema_holds_what_the_columns_and_the_deadline_read():
    props = status_schema()["properties"]
    assert props["prefill"]["properties"]["desiredReplicas"]["type"] == "integer"
    assert props["progressingSince"]["type"] == "string"
    DisaggregatedInferenceStatus.model_validate({"prefill": {"desiredReplicas": 3}, "progressingSince": "x"})
