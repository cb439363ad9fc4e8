"""`pdfleet crd`: print the CRD generated from the API models."""

from __future__ import annotations

import argparse
import sys

from pdfleet.operator.api import scaler
from pdfleet.operator.api.crd import crd_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")
    parser.add_argument("--kind", choices=("fleet", "scaler"), default="fleet",
                        help="fleet: DisaggregatedInference (default); scaler: DisaggregatedInferenceScaler")


def run(args: argparse.Namespace) -> int:
    text = scaler.crd_yaml() if args.kind == "scaler" else crd_yaml()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
