"""The PDFLEET_TEST_* rules (issue 30): the CRD's CEL and pdfleet's Python agree on every env list of
a grid where each rule is both kept and broken, with a negative control that a wrong CEL disagrees."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import celpy

from pdfleet.operator.api import DisaggregatedInferenceSpec
from pdfleet.operator.api.rules import TEST_HOOK_RULES

from crd_admission import _apply_defaults, root_schema  # noqa: E402

NAMES = [None, [], ["A"], ["PDFLEET_TEST_CORRUPT_PULLED_BLOCKS"], ["A", "PDFLEET_TEST_X"], ["PDFLEET_TESTS"],
         ["pdfleet_test_x"]]


def spec(engine, prefill, decode) -> dict[str, Any]:
    out: dict[str, Any] = {"model": {"name": "m"}}
    for where, names in (("engine", engine), ("prefill", prefill), ("decode", decode)):
        if names is not None:
            out[where] = {"env": [{"name": n, "value": "1"} for n in names]}
    return out


def cel(programs, s: dict[str, Any]) -> list[bool]:
    defaulted = {"spec": copy.deepcopy(s)}
    _apply_defaults(defaulted, root_schema())
    activation = {"self": celpy.json_to_cel(defaulted["spec"])}
    return [bool(p.evaluate(activation)) for p in programs]


def test_cel_agrees_with_python_on_every_env_list() -> None:
    env = celpy.Environment()
    programs = [env.program(env.compile(r.cel)) for r in TEST_HOOK_RULES]
    assert [r.field for r in TEST_HOOK_RULES] == ["engine.env", "prefill.env", "decode.env"]
    broken = [0, 0, 0]
    samples = list(itertools.product(NAMES, repeat=3))
    for values in samples:
        s = spec(*values)
        python = [r.check(DisaggregatedInferenceSpec.model_validate(s)) for r in TEST_HOOK_RULES]
        assert cel(programs, s) == python, s
        broken = [b + (not ok) for b, ok in zip(broken, python)]
    assert all(0 < b < len(samples) for b in broken), broken
    # negative control: a rule that looks only at the first variable disagrees somewhere
    wrong = [env.program(env.compile("!has(self.engine.env) || size(self.engine.env) == 0 || "
                                     "!self.engine.env[0].name.startsWith('PDFLEET_TEST_')"))]
    assert any(cel(wrong, spec(*v))[0] != TEST_HOOK_RULES[0].check(DisaggregatedInferenceSpec.model_validate(spec(*v)))
               for v in samples)
