"""The `pdfleet` command: one entry point, one module per subcommand.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`
and is imported only when its subcommand runs, so `pdfleet validate` never
imports kopf, vLLM or NIXL.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("pdfleet.operator.commands.crd", "print the CustomResourceDefinition generated from the API models"),
    "validate": ("pdfleet.operator.commands.validate", "check a DisaggregatedInference file; one line per error"),
    "render": ("pdfleet.operator.commands.render", "print every child object the operator would apply"),
    "operator": ("pdfleet.operator.reconcile.command", "run the kopf operator"),
    "router": ("pdfleet.connector.router.command", "run the P/D router"),
    "epp": ("pdfleet.connector.epp.command", "run the gateway's Endpoint Picker (ext_proc gRPC, P/D behind a Gateway)"),
    "local": ("pdfleet.operator.local.command", "run the fleet a CR describes as local processes"),
}


def _version() -> str:
    """The installed package's version (pyproject.toml), as pip knows it."""
    try:
        return importlib.metadata.version("pdfleet")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, object | None]:
    parser = argparse.ArgumentParser(prog="pdfleet", description="vLLM prefill/decode fleets over NIXL")
    parser.add_argument("--version", action="version", version=f"pdfleet {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, module = build_parser(argv)
    args = parser.parse_args(argv)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
