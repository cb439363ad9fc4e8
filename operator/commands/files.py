"""Reading resource files given on the command line."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from pdfleet.operator.api import scaler
from pdfleet.operator.api.types import GROUP, KIND


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


def _is_list(doc: Any) -> bool:
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list)


def _is_other_kind(doc: Any) -> bool:
    """A mapping that names a kind and is not a fleet; a mapping without a kind is read as a fleet (and told
    what it lacks), as is anything of the pdfleet.io group but the scaler."""
    if not isinstance(doc, dict) or "kind" not in doc:
        return False
    group = str(doc.get("apiVersion", "")).partition("/")[0]
    return doc["kind"] != KIND and (group != GROUP or doc["kind"] == scaler.KIND)


def _kind_and_name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{doc.get('kind')} {name}" if isinstance(name, str) and name else str(doc.get("kind"))


def fleet_documents(docs: list[Any]) -> tuple[list[tuple[str, Any]], list[str]]:
    """The documents to read as fleets, each with the name messages give it, and a note per document skipped:
    another kind (a GitOps folder holds HTTPRoutes, Services, ...), the items of a `kind: List` read in its place."""
    fleets: list[tuple[str, Any]] = []
    notes: list[str] = []
    for index, doc in enumerate(docs):
        items = [(f"document {index} item {i}", item) for i, item in enumerate(doc["items"])] if _is_list(doc) else [
            (f"document {index}", doc)]
        for where, item in items:
            if _is_other_kind(item):
                notes.append(f"{where}: skipped {_kind_and_name(item)} (not a {KIND})")
            else:
                name = document_name(item, index)
                fleets.append((name if name != f"document {index}" else where, item))
    return fleets, notes
