"""allowFrom[].ipBlock: a CIDR is checked before apply, by `pdfleet validate` (ipaddress) and by the CRD (a CEL
regular expression), which accept the same strings and say the same words, naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from crd_admission import admission_errors  # noqa: E402
from pdfleet.operator.api import cidr, errors_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]

# (string, a CIDR?)
TABLE = [
    ("10.0.0.0/8", True), ("10.0.0.1/8", True), ("0.0.0.0/0", True), ("192.168.1.255/32", True),
    ("fd00::/8", True), ("::/0", True), ("2001:db8::1/128", True), ("::ffff:10.0.0.0/104", True),
    ("1:2:3:4:5:6:1.2.3.4/128", True), ("::1.2.3.4/128", True), ("1:2:3:4:5:6:7:8/64", True), ("FD00::/8", True),
    ("256.0.0.0/8", False), ("10.0.0.0/33", False), ("10.0.0.0", False), ("10.0.0/8", False),
    ("010.0.0.0/8", False), ("10.0.0.0/08", False), ("10.0.0.0/", False), ("/8", False), ("", False),
    ("1::2::3/64", False), ("2001:db8::/129", False), ("fe80::1%eth0/64", False), ("12345::/16", False),
    ("1:2:3:4:5:6:7:8:9/64", False), (" 10.0.0.0/8", False), ("10.0.0.0/8\n", False), ("10.0.0.0/8/8", False),
    ("example.com/8", False), ("10.0.0.0/-1", False), ("1.2.3.4.5/8", False),
]


def _cel(expression: str, value: str) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(expression)).evaluate({"self": celpy.celtypes.StringType(value)}))


@pytest.mark.parametrize("value,expected", TABLE)
def test_python_and_the_crd_agree(value: str, expected: bool) -> None:
    assert cidr.is_cidr(value) is expected
    assert _cel(cidr.cel_rule()["rule"], value) is expected


def test_a_looser_expression_disagrees_somewhere() -> None:
    """Negative control: the table tells a loose pattern from the real one."""
    loose = "self.matches('^[0-9a-fA-F:.]+/[0-9]+$')"
    assert [v for v, ok in TABLE if _cel(loose, v) != ok]


def _cr(block: dict[str, Any]) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["spec"]["gateway"] = {"inferencePool": {"enabled": True, "allowFrom": [
        {"namespaceSelector": {}}, {"ipBlock": copy.deepcopy(block)}]}}
    return out


P = "spec.gateway.inferencePool.allowFrom[1].ipBlock"
BAD = [
    ({"cidr": "10.0.0.0/33"}, f"{P}.cidr"),
    ({"cidr": "10.0.0.0"}, f"{P}.cidr"),
    ({"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "10.2.0.0"]}, f"{P}.except[1]"),
]


@pytest.mark.parametrize("block,field", BAD)
def test_a_bad_cidr_is_refused_with_its_field_in_the_same_words(block, field) -> None:
    assert [str(e) for e in errors_of(_cr(block))] == [f"{field}: {cidr.MESSAGE}"]
    assert cidr.MESSAGE in admission_errors(_cr(block))


def test_an_except_outside_cidr_is_refused_by_validate() -> None:
    """The API server refuses it too (NetworkPolicy validation, at apply); validate says so before."""
    assert [str(e) for e in errors_of(_cr({"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}))] == [
        f"{P}: {cidr.EXCEPT_MESSAGE}"]


@pytest.mark.parametrize("block", [{"cidr": "10.0.0.0/8"}, {"cidr": "fd00::/8", "except": ["fd00:1::/32"]}])
def test_good_blocks_pass(block) -> None:
    assert errors_of(_cr(block)) == []
    assert admission_errors(_cr(block)) == []
