"""spec.router.flowControl: refused with the field named (CRD admission and operator alike), passed to the
router as one --flow-control argument that the router parses back to the same settings."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd_admission import admission_errors  # noqa: E402
from pdfleet.connector.router import command  # noqa: E402
from pdfleet.contract.flow_control import (  # noqa: E402
    FAIRNESS_COST,
    FAIRNESS_REQUESTS,
    FLAG,
    PRIORITY_HEADER,
    TENANT_HEADER,
    FlowControlConfig,
    Priority,
)
from pdfleet.operator.api import errors_of, parse  # noqa: E402
from pdfleet.operator.plan import PlanOptions, plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FC = {"enabled": True, "maxQueueSeconds": 20, "maxQueuedRequests": 500, "maxInFlightPerDecode": 8,
      "priorities": [{"name": "interactive", "weight": 8}, {"name": "batch", "weight": 1}]}


def cr(flow_control: Any = None, **router: Any) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["spec"].setdefault("router", {}).update(router)
    if flow_control is not None:
        out["spec"]["router"]["flowControl"] = copy.deepcopy(flow_control)
    return out


def router_args(resource: dict[str, Any]) -> list[str]:
    (dep,) = [o for o in plan(resource, PlanOptions(serving_revision="rev0000001")) if o["kind"] == "Deployment"]
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_defaults_are_off_with_the_inference_extension_headers() -> None:
    fc = parse(cr()).spec.router.flow_control
    assert not fc.enabled and fc.priorities == []
    assert (fc.tenant_header, fc.priority_header) == (TENANT_HEADER, PRIORITY_HEADER) == (
        "x-gateway-inference-fairness-id", "x-gateway-inference-objective")
    assert (fc.max_queue_seconds, fc.max_queued_requests) == (30, 1000)
    assert fc.fairness == FAIRNESS_COST == FlowControlConfig().fairness == "cost"


BAD = [
    ("queue seconds 0", {**FC, "maxQueueSeconds": 0}, "spec.router.flowControl.maxQueueSeconds"),
    ("queue seconds above an hour", {**FC, "maxQueueSeconds": 3601}, "spec.router.flowControl.maxQueueSeconds"),
    ("no queue", {**FC, "maxQueuedRequests": 0}, "spec.router.flowControl.maxQueuedRequests"),
    ("no in flight", {**FC, "maxInFlightPerDecode": 0}, "spec.router.flowControl.maxInFlightPerDecode"),
    ("header with a space", {**FC, "tenantHeader": "x tenant"}, "spec.router.flowControl.tenantHeader"),
    ("header upper case", {**FC, "priorityHeader": "X-Prio"}, "spec.router.flowControl.priorityHeader"),
    ("one header for both", {**FC, "tenantHeader": "x-a", "priorityHeader": "x-a"},
     "spec.router.flowControl.priorityHeader"),
    ("weight 0", {**FC, "priorities": [{"name": "a", "weight": 0}]}, "spec.router.flowControl.priorities[0].weight"),
    ("weight too big", {**FC, "priorities": [{"name": "a", "weight": 1001}]},
     "spec.router.flowControl.priorities[0].weight"),
    ("name missing", {**FC, "priorities": [{"weight": 2}]}, "spec.router.flowControl.priorities[0].name"),
    ("name with a space", {**FC, "priorities": [{"name": "a b"}]}, "spec.router.flowControl.priorities[0].name"),
    ("names twice", {**FC, "priorities": [{"name": "a"}, {"name": "a", "weight": 3}]},
     "spec.router.flowControl.priorities"),
    ("17 classes", {**FC, "priorities": [{"name": f"p{i}"} for i in range(17)]}, "spec.router.flowControl.priorities"),
    ("unknown key", {**FC, "maxConcurrency": 3}, "spec.router.flowControl.maxConcurrency"),
    ("unknown fairness", {**FC, "fairness": "tokens"}, "spec.router.flowControl.fairness"),
    ("fairness upper case", {**FC, "fairness": "Cost"}, "spec.router.flowControl.fairness"),
]


@pytest.mark.parametrize("case,fc,field", BAD, ids=[b[0] for b in BAD])
def test_bad_flow_control_is_refused_with_the_field_named(case: str, fc: dict, field: str) -> None:
    errors = errors_of(cr(fc))
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {errors}"
    refused = admission_errors(cr(fc))
    leaf = field.rsplit(".", 1)[-1].split("[")[0]
    assert any(field.removeprefix("spec.") in r or leaf in r for r in refused), f"{case}: the CRD admits it: {refused}"


def test_good_variants_are_admitted_everywhere() -> None:
    for fc in ({}, {"enabled": True}, FC, {**FC, "priorities": [{"name": "only"}]},
               {**FC, "tenantHeader": "x-tenant", "priorityHeader": "x-prio", "maxQueueSeconds": 0.5},
               {**FC, "fairness": FAIRNESS_REQUESTS}, {**FC, "fairness": FAIRNESS_COST}):
        assert errors_of(cr(fc)) == [] and admission_errors(cr(fc)) == [], fc


def test_disabled_flow_control_leaves_the_router_pod_template_as_before() -> None:
    before = router_args(cr())
    assert "--flow-control" not in before
    assert router_args(cr({**FC, "enabled": False})) == before
    assert router_args(cr(FC)) != before  # negative control: enabling it does change the template


def test_the_plan_passes_flow_control_and_the_router_parses_it_back() -> None:
    args = router_args(cr(FC))
    assert "--revision" not in args  # the router learns the serving revision from the operator's label
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    config = command.config_from_args(parser.parse_args(args[1:])).flow_control
    assert config == FlowControlConfig(enabled=True, max_queue_s=20.0, max_queued=500, max_in_flight_per_decode=8,
                                       priorities=(Priority("interactive", 8), Priority("batch", 1)))
    assert [c.name for c in config.classes] == ["interactive", "batch"]


@pytest.mark.parametrize("fairness,flag_says,parsed", [
    (None, None, FAIRNESS_COST),  # unset: the default, unsaid (router args as before the field)
    (FAIRNESS_COST, None, FAIRNESS_COST),  # the default said out loud renders the same
    (FAIRNESS_REQUESTS, FAIRNESS_REQUESTS, FAIRNESS_REQUESTS),
])
def test_fairness_reaches_the_router(fairness: str | None, flag_says: str | None, parsed: str) -> None:
    fc = FC if fairness is None else {**FC, "fairness": fairness}
    args = router_args(cr(fc))
    flag = json.loads(args[args.index(FLAG) + 1])
    assert flag.get("fairness") == flag_says
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.config_from_args(parser.parse_args(args[1:])).flow_control.fairness == parsed
    if fairness == FAIRNESS_COST:
        assert args == router_args(cr(FC))
    if fairness == FAIRNESS_REQUESTS:  # negative control: the choice changes the pod template
        assert args != router_args(cr(FC))


@pytest.mark.parametrize("text,needle", [
    ('{"enabled": true, "maxQueueSecond": 3}', "unknown keys ['maxQueueSecond']"),
    ('{"enabled": "yes"}', "enabled: expected bool"),
    ('{"maxQueuedRequests": true}', "maxQueuedRequests: expected a number"),
    ('{"maxQueuedRequests": 0}', "maxQueuedRequests: must be"),
    ('{"priorities": [{"name": "a"}, {"name": "a"}]}', "names must be unique"),
    ('{"priorities": [{"name": "a", "weight": 0}]}', "priorities[0].weight"),
    ('{"priorities": {"name": "a"}}', "priorities must be a list"),
    ('{"tenantHeader": "X-A", "priorityHeader": "x-a"}', "must differ"),
    ("[1]", "expected a JSON object"),
    ("{", "not JSON"),
])
def test_the_router_refuses_a_bad_flow_control_argument_naming_the_key(text: str, needle: str) -> None:
    with pytest.raises(ValueError) as exc:
        FlowControlConfig.from_arg(text)
    assert needle in str(exc.value)


@pytest.mark.parametrize("priorities,order", [
    ((), ["default"]),
    ((Priority("batch", 1), Priority("chat", 5)), ["chat", "batch"]),  # by weight, not as listed
    ((Priority("a", 2), Priority("b", 2), Priority("c", 3)), ["c", "a", "b"]),  # ties: as listed
])
def test_classes_rank_by_weight(priorities, order) -> None:
    assert [c.name for c in FlowControlConfig(priorities=priorities).classes] == order


def test_cel_and_python_agree_on_the_flow_control_rules() -> None:
    from crd_admission import assert_cel_agrees_with_python
    from pdfleet.operator.api.rules import FLOW_CONTROL_RULES

    grid = [(prios, th, ph) for prios in ([], [{"name": "a"}], [{"name": "a"}, {"name": "b"}],
                                          [{"name": "a"}, {"name": "a"}], [{"name": "b"}, {"name": "a"}, {"name": "b"}])
            for th in ("x-t", "x-p") for ph in ("x-p", "x-t")]
    specs = [{"model": {"name": "m"}, "router": {"flowControl": {"priorities": prios, "tenantHeader": th,
                                                                 "priorityHeader": ph}}}
             for prios, th, ph in grid]
    assert_cel_agrees_with_python(FLOW_CONTROL_RULES, specs)
