"""`pdfleet validate -f CR.yaml`: exit 0, or exit 1 with one line per error naming the field."""

from __future__ import annotations

import argparse
import sys

import yaml

from pdfleet.operator.api import errors_of
from pdfleet.operator.commands.files import load_documents


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, help="YAML file with one or more resources ('-': stdin)")


def run(args: argparse.Namespace) -> int:
    try:
        docs = load_documents(args.filename)
    except (OSError, yaml.YAMLError) as exc:
        print(f"{args.filename}: {exc}", file=sys.stderr)
        return 1
    if not docs:
        print(f"{args.filename}: no resource found", file=sys.stderr)
        return 1
    failed = False
    for index, doc in enumerate(docs):
        name = (doc.get("metadata") or {}).get("name", f"document {index}") if isinstance(doc, dict) else index
        for error in errors_of(doc):
            failed = True
            print(f"{args.filename}: {name}: {error}", file=sys.stderr)
    if not failed:
        print(f"{args.filename}: valid")
    return 1 if failed else 0
