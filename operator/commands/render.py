"""`pdfleet render -f CR.yaml`: every child object as multi-document YAML, in a fixed order."""

from __future__ import annotations

import argparse
import sys

import yaml

from pdfleet.operator.api import InvalidResource, parse
from pdfleet.operator.commands.files import fleet_documents, load_documents
from pdfleet.operator.plan import DEFAULT_IMAGE, PlanOptions, plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, help="YAML file with one or more resources ('-': stdin)")
    parser.add_argument("-n", "--namespace", help="namespace of the children (default: the resource's, or 'default')")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="runtime image when the resource sets none")


def run(args: argparse.Namespace) -> int:
    try:
        fleets, notes = fleet_documents(load_documents(args.filename))
        resources = [parse(doc) for _, doc in fleets]
    except InvalidResource as exc:
        for error in exc.errors:
            print(f"{args.filename}: {error}", file=sys.stderr)
        return 1
    except (OSError, yaml.YAMLError) as exc:
        print(f"{args.filename}: {exc}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"{args.filename}: {note}", file=sys.stderr)
    options = PlanOptions(default_image=args.image, namespace=args.namespace)
    children = [obj for resource in resources for obj in plan(resource, options)]
    sys.stdout.write(yaml.safe_dump_all(children, sort_keys=False, width=120))
    return 0
