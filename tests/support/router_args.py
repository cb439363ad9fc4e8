"""The router container's args as the plan renders them for a resource, and the config the router parses from
them (the API tests of spec.router settings check both halves)."""

from __future__ import annotations

import argparse
from typing import Any

from pdfleet.connector.router import command
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.plan import PlanOptions, plan


def router_args(resource: dict[str, Any]) -> list[str]:
    (dep,) = [o for o in plan(resource, PlanOptions(serving_revision="rev0000001")) if o["kind"] == "Deployment"]
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def parsed(args: list[str]) -> RouterConfig:
    """What `pdfleet router` makes of ``args`` (the plan's, whose first is the subcommand)."""
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.config_from_args(parser.parse_args(args[1:]))
