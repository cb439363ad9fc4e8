"""The gang-provider interface (plan/gang.py) as tables: what each provider puts on pods, workloads
and its PodGroup, from plain values. The rendered objects are checked in test_plan_multinode.py."""

from __future__ import annotations

import typing
from typing import Any, Optional

import pytest

from pdfleet.operator.api.types import GangSpec
from pdfleet.operator.plan import gang, kinds
from pdfleet.operator.plan.gang import PROVIDERS, PodMeta

Q, C, V = gang.KUEUE_QUEUE_LABEL, gang.COSCHEDULING_GROUP_LABEL, gang.VOLCANO_GROUP_ANNOTATION

# provider, group, size, queue -> what its pods carry
POD_META = [
    ("none", "g-0", 2, "q", PodMeta()),
    ("none", None, 1, None, PodMeta()),
    ("kueue", None, 1, "q", PodMeta(labels={Q: "q"})),  # single-pod replica: admitted through the queue, no group
    ("kueue", None, 1, None, PodMeta(labels={Q: ""})),
    ("kueue", "g-0", 4, "q", PodMeta(labels={Q: "q", gang.KUEUE_GROUP_LABEL: "g-0"},
                                     annotations={gang.KUEUE_COUNT_ANNOTATION: "4"})),
    ("volcano", "g-1", 2, None, PodMeta(annotations={V: "g-1"}, scheduler_name="volcano")),
    ("volcano", "g-1", 2, "research", PodMeta(annotations={V: "g-1", gang.VOLCANO_QUEUE_ANNOTATION: "research"},
                                              scheduler_name="volcano")),
    ("volcano", None, 1, None, PodMeta(scheduler_name="volcano")),  # volcano schedules the whole fleet
    ("coscheduling", "g-2", 2, "q", PodMeta(labels={C: "g-2"})),    # no schedulerName: a cluster choice
    ("coscheduling", None, 1, None, PodMeta()),
]


@pytest.mark.parametrize("name, group, size, queue, want", POD_META, ids=[f"{r[0]}-{r[1]}-{r[3]}" for r in POD_META])
def test_pod_meta(name: str, group: Optional[str], size: int, queue: Optional[str], want: PodMeta) -> None:
    assert PROVIDERS[name].pod_meta(group, size, queue) == want


WORKLOAD_LABELS = [("none", "q", {}), ("kueue", "q", {Q: "q"}), ("kueue", None, {Q: ""}),
                   ("volcano", "q", {}), ("coscheduling", "q", {})]


@pytest.mark.parametrize("name, queue, want", WORKLOAD_LABELS)
def test_workload_labels(name: str, queue: Optional[str], want: dict[str, str]) -> None:
    assert PROVIDERS[name].workload_labels(queue) == want


POD_GROUPS = [
    ("none", 2, "q", None, None),
    ("kueue", 2, "q", None, None),  # Kueue makes its own Workload
    ("volcano", 3, None, {"minMember": 3}, kinds.VOLCANO_PODGROUP),
    ("volcano", 3, "research", {"minMember": 3, "queue": "research"}, kinds.VOLCANO_PODGROUP),
    ("coscheduling", 2, "q", {"minMember": 2, "scheduleTimeoutSeconds": gang.COSCHEDULING_TIMEOUT_SECONDS},
     kinds.COSCHEDULING_PODGROUP),
]


@pytest.mark.parametrize("name, size, queue, want, kind", POD_GROUPS)
def test_pod_group(name: str, size: int, queue: Optional[str], want: Any, kind: Optional[kinds.Kind]) -> None:
    assert PROVIDERS[name].pod_group_spec(size, queue) == want
    assert PROVIDERS[name].pod_group_kind == kind


def test_one_provider_per_api_value_and_one_kind_list() -> None:
    """The API's enum, the providers and the PodGroup kinds the operator may watch agree."""
    api_values = set(typing.get_args(GangSpec.model_fields["provider"].annotation))
    assert api_values == set(PROVIDERS), "a provider in the API has no GangProvider (or the reverse)"
    assert set(gang.GANG_KINDS) == {"volcano", "coscheduling"}
    assert sorted(gang.GANG_KINDS.values(), key=str) == sorted(kinds.POD_GROUP_KINDS, key=str)


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_a_provider_that_writes_a_pod_group_names_its_kind(name: str) -> None:
    provider = PROVIDERS[name]
    assert (provider.pod_group_spec(2, None) is None) == (provider.pod_group_kind is None)
