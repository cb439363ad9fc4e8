"""spec.gateway.inferencePool.failureMode FailOpen and the engines' API token (issues 29 and 30): the
gateway's fallback request (the picker down) cannot carry the fleet's token, so FailOpen is refused unless
failOpenWithoutEngineToken says the gateway sets it; by pdfleet's checks and the CRD's CEL alike."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from crd_admission import _apply_defaults, admission_errors, root_schema  # noqa: E402
from pdfleet.operator.api import DisaggregatedInferenceSpec, errors_of  # noqa: E402
from pdfleet.operator.api.rules import FAIL_OPEN_RULES  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
GW = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}}]
FIELD = "spec.gateway.inferencePool.failureMode"


def cr(pool: dict[str, Any]) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["spec"]["gateway"] = {"inferencePool": {"allowFrom": GW, **copy.deepcopy(pool)}}
    return out


TABLE = [
    ("fail open, unacknowledged", {"enabled": True, "failureMode": "FailOpen"}, True),
    ("fail open, acknowledged false", {"enabled": True, "failureMode": "FailOpen",
                                       "failOpenWithoutEngineToken": False}, True),
    ("fail open, acknowledged", {"enabled": True, "failureMode": "FailOpen", "failOpenWithoutEngineToken": True},
     False),
    ("fail close", {"enabled": True, "failureMode": "FailClose"}, False),
    ("fail close by default", {"enabled": True}, False),
    ("fail close, acknowledgement unused", {"enabled": True, "failOpenWithoutEngineToken": True}, False),
    ("pool off: nothing rendered", {"enabled": False, "failureMode": "FailOpen"}, False),
]


@pytest.mark.parametrize("case,pool,refused", TABLE, ids=[t[0] for t in TABLE])
def test_fail_open_needs_the_acknowledgement(case: str, pool: dict, refused: bool) -> None:
    errors = [e for e in errors_of(cr(pool)) if e.field == FIELD]
    cel = [r for r in admission_errors(cr(pool)) if "failOpenWithoutEngineToken" in r]
    assert bool(errors) == refused, f"{case}: {[str(e) for e in errors_of(cr(pool))]}"
    assert bool(cel) == refused, f"{case}: the CRD's admission says {admission_errors(cr(pool))}"
    if refused:  # the message names the way out both ways
        assert "401" in errors[0].message and "FailClose" in errors[0].message
        assert "failOpenWithoutEngineToken" in errors[0].message


def test_the_acknowledgement_defaults_off() -> None:
    from pdfleet.operator.api import parse

    assert parse(cr({"enabled": True})).spec.gateway.inference_pool.fail_open_without_engine_token is False


def test_cel_and_python_agree_on_the_fail_open_rule() -> None:
    env = celpy.Environment()
    programs = [env.program(env.compile(r.cel)) for r in FAIL_OPEN_RULES]
    root = root_schema()
    seen = set()
    for enabled in (True, False, None):
        for mode in ("FailOpen", "FailClose", None):
            for ack in (True, False, None):
                pool: dict[str, Any] = {}
                for key, value in (("enabled", enabled), ("failureMode", mode), ("failOpenWithoutEngineToken", ack)):
                    if value is not None:
                        pool[key] = value
                spec = {"model": {"name": "m"}, "gateway": {"inferencePool": pool}, "network": {"networkPolicy": False}}
                defaulted = {"spec": copy.deepcopy(spec)}
                _apply_defaults(defaulted, root)
                activation = {"self": celpy.json_to_cel(defaulted["spec"])}
                python = [r.check(DisaggregatedInferenceSpec.model_validate(spec)) for r in FAIL_OPEN_RULES]
                assert [bool(p.evaluate(activation)) for p in programs] == python, spec
                seen.update(python)
    assert seen == {True, False}  # the rule both kept and broken in the grid
