"""pyproject lists every package (setuptools cannot discover renamed folders)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# folder -> package, from pyproject itself (operator/ is pdfleet.operator, contract/ pdfleet.contract, ...)
MAPPING = {folder: package for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}


def test_every_package_folder_is_listed() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set()
    for folder, package in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == listed


def test_every_source_folder_goes_into_the_images() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for folder in MAPPING:
        assert dockerfile.count(f"COPY {folder}/ {folder}/") == 3, folder  # operator, runtime, runtime-cpu images
        assert f"!{folder}/" in ignore, folder


def test_operator_folder_is_not_importable_as_operator() -> None:
    import operator

    assert hasattr(operator, "itemgetter")  # still the standard library's
