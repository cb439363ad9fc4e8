"""EndpointSlice -> revisions (pure)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.discovery import endpoint_usable, groups_from_slices, parse_slice
from pdfleet.connector.serving.endpoints import DECODE, PREFILL, Endpoint, select_revision


def es(name, role, revision, addrs, *, fleet="f1", ports=(("http", 8000), ("kv", 5600)), created=None,
       address_type="IPv4"):
    """A slice; addrs: (address, conditions) pairs."""
    meta = {"name": name, "labels": {"pdfleet.io/fleet": fleet, "pdfleet.io/role": role,
                                     "pdfleet.io/revision": revision, "kubernetes.io/service-name": name}}
    if created:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "addressType": address_type,
            "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
            "endpoints": [{"addresses": [a], "conditions": c} for a, c in addrs]}


READY = {"ready": True}


@pytest.mark.parametrize(
    "obj, expected",
    [
        (es("s", "prefill", "r1", [("10.0.0.1", READY)]), [Endpoint("http://10.0.0.1:8000", True)]),
        (es("s", "decode", "r1", [("10.0.0.1", {})]), [Endpoint("http://10.0.0.1:8000", True)]),  # nil = ready
        (es("s", "decode", "r1", [("10.0.0.1", {"ready": False})]), [Endpoint("http://10.0.0.1:8000", False)]),
        (es("s", "decode", "r1", [("10.0.0.1", {"ready": True, "terminating": True})]),
         [Endpoint("http://10.0.0.1:8000", False)]),
        (es("s", "decode", "r1", [("fd00::1", READY)], address_type="IPv6"), [Endpoint("http://[fd00::1]:8000", True)]),
        (es("s", "decode", "r1", [("10.0.0.2", READY)], ports=(("metrics", 9000),)),  # a single port is used
         [Endpoint("http://10.0.0.2:9000", True)]),
    ],
)
def test_parse_slice_endpoints(obj, expected):
    view = parse_slice(obj, "f1", "http")
    assert not isinstance(view, str), view
    assert list(view.endpoints) == expected


@pytest.mark.parametrize(
    "conditions, usable",
    [
        ({}, True),  # all nil: ready
        ({"ready": True}, True),
        ({"ready": False}, False),
        # publishNotReadyAddresses forces ready=true; serving still tells the pod's readiness
        ({"ready": True, "serving": False, "terminating": False}, False),
        ({"ready": True, "serving": True, "terminating": False}, True),
        ({"ready": False, "serving": True, "terminating": True}, False),  # draining
        ({"ready": True, "terminating": True}, False),
        ({"ready": False, "serving": None}, False),  # nil serving defers to ready
    ],
)
def test_endpoint_usable(conditions, usable):
    assert endpoint_usable(conditions) is usable


@pytest.mark.parametrize(
    "obj, needle",
    [
        (es("s", "prefill", "r1", [], fleet="other"), "pdfleet.io/fleet"),
        (es("s", "router", "r1", []), "pdfleet.io/role"),
        (es("s", "prefill", "", []), "pdfleet.io/revision"),
        (es("s", "prefill", "r1", [], ports=(("a", 1), ("b", 2))), "no port named 'http'"),
        ({"metadata": {}}, "pdfleet.io/fleet"),
    ],
)
def test_parse_slice_refuses_with_reason(obj, needle):
    reason = parse_slice(obj, "f1", "http")
    assert isinstance(reason, str) and needle in reason


def test_groups_pair_by_revision_and_merge_slices():
    slices = [
        es("p-r1-a", "prefill", "r1", [("10.0.0.1", READY)], created="2026-01-01T00:00:00Z"),
        es("p-r1-b", "prefill", "r1", [("10.0.0.1", {"ready": False}), ("10.0.0.2", {"ready": False})],
           created="2026-01-01T00:05:00Z"),
        es("d-r1", "decode", "r1", [("10.0.1.1", READY)], created="2026-01-01T00:00:00Z"),
        es("p-r2", "prefill", "r2", [("10.0.2.1", READY)], created="2026-02-01T00:00:00Z"),
        es("d-r2", "decode", "r2", [("10.0.3.1", {"ready": False})], created="2026-02-01T00:00:00Z"),
        es("p-x", "prefill", "r2", [("10.9.9.9", READY)], fleet="other"),  # another fleet's slice
    ]
    groups = {g.revision: g for g in groups_from_slices(slices, "f1", "http")}
    assert set(groups) == {"r1", "r2"}
    r1, r2 = groups["r1"], groups["r2"]
    # 10.0.0.1 is ready in one slice and not in the other: ready
    assert r1.ready(PREFILL) == ("http://10.0.0.1:8000",)
    assert [e.url for e in r1.prefill] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert r1.ready(DECODE) == ("http://10.0.1.1:8000",)
    assert r2.ready(PREFILL) == ("http://10.0.2.1:8000",) and r2.ready(DECODE) == ()
    assert r2.created > r1.created
    # r2 is newer but has no ready decode: r1 serves, and none of r2's endpoints
    chosen = select_revision(groups.values()).revision
    assert chosen.revision == "r1"
    assert not set(chosen.ready(PREFILL) + chosen.ready(DECODE)) & {"http://10.0.2.1:8000", "http://10.9.9.9:8000"}
