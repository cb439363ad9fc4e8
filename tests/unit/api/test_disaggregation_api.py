"""spec.router.disaggregation: refused with the field named (CRD admission and operator alike), rendered into the
router's args and parsed back to the same settings."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd_admission import admission_errors  # noqa: E402
from router_args import parsed, router_args  # noqa: E402
from pdfleet.contract.routing import DISAGGREGATION_ALWAYS, DISAGGREGATION_CONDITIONAL  # noqa: E402
from pdfleet.operator.api import errors_of, parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COND = {"policy": "Conditional", "minRemotePrefillTokens": 512, "prefillBusyInFlight": 2}


def cr(disaggregation: Any = None, max_model_len: int | None = None) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["spec"].setdefault("router", {})
    if disaggregation is not None:
        out["spec"]["router"]["disaggregation"] = copy.deepcopy(disaggregation)
    if max_model_len is not None:
        out["spec"]["model"]["maxModelLen"] = max_model_len
    return out


def test_the_default_is_always_and_leaves_the_router_pod_template_as_before() -> None:
    d = parse(cr()).spec.router.disaggregation
    assert (d.policy, d.min_remote_prefill_tokens, d.prefill_busy_in_flight) == (DISAGGREGATION_ALWAYS, 128, 4)
    before = router_args(cr())
    assert not [a for a in before if "disaggregation" in a or "remote-prefill" in a]
    assert router_args(cr({"policy": "Always"})) == before
    assert router_args(cr(COND)) != before  # negative control: Conditional does change the template


def test_the_plan_passes_the_policy_and_the_router_parses_it_back() -> None:
    config = parsed(router_args(cr(COND)))
    assert (config.disaggregation_policy, config.min_remote_prefill_tokens, config.prefill_busy_in_flight) == (
        DISAGGREGATION_CONDITIONAL, 512, 2)


BAD = [
    ("unknown policy", {"policy": "Sometimes"}, None, "spec.router.disaggregation.policy"),
    ("negative minimum", {"minRemotePrefillTokens": -1}, None, "spec.router.disaggregation.minRemotePrefillTokens"),
    ("minimum too big", {"minRemotePrefillTokens": 1_000_001}, None,
     "spec.router.disaggregation.minRemotePrefillTokens"),
    ("busy at 0", {"prefillBusyInFlight": 0}, None, "spec.router.disaggregation.prefillBusyInFlight"),
    ("unknown key", {"policy": "Conditional", "threshold": 3}, None, "spec.router.disaggregation.threshold"),
    ("minimum past the context", {"policy": "Conditional", "minRemotePrefillTokens": 4096}, 4096,
     "spec.router.disaggregation.minRemotePrefillTokens"),
]


@pytest.mark.parametrize("case,d,max_len,field", BAD, ids=[b[0] for b in BAD])
def test_bad_disaggregation_is_refused_with_the_field_named(case: str, d: dict, max_len, field: str) -> None:
    errors = errors_of(cr(d, max_len))
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {errors}"
    refused = admission_errors(cr(d, max_len))
    leaf = field.rsplit(".", 1)[-1]
    assert any(field.removeprefix("spec.") in r or leaf in r for r in refused), f"{case}: the CRD admits it: {refused}"


def test_good_variants_are_admitted_everywhere() -> None:
    for d, max_len in (({}, None), (COND, None), (COND, 4096), ({"policy": "Always", "minRemotePrefillTokens": 9000},
                                                                 4096), ({**COND, "minRemotePrefillTokens": 0}, 16)):
        assert errors_of(cr(d, max_len)) == [] and admission_errors(cr(d, max_len)) == [], d


def test_cel_and_python_agree_on_the_disaggregation_rule() -> None:
    from crd_admission import assert_cel_agrees_with_python
    from pdfleet.operator.api.rules import DISAGGREGATION_RULES

    specs = []
    grid = [(policy, minimum, max_len) for policy in ("Always", "Conditional") for minimum in (0, 128, 4096, 5000)
            for max_len in (None, 4096)]
    for policy, minimum, max_len in grid:
        spec: dict[str, Any] = {"model": {"name": "m"},
                                "router": {"disaggregation": {"policy": policy, "minRemotePrefillTokens": minimum}}}
        if max_len is not None:
            spec["model"]["maxModelLen"] = max_len
        specs.append(spec)
    assert_cel_agrees_with_python(DISAGGREGATION_RULES, specs)
