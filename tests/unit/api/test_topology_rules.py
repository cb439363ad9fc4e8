"""Multi-node roles, gang scheduling and placement: bad input refused with the field named,
by pdfleet's Python rules and by the CRD's own CEL (offline admission), which agree."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from crd_admission import admission_errors, assert_cel_agrees_with_python, disagreements  # noqa: E402
from pdfleet.operator.api import errors_of, parse  # noqa: E402
from pdfleet.operator.api.rules import TOPOLOGY_RULES, gpus  # noqa: E402


def cr(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
            "metadata": {"name": "big", "namespace": "ml"},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, **copy.deepcopy(spec)}}


ISSUE_EXAMPLE = cr(
    prefill={"replicas": 2, "tensorParallelSize": 8, "nodesPerReplica": 1},
    decode={"replicas": 1, "tensorParallelSize": 16, "nodesPerReplica": 2},
    scheduling={"gang": {"provider": "kueue"}, "queueName": "gpu-team-a"},
    placement={"topologyKey": "nvidia.com/gpu.clique", "mode": "preferred"},
    network={"preflight": {"enabled": True, "minGBps": 10}},
)


def test_the_issue_example_is_valid_and_admitted() -> None:
    res = parse(ISSUE_EXAMPLE)
    assert res.spec.decode.nodes_per_replica == 2 and gpus(res.spec.decode) == 8
    assert res.spec.scheduling.gang.provider == "kueue" and res.spec.network.preflight.min_g_bps == 10
    assert admission_errors(ISSUE_EXAMPLE) == []


def test_defaults() -> None:
    spec = parse(cr()).spec
    assert spec.prefill.nodes_per_replica == 1 and spec.scheduling.gang.provider == "none"
    assert spec.placement.topology_key is None and spec.placement.mode == "preferred"
    assert spec.network.preflight.enabled is True and spec.network.preflight.min_g_bps == 0


# (case, resource, field named)
INVALID = [
    ("tp-not-divisible", cr(decode={"tensorParallelSize": 6, "nodesPerReplica": 4}), "spec.decode.nodesPerReplica"),
    ("tp-smaller-than-nodes", cr(prefill={"tensorParallelSize": 1, "nodesPerReplica": 2},
                                 decode={"tensorParallelSize": 2}), "spec.prefill.nodesPerReplica"),
    ("required-without-key", cr(placement={"mode": "required"}), "spec.placement.topologyKey"),
    ("gang-one-pod-replicas", cr(scheduling={"gang": {"provider": "volcano"}}), "spec.scheduling.gang.provider"),
    ("gang-multi-node-role-scaled-to-zero",
     cr(decode={"replicas": 0, "tensorParallelSize": 4, "nodesPerReplica": 2},
        scheduling={"gang": {"provider": "coscheduling"}}), "spec.scheduling.gang.provider"),
    ("kueue-without-queue", cr(decode={"tensorParallelSize": 4, "nodesPerReplica": 2},
                               scheduling={"gang": {"provider": "kueue"}}), "spec.scheduling.queueName"),
    ("unknown-provider", cr(scheduling={"gang": {"provider": "yunikorn"}}), "spec.scheduling.gang.provider"),
    ("unknown-mode", cr(placement={"topologyKey": "zone", "mode": "sometimes"}), "spec.placement.mode"),
    ("nodes-zero", cr(decode={"nodesPerReplica": 0}), "spec.decode.nodesPerReplica"),
    ("min-gbps-negative", cr(network={"preflight": {"minGBps": -1}}), "spec.network.preflight.minGBps"),
    ("cuda-gpus-per-pod-too-few", cr(decode={"tensorParallelSize": 8, "nodesPerReplica": 2, "resources": {"gpus": 2}}),
     "spec.decode.resources.gpus"),
]


@pytest.mark.parametrize("case,resource,field", INVALID, ids=[c[0] for c in INVALID])
def test_refused_with_the_field_named(case: str, resource: dict, field: str) -> None:
    errors = errors_of(resource)
    assert field in [e.field for e in errors], errors


@pytest.mark.parametrize("case,resource,field", INVALID, ids=[c[0] for c in INVALID])
def test_the_crd_refuses_too(case: str, resource: dict, field: str) -> None:
    errors = admission_errors(resource)
    assert any(field.removeprefix("spec.") in e for e in errors), errors


VALID = [
    ("gang-volcano-multi-node", cr(decode={"tensorParallelSize": 4, "nodesPerReplica": 2},
                                   scheduling={"gang": {"provider": "volcano"}})),
    ("required-with-key", cr(placement={"topologyKey": "topology.kubernetes.io/zone", "mode": "required"})),
    ("cuda-gpus-per-pod-enough", cr(decode={"tensorParallelSize": 8, "nodesPerReplica": 2, "resources": {"gpus": 4}})),
]


@pytest.mark.parametrize("case,resource", VALID, ids=[c[0] for c in VALID])
def test_valid_neighbours_are_accepted(case: str, resource: dict) -> None:
    assert errors_of(resource) == [] and admission_errors(resource) == []


# CEL and Python agree on a grid where every rule is kept somewhere and broken somewhere.
GRID = {
    "prefill": [(1, 1), (2, 2), (3, 2)],       # (tensorParallelSize, nodesPerReplica)
    "decode": [(6, 1), (6, 2), (6, 4)],         # 6 is a multiple of every prefill TP here
    "replicas": [(1, 1), (1, 0)],
    "provider": ["none", "kueue", "volcano"],
    "queue": [None, "q"],
    "placement": [{}, {"mode": "required"}, {"mode": "required", "topologyKey": "k"}],
}


def _spec(prefill, decode, replicas, provider, queue, placement) -> dict[str, Any]:
    def role(shape: tuple[int, int], replicas: int) -> dict[str, Any]:
        return {"tensorParallelSize": shape[0], "nodesPerReplica": shape[1], "replicas": replicas,
                "resources": {"gpus": 0}}

    return {"model": {"name": "m"}, "prefill": role(prefill, replicas[0]), "decode": role(decode, replicas[1]),
            "scheduling": {"gang": {"provider": provider}, **({"queueName": queue} if queue else {})},
            "placement": placement, "engine": {"blockSize": 32}}


def test_cel_agrees_with_python_on_the_grid() -> None:
    assert_cel_agrees_with_python(TOPOLOGY_RULES, [_spec(*values) for values in itertools.product(*GRID.values())])


def test_a_wrong_cel_rule_disagrees_somewhere() -> None:
    """Negative control for the agreement test: a gang rule that forgets replicas >= 1."""
    wrong = "self.scheduling.gang.provider == 'none' || self.prefill.nodesPerReplica > 1 || self.decode.nodesPerReplica > 1"
    (rule,) = [r for r in TOPOLOGY_RULES if r.field == "scheduling.gang.provider"]
    assert disagreements(wrong, rule, [_spec(*values) for values in itertools.product(*GRID.values())]) > 0
