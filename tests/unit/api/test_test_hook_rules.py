"""The PDFLEET_TEST_* rules (issue 30): the CRD's CEL and pdfleet's Python agree on every env list of
a grid where each rule is both kept and broken, with a negative control that a wrong CEL disagrees."""

from __future__ import annotations

import itertools
from typing import Any


from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS
from pdfleet.operator.api.rules import TEST_HOOK_RULES

from crd_admission import assert_cel_agrees_with_python, disagreements  # noqa: E402

NAMES = [None, [], ["A"], [TEST_CORRUPT_PULLED_BLOCKS], ["A", "PDFLEET_TEST_X"], ["PDFLEET_TESTS"],
         ["pdfleet_test_x"]]


def spec(engine, prefill, decode) -> dict[str, Any]:
    out: dict[str, Any] = {"model": {"name": "m"}}
    for where, names in (("engine", engine), ("prefill", prefill), ("decode", decode)):
        if names is not None:
            out[where] = {"env": [{"name": n, "value": "1"} for n in names]}
    return out


def test_cel_agrees_with_python_on_every_env_list() -> None:
    assert [r.field for r in TEST_HOOK_RULES] == ["engine.env", "prefill.env", "decode.env"]
    specs = [spec(*values) for values in itertools.product(NAMES, repeat=3)]
    assert_cel_agrees_with_python(TEST_HOOK_RULES, specs)
    # negative control: a rule that looks only at the first variable disagrees somewhere
    wrong = ("!has(self.engine.env) || size(self.engine.env) == 0 || "
             "!self.engine.env[0].name.startsWith('PDFLEET_TEST_')")
    assert disagreements(wrong, TEST_HOOK_RULES[0], specs) > 0
