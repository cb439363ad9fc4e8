"""`pdfleet validate -f CR.yaml`: exit 0; exit 1 with one line per error naming the field;
exit 2 with one line saying why when the input is not resources at all (unreadable, not
UTF-8, not YAML, a document that is not a mapping). Never a traceback. Documents of other kinds are
skipped with a note naming them, and a `kind: List` is read item by item, so a GitOps folder's file validates."""

from __future__ import annotations

import argparse
import sys

from pdfleet.operator.api import KIND, errors_of
from pdfleet.operator.commands.files import UnreadableInput, fleet_documents, load_documents
from pdfleet.operator.local.tiny_model import TINY_MODEL_NAME

INVALID, UNREADABLE = 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, help="YAML file with one or more resources ('-': stdin)")


def run(args: argparse.Namespace) -> int:
    try:
        docs = load_documents(args.filename)
    except UnreadableInput as exc:
        print(f"{args.filename}: {exc}", file=sys.stderr)
        return UNREADABLE
    if not docs:
        print(f"{args.filename}: no resource found", file=sys.stderr)
        return UNREADABLE
    fleets, notes = fleet_documents(docs)
    for note in notes:
        print(f"{args.filename}: {note}", file=sys.stderr)
    code = 0
    for name, doc in fleets:
        code = max(code, _check(args.filename, name, doc))
    if not code:
        print(f"{args.filename}: valid" if fleets else f"{args.filename}: valid (no {KIND} in it)")
    return code


def _check(filename: str, name: str, doc: object) -> int:
    """Print each error of one document; the exit code it asks for."""
    if not isinstance(doc, dict):
        print(f"{filename}: {name}: not a resource: a YAML mapping is expected, got {type(doc).__name__}",
              file=sys.stderr)
        return UNREADABLE
    try:
        errors = errors_of(doc)
    except Exception as exc:  # noqa: BLE001 - a bug in a rule must not print a traceback at the user
        print(f"{filename}: {name}: cannot be validated: {type(exc).__name__}: {exc}", file=sys.stderr)
        return UNREADABLE
    for error in errors:
        print(f"{filename}: {name}: {error}", file=sys.stderr)
    for note in [] if errors else local_only_notes(doc):
        print(f"{filename}: {name}: note: {note}", file=sys.stderr)
    return INVALID if errors else 0


def local_only_notes(doc: dict) -> list[str]:
    """What is valid but runs only under `pdfleet local` (pure): the tiny model it builds on the spot."""
    model = (doc.get("spec") or {}).get("model") or {}
    if model.get("name") == TINY_MODEL_NAME:
        return [f"spec.model.name: {TINY_MODEL_NAME} is built on the spot by `pdfleet local`; engines in a cluster "
                "cannot download it (docs/quickstart.md runs a public model)"]
    return []
