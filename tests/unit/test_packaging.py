"""pyproject lists every package (setuptools cannot discover renamed folders)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"operator": "pdfleet.operator", "connector": "pdfleet.connector"}


def test_every_package_folder_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, package in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == listed


def test_operator_folder_is_not_importable_as_operator() -> None:
    import operator

    assert hasattr(operator, "itemgetter")  # still the standard library's
