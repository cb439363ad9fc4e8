"""spec.rollout (issue 22): Paired by default; Canary's steps, analysis and onAbort are checked with the
field named, by the operator (Python) and by the API server (CEL) alike; the weight is a printer column."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from crd_admission import admission_errors, assert_cel_agrees_with_python  # noqa: E402
from pdfleet.operator.api import errors_of, parse  # noqa: E402
from pdfleet.operator.api.crd import crd  # noqa: E402
from pdfleet.operator.api.rules import CANARY_RULES  # noqa: E402

CANARY = {"steps": [{"weight": 10, "pauseSeconds": 30}, {"weight": 50}],
          "analysis": {"ttftMs": 800, "itlMs": 60, "maxErrorRate": 0.01, "minRequests": 200}, "onAbort": "Delete"}


def cr(rollout: Any = None, **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                           "metadata": {"name": "llama"}, "spec": {"model": {"name": "m"}, **spec}}
    if rollout is not None:
        out["spec"]["rollout"] = copy.deepcopy(rollout)
    return out


def test_paired_is_the_default() -> None:
    spec = parse(cr()).spec
    assert spec.rollout.strategy == "Paired" and spec.rollout.canary is None


def test_a_canary_parses_with_its_names() -> None:
    c = parse(cr({"strategy": "Canary", "canary": CANARY})).spec.rollout.canary
    assert c is not None
    assert [(s.weight, s.pause_seconds) for s in c.steps] == [(10, 30), (50, 60)]  # pauseSeconds defaults to 60
    assert (c.analysis.ttft_ms, c.analysis.itl_ms, c.analysis.max_error_rate, c.analysis.min_requests) == (
        800, 60, 0.01, 200)
    assert c.on_abort == "Delete"
    assert not admission_errors(cr({"strategy": "Canary", "canary": CANARY}))


@pytest.mark.parametrize("rollout,spec,field,needle", [
    ({"strategy": "Canary"}, {}, "spec.rollout.canary", "is required with rollout.strategy 'Canary'"),
    ({"strategy": "Canary", "canary": CANARY}, {"router": {"enabled": False}}, "spec.rollout.strategy",
     "needs router.enabled or gateway.inferencePool.enabled"),
    ({"strategy": "Canary", "canary": {"steps": [{"weight": 50}, {"weight": 20}]}}, {}, "spec.rollout.canary.steps",
     "strictly increase"),
    ({"strategy": "Canary", "canary": {"steps": [{"weight": 20}, {"weight": 20}]}}, {}, "spec.rollout.canary.steps",
     "strictly increase"),
    ({"strategy": "Canary", "canary": {"steps": []}}, {}, "spec.rollout.canary.steps", ""),
    ({"strategy": "Canary", "canary": {"steps": [{"weight": 0}]}}, {}, "spec.rollout.canary.steps[0].weight", ""),
    ({"strategy": "Canary", "canary": {"steps": [{"weight": 101}]}}, {}, "spec.rollout.canary.steps[0].weight", ""),
    ({"strategy": "Canary", "canary": {**CANARY, "analysis": {"maxErrorRate": 1.5}}}, {},
     "spec.rollout.canary.analysis.maxErrorRate", ""),
    ({"strategy": "Canary", "canary": {**CANARY, "analysis": {"maxRecomputeRate": 1.5}}}, {},
     "spec.rollout.canary.analysis.maxRecomputeRate", ""),
    ({"strategy": "Canary", "canary": {**CANARY, "analysis": {"maxRecomputeRate": -0.1}}}, {},
     "spec.rollout.canary.analysis.maxRecomputeRate", ""),
    ({"strategy": "Canary", "canary": {**CANARY, "onAbort": "Drop"}}, {}, "spec.rollout.canary.onAbort", "Keep"),
    ({"strategy": "Blue"}, {}, "spec.rollout.strategy", "Paired"),
])
def test_bad_rollouts_are_refused_with_the_field_named(rollout, spec, field, needle) -> None:
    problems = [str(e) for e in errors_of(cr(rollout, **spec))]
    assert any(p.startswith(field) and needle in p for p in problems), problems
    assert admission_errors(cr(rollout, **spec)), "the API server would admit it"


def test_a_canary_behind_the_gateway_alone_is_valid() -> None:
    """The Endpoint Picker runs the serving pipeline: it splits by pair and writes the series the analysis
    reads (issue 38), so a fleet whose front door is the Gateway may canary without a router."""
    gateway = {"router": {"enabled": False}, "gateway": {"inferencePool": {
        "enabled": True, "allowFrom": [{"namespaceSelector": {"matchLabels": {"gw": "yes"}}}]}}}
    assert not errors_of(cr({"strategy": "Canary", "canary": CANARY}, **gateway))
    assert not admission_errors(cr({"strategy": "Canary", "canary": CANARY}, **gateway))


def test_max_recompute_rate_parses_and_is_unset_by_default() -> None:
    c = parse(cr({"strategy": "Canary", "canary": {**CANARY, "analysis": {"maxRecomputeRate": 0.02}}})).spec.rollout.canary
    assert c is not None and c.analysis.max_recompute_rate == 0.02
    assert not admission_errors(cr({"strategy": "Canary", "canary": {**CANARY, "analysis": {"maxRecomputeRate": 0}}}))
    c = parse(cr({"strategy": "Canary", "canary": CANARY})).spec.rollout.canary
    assert c is not None and c.analysis.max_recompute_rate is None


def test_cel_and_python_agree_on_the_canary_rules() -> None:
    grid = [(strategy, steps, router, pool)
            for strategy in ("Paired", "Canary")
            for steps in (None, [10], [10, 50], [50, 10], [10, 10], [5, 50, 100], [5, 60, 50])
            for router in (True, False) for pool in (True, False)]
    specs = []
    for strategy, steps, router, pool in grid:
        spec: dict[str, Any] = {"model": {"name": "m"}, "router": {"enabled": router},
                                "rollout": {"strategy": strategy},
                                "gateway": {"inferencePool": {"enabled": pool, "allowFrom": [{"podSelector": {}}]}}}
        if steps is not None:
            spec["rollout"]["canary"] = {"steps": [{"weight": w} for w in steps]}
        specs.append(spec)
    assert_cel_agrees_with_python(CANARY_RULES, specs)


def test_the_weight_is_a_printer_column() -> None:
    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert {"name": "Canary", "type": "integer", "jsonPath": ".status.rollout.weight"} in columns
