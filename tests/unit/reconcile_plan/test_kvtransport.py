"""The KVTransport condition from pod statuses (pure)."""

from __future__ import annotations

import json
import math

import pytest

from pdfleet.operator.reconcile_plan.kvtransport import PodTransport, fleet_transport, from_pod_status, role_transport


def pod_status(verdict, name: str = "kv-preflight") -> dict:
    message = verdict if isinstance(verdict, str) else json.dumps(verdict)
    return {"initContainerStatuses": [{"name": name, "state": {"terminated": {"exitCode": 0, "message": message}}}]}


OK = {"status": "True", "reason": "TransportVerified", "message": "over rc", "transport": "rc_mlx5/mlx5_0:1", "gBps": 20.0}
TCP = {"status": "False", "reason": "TCPFallback", "message": "tcp", "transport": "tcp/eth0", "gBps": 0.4}


def test_from_pod_status() -> None:
    assert from_pod_status(pod_status(OK)) == PodTransport("True", "TransportVerified", "over rc", "rc_mlx5/mlx5_0:1", 20.0)
    assert from_pod_status({}) is None
    assert from_pod_status(pod_status(OK, name="other")) is None
    assert from_pod_status(pod_status("not json")) is None
    assert from_pod_status(pod_status({"status": "maybe"})) is None


def test_role_and_fleet() -> None:
    ok, tcp = from_pod_status(pod_status(OK)), from_pod_status(pod_status(TCP))
    assert role_transport([]).status == "Unknown"
    assert role_transport([("p-0", None)]).status == "Unknown"
    good = role_transport([("p-1", ok), ("p-0", ok)])
    assert (good.status, good.transport, good.gbps) == ("True", "rc_mlx5/mlx5_0:1", 20.0)
    bad = role_transport([("d-0", ok), ("d-1", tcp), ("d-2", tcp)])
    assert (bad.status, bad.reason) == ("False", "TCPFallback")
    assert bad.message.startswith("pod d-1 (and 1 more pods)")
    fleet = fleet_transport({"prefill": good, "decode": bad})
    assert (fleet.status, fleet.reason) == ("False", "TCPFallback") and fleet.message.startswith("decode:")
    assert fleet_transport({"prefill": good, "decode": role_transport([])}).status == "Unknown"
    assert fleet_transport({"prefill": good, "decode": good}).status == "True"



@pytest.mark.parametrize("field, value, want", [
    # issue 20 row 9: a list raised TypeError in role_transport; NaN/Infinity reached the status
    ("transport", ["rc", "tcp"], None), ("transport", {"a": 1}, None), ("transport", 5, None),
    ("transport", "x" * 300, "x" * 200),
    ("gBps", float("nan"), None), ("gBps", float("inf"), None), ("gBps", -1.0, None), ("gBps", True, None),
    ("gBps", "20", None), ("gBps", 3, 3.0),
    ("reason", ["r"], ""), ("message", {"m": 1}, ""),
])
def test_verdict_fields_of_the_wrong_type_are_dropped(field, value, want):
    text = json.dumps({**OK, field: value})  # json.dumps writes NaN/Infinity, as a careless writer would
    got = from_pod_status(pod_status(text))
    assert got is not None and got.status == "True"
    attr = {"gBps": "gbps"}.get(field, field)
    assert getattr(got, attr) == want
    role = role_transport([("p-0", got), ("p-1", from_pod_status(pod_status(OK)))])  # never raises
    assert role.status == "True"
    assert role.gbps is None or math.isfinite(role.gbps)

