"""Reading resource files given on the command line."""

from __future__ import annotations

import sys
from typing import Any

import yaml


class UnreadableInput(yaml.YAMLError):
    """The file cannot be read as YAML documents (missing, not UTF-8, not YAML); says why."""


def load_documents(path: str) -> list[Any]:
    """Every non-empty YAML document of a file ('-' reads standard input)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise UnreadableInput(exc.strerror or str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableInput(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise UnreadableInput(f"not valid YAML: {exc}") from None
    except RecursionError:
        raise UnreadableInput("not valid YAML: nested too deeply") from None


def document_name(doc: Any, index: int) -> str:
    """How messages name a document: its metadata.name when that is a string, else its position."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else f"document {index}"
