"""The plan never renders a test-only fault hook (PDFLEET_TEST_*) into a pod, even for a spec that
skipped validation (issue 30: defence in depth behind `pdfleet validate` and the CRD's CEL rule)."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS, TEST_PREFIX
from pdfleet.operator.api import DisaggregatedInference, errors_of
from pdfleet.operator.plan import plan

HOOK = TEST_CORRUPT_PULLED_BLOCKS


def resource(where: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": "m"}, "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    spec.setdefault(where, {})["env"] = [{"name": name, "value": "1"}, {"name": "KEEP_ME", "value": "2"}]
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u-1"}, "spec": spec}


def env_names(objs: list[dict[str, Any]]) -> set[str]:
    names = set()
    for obj in objs:
        spec = obj.get("spec") or {}
        templates = [spec.get("template")] + [(spec.get("leaderWorkerTemplate") or {}).get(k)
                                              for k in ("leaderTemplate", "workerTemplate")]
        for t in templates:
            pod = (t or {}).get("spec") or {}
            for c in [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]:
                names |= {e["name"] for e in c.get("env") or []}
    return names


@pytest.mark.parametrize("where", ["engine", "prefill", "decode"])
def test_a_test_hook_is_never_rendered(where: str) -> None:
    raw = resource(where, HOOK)
    assert errors_of(raw), "validation must refuse it first"
    # past validation (pydantic alone, as a caller that skips spec_errors would): the plan still drops it
    unchecked = DisaggregatedInference.model_validate(raw, strict=True)
    names = env_names(plan(unchecked))
    assert "KEEP_ME" in names, "negative control: the spec's other variables are rendered"
    assert not {n for n in names if n.startswith(TEST_PREFIX)}, names
