"""Which EndpointSlices the router may use (pure; issue 20 row 1)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.ownership import (
    needs_service_refresh,
    owned_services,
    owned_slices,
    service_owner_problem,
    slice_owner_problem,
)

FLEET_REF = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "f1", "uid": "U",
             "controller": True}


def svc(name="f1-decode-r1", uid="S1", refs=(FLEET_REF,)):
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": [dict(r) for r in refs]}}


def es(service="f1-decode-r1", uid="S1", managed="endpointslice-controller.k8s.io", ref_kind="Service",
       ref_name=None, controller=True, refs=True):
    labels = {"pdfleet.io/fleet": "f1", "kubernetes.io/service-name": service}
    if managed:
        labels["endpointslice.kubernetes.io/managed-by"] = managed
    meta = {"name": "s", "labels": labels}
    if refs:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": ref_kind, "name": ref_name or service, "uid": uid,
                                    "controller": controller}]
    return {"metadata": meta}


@pytest.mark.parametrize("service, uid, expected", [
    (svc(), None, None),
    (svc(), "U", None),
    (svc(), "other", "owner uid 'U' is not the fleet's"),
    (svc(refs=()), None, "no controller ownerReference"),
    (svc(refs=({**FLEET_REF, "controller": False},)), None, "no controller ownerReference"),
    (svc(refs=({**FLEET_REF, "name": "f2"},)), None, "controlled by DisaggregatedInference/f2, not DisaggregatedInference/f1"),
    (svc(refs=({**FLEET_REF, "apiVersion": "evil.io/v1"},)), None,
     "controlled by DisaggregatedInference/f1, not DisaggregatedInference/f1"),
    (svc(refs=({**FLEET_REF, "kind": "Deployment"},)), None, "controlled by Deployment/f1, not DisaggregatedInference/f1"),
    (svc(uid=None), None, "no metadata.uid"),
    ({"metadata": "junk"}, None, "no controller ownerReference"),
    ({"metadata": {"ownerReferences": "junk"}}, None, "no controller ownerReference"),
])
def test_service_owner(service, uid, expected):
    assert service_owner_problem(service, "f1", uid) == expected


def test_owned_services_keeps_only_the_fleets():
    services = [svc(), svc("rogue", "R", refs=()), svc("f1-prefill-r1", "S2"), "junk"]
    assert owned_services(services, "f1", "U") == {"f1-decode-r1": "S1", "f1-prefill-r1": "S2"}
    assert owned_services(services, "f1", "V") == {}


OWNED = {"f1-decode-r1": "S1"}


@pytest.mark.parametrize("obj, problem", [
    (es(), None),
    (es(managed=None), "label endpointslice.kubernetes.io/managed-by is None, not 'endpointslice-controller.k8s.io'"),
    (es(managed="endpointslice-mirroring-controller.k8s.io"),  # mirrored from a hand-made Endpoints object
     "label endpointslice.kubernetes.io/managed-by is 'endpointslice-mirroring-controller.k8s.io', "
     "not 'endpointslice-controller.k8s.io'"),
    (es(service="rogue"), "label kubernetes.io/service-name='rogue' names no Service of the fleet"),
    (es(refs=False), "not controlled by Service f1-decode-r1"),
    (es(controller=False), "not controlled by Service f1-decode-r1"),
    (es(ref_kind="Pod"), "not controlled by Service f1-decode-r1"),
    (es(ref_name="other"), "not controlled by Service f1-decode-r1"),
    (es(uid="S-remade"), "controlled by another Service f1-decode-r1 (uid 'S-remade')"),
    ({"metadata": None}, "label endpointslice.kubernetes.io/managed-by is None, not 'endpointslice-controller.k8s.io'"),
])
def test_slice_owner(obj, problem):
    assert slice_owner_problem(obj, OWNED) == problem


def test_owned_slices_splits_and_names_the_refused():
    good, bad = es(), es(managed=None)
    bad["metadata"]["name"] = "evil"
    kept, refused = owned_slices([good, bad], OWNED)
    assert kept == [good]
    assert [name for name, _ in refused] == ["evil"]
    assert owned_slices([good], {}) == ([], [("s", "label kubernetes.io/service-name='f1-decode-r1' names no "
                                                   "Service of the fleet")])


@pytest.mark.parametrize("obj, expected", [
    (es(), False),  # known name and uid
    (es(service="f1-decode-r2"), True),  # a new revision's Service
    (es(uid="S-remade"), True),  # the Service was made again
    (es(managed=None, service="f1-decode-r2"), False),  # not the controller's: no reason to ask
])
def test_needs_service_refresh(obj, expected):
    assert needs_service_refresh(obj, OWNED) is expected
