"""`pdfleet validate -f CR.yaml`: exit 0; exit 1 with one line per error naming the field;
exit 2 with one line saying why when the input is not resources at all (unreadable, not
UTF-8, not YAML, a document that is not a mapping). Never a traceback."""

from __future__ import annotations

import argparse
import sys

from pdfleet.operator.api import errors_of
from pdfleet.operator.commands.files import UnreadableInput, document_name, load_documents

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
    code = 0
    for index, doc in enumerate(docs):
        name = document_name(doc, index)
        if not isinstance(doc, dict):
            print(f"{args.filename}: {name}: not a resource: a YAML mapping is expected, got {type(doc).__name__}",
                  file=sys.stderr)
            code = UNREADABLE
            continue
        try:
            errors = errors_of(doc)
        except Exception as exc:  # noqa: BLE001 - a bug in a rule must not print a traceback at the user
            print(f"{args.filename}: {name}: cannot be validated: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = UNREADABLE
            continue
        for error in errors:
            code = code or INVALID
            print(f"{args.filename}: {name}: {error}", file=sys.stderr)
    if not code:
        print(f"{args.filename}: valid")
    return code
