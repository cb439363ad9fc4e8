"""Bad resources are refused with the field named, by pdfleet and by the CRD itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from crd_admission import admission_errors  # noqa: E402
from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS, TEST_STUCK_READS, TEST_WALL_CLOCK_STEP
from pdfleet.operator.api import errors_of, parse

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))


def base() -> dict[str, Any]:
    return {
        "apiVersion": "pdfleet.io/v1alpha1",
        "kind": "DisaggregatedInference",
        "metadata": {"name": "llama", "namespace": "inference"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
    }


def mutate(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    cr = base()
    fn(cr)
    return cr


def spec(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda cr: cr["spec"].update(copy.deepcopy(fields))


# (case id, resource, field that must be named, refused by the CRD schema too?)
INVALID = [
    ("missing-model", mutate(lambda cr: cr["spec"].pop("model")), "spec.model", True),
    ("model-name-empty", mutate(spec(model={"name": ""})), "spec.model.name", True),
    ("replicas-wrong-type", mutate(spec(prefill={"replicas": "two"})), "spec.prefill.replicas", True),
    ("replicas-negative", mutate(spec(decode={"replicas": -1})), "spec.decode.replicas", True),
    ("tp-zero", mutate(spec(prefill={"tensorParallelSize": 0})), "spec.prefill.tensorParallelSize", True),
    (
        "decode-tp-not-multiple",
        mutate(spec(prefill={"tensorParallelSize": 2}, decode={"tensorParallelSize": 3})),
        "spec.decode.tensorParallelSize",
        True,
    ),
    (
        "decode-tp-smaller",
        mutate(spec(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 2})),
        "spec.decode.tensorParallelSize",
        True,
    ),
    ("unknown-field", mutate(spec(decoder={"replicas": 1})), "spec.decoder", True),
    ("unknown-nested-field", mutate(spec(kvTransfer={"leaseSecs": 5})), "spec.kvTransfer.leaseSecs", True),
    ("buffer-device-enum", mutate(spec(kvTransfer={"bufferDevice": "gpu"})), "spec.kvTransfer.bufferDevice", True),
    ("port-out-of-range", mutate(spec(kvTransfer={"sideChannelPort": 70000})), "spec.kvTransfer.sideChannelPort", True),
    ("port-zero", mutate(spec(router={"port": 0})), "spec.router.port", True),
    (
        "port-clash",
        mutate(spec(engine={"port": 5601}, decode={"tensorParallelSize": 2})),
        "spec.kvTransfer.sideChannelPort",
        True,
    ),
    (
        "side-channel-range-overflow",
        mutate(spec(kvTransfer={"sideChannelPort": 65535}, decode={"tensorParallelSize": 2})),
        "spec.kvTransfer.sideChannelPort",
        True,
    ),
    (
        "cuda-without-enough-gpus",
        mutate(spec(decode={"tensorParallelSize": 2, "resources": {"gpus": 1}})),
        "spec.decode.resources.gpus",
        True,
    ),
    (
        "rdma-count-zero",
        mutate(spec(network={"rdma": {"resourceName": "rdma/ib", "count": 0}})),
        "spec.network.rdma.count",
        True,
    ),
    ("rdma-bad-resource-name", mutate(spec(network={"rdma": {"resourceName": "rdma ib"}})), "spec.network.rdma.resourceName", True),
    ("name-not-dns", mutate(lambda cr: cr["metadata"].update(name="Llama_8B")), "metadata.name", True),
    ("name-too-long", mutate(lambda cr: cr["metadata"].update(name="a" * 41)), "metadata.name", True),
    (
        "two-model-sources",
        mutate(spec(model={"name": "/models/x", "source": {"pvc": {"claimName": "m"}, "hf": {}}})),
        "spec.model.source",
        True,
    ),
    (
        "claim-name-not-dns",
        mutate(spec(model={"name": "/models/x", "source": {"pvc": {"claimName": "My Claim"}}})),
        "spec.model.source.pvc.claimName",
        True,
    ),
    (
        "cpu-block-size",
        mutate(spec(prefill={"resources": {"gpus": 0}}, kvTransfer={"bufferDevice": "cpu"}, engine={"blockSize": 16})),
        "spec.engine.blockSize",
        True,
    ),
    ("dtype-enum", mutate(spec(model={"name": "m", "dtype": "fp8"})), "spec.model.dtype", True),
    ("pdb-bad-percentage", mutate(spec(disruption={"prefill": {"maxUnavailable": "half"}})), "spec.disruption.prefill.maxUnavailable", False),
    ("env-bad-name", mutate(spec(engine={"env": [{"name": "1 BAD", "value": "x"}]})), "spec.engine.env[0].name", True),
    ("backends-empty", mutate(spec(kvTransfer={"backends": []})), "spec.kvTransfer.backends", True),
    # Test-only fault hooks (issue 30): PDFLEET_TEST_CORRUPT_PULLED_BLOCKS=1 corrupts every pulled block.
    ("env-test-hook-engine", mutate(spec(engine={"env": [{"name": TEST_CORRUPT_PULLED_BLOCKS, "value": "1"}]})),
     "spec.engine.env", True),
    ("env-test-hook-prefill", mutate(spec(prefill={"env": [{"name": "A", "value": "1"},
                                                           {"name": TEST_STUCK_READS, "value": "/f"}]})),
     "spec.prefill.env", True),
    ("env-test-hook-decode", mutate(spec(decode={"env": [{"name": TEST_WALL_CLOCK_STEP, "value": "/f"}]})),
     "spec.decode.env", True),
    # Operator-only rules: the CRD admits these, the operator refuses them (InvalidSpec).
    ("extra-args-owned-flag", mutate(spec(engine={"extraArgs": ["--kv-transfer-config={}"]})), "spec.engine.extraArgs[0]", False),
    ("pod-label-reserved", mutate(spec(decode={"podLabels": {"pdfleet.io/role": "x"}})), "spec.decode.podLabels.pdfleet.io/role", False),
]


@pytest.mark.parametrize("path", EXAMPLES)
def test_examples_are_valid_everywhere(path: str) -> None:
    resource = yaml.safe_load(open(path))
    assert errors_of(resource) == []
    assert admission_errors(resource) == []


def test_minimal_resource_is_valid_and_defaulted() -> None:
    resource = parse(base())
    assert resource.spec.kv_transfer.backends == ["UCX"]
    assert resource.spec.kv_transfer.side_channel_port == 5600
    assert resource.spec.kv_transfer.load_failure_policy == "recompute"
    assert resource.spec.router.enabled and resource.spec.router.port == 8000
    assert admission_errors(base()) == []


@pytest.mark.parametrize("case,resource,field,crd_refuses", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_resource_names_the_field(case: str, resource: dict, field: str, crd_refuses: bool) -> None:
    errors = errors_of(resource)
    assert errors, f"{case}: pdfleet accepted an invalid resource"
    assert field in [e.field for e in errors], f"{case}: {field} not named in {[str(e) for e in errors]}"
    assert all(e.message for e in errors)


@pytest.mark.parametrize(
    "case,resource,field", [(c, r, f) for c, r, f, refuses in INVALID if refuses], ids=[c[0] for c in INVALID if c[3]]
)
def test_crd_admission_refuses_too(case: str, resource: dict, field: str) -> None:
    errors = admission_errors(resource)
    assert errors, f"{case}: the CRD schema admitted it"
    assert any(field.split("[")[0].rsplit(".", 1)[-1] in e or field in e for e in errors), errors


def test_enough_invalid_cases_cover_the_crd() -> None:
    assert len(INVALID) >= 15
    assert sum(1 for c in INVALID if c[3]) >= 15


def test_strict_types_no_silent_coercion() -> None:
    # the API server refuses "2" for an integer; pdfleet must not quietly accept it
    errors = errors_of(mutate(spec(prefill={"tensorParallelSize": "2"})))
    assert [e.field for e in errors] == ["spec.prefill.tensorParallelSize"]


def test_not_a_mapping() -> None:
    assert [e.field for e in errors_of(["not", "a", "resource"])] == ["(root)"]


def test_env_names_near_the_test_prefix_stay_valid() -> None:
    # the negative side of the PDFLEET_TEST_* rule: other pdfleet and look-alike names pass both checks
    ok = mutate(spec(engine={"env": [{"name": "PDFLEET_TESTS", "value": "1"}, {"name": "PDFLEET_FLEET", "value": "x"},
                                     {"name": "pdfleet_test_x", "value": "1"}]}))
    assert errors_of(ok) == []
    assert admission_errors(ok) == []


def test_a_test_hook_message_names_the_rule() -> None:
    errors = errors_of(INVALID[[c[0] for c in INVALID].index("env-test-hook-decode")][1])
    assert [str(e) for e in errors] == ["spec.decode.env: variables named PDFLEET_TEST_* are test-only fault hooks "
                                        "and may not be set in a fleet"]
