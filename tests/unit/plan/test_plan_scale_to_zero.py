"""spec.scaling.scaleToZero reaches both front ends' waiting rooms (issue 41): the router's and the Endpoint Picker's
args carry maxWaiting and activationTimeoutSeconds through RouterConfig's one flag table; off (0) unless enabled."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from pdfleet.connector.epp import command as epp_command
from pdfleet.contract.router_config import RouterConfig, from_args, parse_argv
from pdfleet.contract.scale_to_zero import DEFAULT_ACTIVATION_TIMEOUT_S

from test_plan_epp_front_door import epp_container  # noqa: E402
from test_plan_gateway import GW_NAMESPACE, children, cr, one  # noqa: E402

AUTO0 = {"replicas": 1, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}


def front_end_configs(stz: dict[str, Any] | None) -> tuple[RouterConfig, RouterConfig]:
    spec: dict[str, Any] = {"prefill": AUTO0, "decode": AUTO0}
    if stz is not None:
        spec["scaling"] = {"scaleToZero": stz}
    objs = children(cr({"enabled": True, "allowFrom": GW_NAMESPACE}, **spec))
    (router,) = one(objs, "Deployment", "tiny-router")["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    epp_command.add_arguments(parser)
    return parse_argv(router["args"][1:]), from_args(parser.parse_args(epp_container(objs)["args"][1:]))


@pytest.mark.parametrize("stz,want", [
    ({"enabled": True, "activationTimeoutSeconds": 90, "maxWaiting": 40}, (40, 90.0)),
    ({"enabled": True}, (1000, 300.0)),
    ({"enabled": False, "maxWaiting": 40}, (0, DEFAULT_ACTIVATION_TIMEOUT_S)),  # off
    (None, (0, DEFAULT_ACTIVATION_TIMEOUT_S)),
])
def test_both_front_ends_hold_requests_as_the_spec_says(stz, want) -> None:
    for config in front_end_configs(stz):
        assert (config.scale_to_zero_max_waiting, config.scale_to_zero_activation_timeout_s) == want
