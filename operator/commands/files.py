"""Reading resource files given on the command line."""

from __future__ import annotations

import sys
from typing import Any

import yaml


def load_documents(path: str) -> list[Any]:
    """Every non-empty YAML document of a file ('-' reads standard input)."""
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
