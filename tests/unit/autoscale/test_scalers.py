"""A fleet's scalers (pure): what is created, deleted, reported, and which replicas the plan gets."""

from __future__ import annotations

from typing import Any, Optional

from pdfleet.operator.api import parse
from pdfleet.operator.autoscale.scalers import ObservedScaler, plan_scaling, scaling_condition
from pdfleet.operator.kube.observed import ChildRef, ObservedChild

OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "llama", "uid": "u1",
         "controller": True, "blockOwnerDeletion": True}


def cr(**spec: Any):
    return parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                  "metadata": {"name": "llama", "namespace": "ns", "uid": "u1"},
                  "spec": {"model": {"name": "m"}, **spec}})


def scaler(role: str, replicas: Optional[int], status: Optional[dict] = None, owner: str = "u1") -> ObservedScaler:
    return ObservedScaler("ns", f"llama-{role}", role, uid=f"s-{role}", owner_uids=(owner,), replicas=replicas,
                          generation=1, status=tuple(sorted((status or {}).items())))


def sts(role: str, revision: str, replicas: int) -> ObservedChild:
    return ObservedChild(ChildRef("apps/v1", "StatefulSet", "ns", f"llama-{role}-{revision}"), role=role,
                         revision=revision, replicas=replicas, owner_uids=("u1",))


AUTO = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}}


def test_without_autoscaling_nothing_changes() -> None:
    resource = cr(prefill={"replicas": 3})
    plan = plan_scaling(resource, [], [], owner=OWNER, namespace="ns", revision="r1")
    assert not plan.active and plan.create == () and plan.applied(resource) is resource
    assert scaling_condition(plan) is None


def test_a_new_scaler_starts_at_the_crs_replicas() -> None:
    plan = plan_scaling(cr(decode=AUTO), [], [], owner=OWNER, namespace="ns", revision="r1")
    (created,) = plan.create
    assert created["metadata"]["name"] == "llama-decode" and created["spec"] == {"replicas": 2}
    assert created["metadata"]["ownerReferences"] == [OWNER]
    assert created["metadata"]["labels"]["pdfleet.io/role"] == "decode"


def test_a_recreated_scaler_starts_at_the_roles_current_size() -> None:
    plan = plan_scaling(cr(decode=AUTO), [], [sts("decode", "r1", 5)], owner=OWNER, namespace="ns", revision="r1")
    assert plan.create[0]["spec"] == {"replicas": 5} and plan.result.replicas["decode"] == 5


def test_the_scaler_wins_over_the_crs_replicas_and_is_clamped() -> None:
    resource = cr(decode=AUTO, prefill={"replicas": 1})
    plan = plan_scaling(resource, [scaler("decode", 12)], [], owner=OWNER, namespace="ns", revision="r1")
    assert plan.create == () and plan.result.replicas == {"prefill": 1, "decode": 8}
    assert plan.applied(resource).spec.decode.replicas == 8 and resource.spec.decode.replicas == 2
    ((name, status),) = plan.status_patches
    assert name == "llama-decode" and status["clamped"] and status["replicas"] == 8 and status["requestedReplicas"] == 12
    assert status["selector"] == "pdfleet.io/fleet=llama,pdfleet.io/role=decode"
    assert scaling_condition(plan)[:2] == (True, "Clamped")
    # The same status observed: no patch.
    again = plan_scaling(resource, [scaler("decode", 12, status)], [], owner=OWNER, namespace="ns", revision="r1")
    assert again.status_patches == ()


def test_scalers_of_roles_without_autoscaling_are_deleted_others_ignored() -> None:
    plan = plan_scaling(cr(decode=AUTO), [scaler("decode", 2), scaler("prefill", 3), scaler("prefill", 3, owner="x")],
                        [], owner=OWNER, namespace="ns", revision="r1")
    assert [s.name for s in plan.delete] == ["llama-prefill"] and all("u1" in s.owner_uids for s in plan.delete)
