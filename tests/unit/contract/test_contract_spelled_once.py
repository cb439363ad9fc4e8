"""Every value the halves must agree on is spelled once, in pdfleet.contract, and imported.

Product code (operator/, connector/, bench/) that spells one of the contract's distinctive
values as a literal fails here; so does a contract module that imports anything but the
standard library (the connector inside vLLM and the router import it too).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from pdfleet.contract import connector_config, env, fabric, kv_params, labels, metrics, ports, routing, scale_to_zero

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("operator", "connector", "bench")
# Values too common to police: role names, "http", "backends", plain numbers, and kv_transfer_params
# keys that are also ordinary field names elsewhere (a layout's tp_size, a pull's remote_block_ids).
GENERIC = {"prefill", "decode", "router", "epp", "http", "backends", "leg", "true", "True", "False", 8000, 500, 4000, 256,
           "pdfleet.io/", "tp_size", "remote_block_ids", "remote_request_id",
           "Always",  # also a Kubernetes imagePullPolicy
           "reason"}  # a metric label (TOKENIZER_REASON) and every Kubernetes condition's and event's field


def _constants(*modules) -> dict[object, str]:
    out: dict[object, str] = {}
    for module in modules:
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, (str, int)) and not isinstance(value, bool) and value not in GENERIC:
                out.setdefault(value, f"{module.__name__}.{name}")
    return out


CONTRACT = _constants(labels, ports, env, routing, metrics, fabric, kv_params, scale_to_zero)
CONTRACT.update({v: f"connector_config.{k}" for k, v in vars(connector_config).items()
                 if k.isupper() and isinstance(v, str) and v not in GENERIC})


def _literals(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    exports = {id(c) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
               for c in ast.walk(n.value)}  # a module's __all__ names its own classes
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in exports and id(node) not in docstrings and not isinstance(node.value, bool):
            yield node.lineno, node.value


def spelled_again(roots=PRODUCT) -> list[str]:
    found = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            for line, value in _literals(path):
                if isinstance(value, (str, int)) and value in CONTRACT:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {value!r} is {CONTRACT[value]}")
    return found


def test_contract_values_are_spelled_only_in_the_contract():
    assert spelled_again() == []


def test_the_check_finds_a_value_spelled_again(tmp_path, monkeypatch):
    """Negative control: the scan sees a literal label key, port and metric name."""
    (tmp_path / "operator").mkdir()
    (tmp_path / "operator" / "x.py").write_text(
        '"""pdfleet.io/fleet in a docstring is prose."""\nA = "pdfleet.io/fleet"\nB = 5557\nC = "pdfleet_router_streams"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [f.split(": ")[0] for f in spelled_again(("operator",))] == [
        "operator/x.py:2", "operator/x.py:3", "operator/x.py:4"]


@pytest.mark.parametrize("path", sorted((ROOT / "contract").glob("*.py")), ids=lambda p: p.name)
def test_the_contract_imports_only_the_standard_library(path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith("pdfleet.contract") or top == "__future__", (
                f"{path.name} imports {name}")
