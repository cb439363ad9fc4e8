"""The Endpoint Picker as the operator renders it serves ext_proc over TLS (secure serving, as GAIE's EPP), with
the kubelet's gRPC probes on its plaintext health port, table-tested: the args that `pdfleet epp`'s own parser
reads back, the probes, the ports, the Service and the NetworkPolicy; the Deployment validated strictly."""

from __future__ import annotations

import argparse
from typing import Any

import kubernetes_validate
import pytest

from pdfleet.connector.epp import command
from pdfleet.contract import gateway as gw

from test_plan_gateway import children, cr, one  # noqa: E402


def epp_objs(pool: dict[str, Any]) -> list[dict[str, Any]]:
    return children(cr({"enabled": True, **pool}))


def container(objs) -> dict[str, Any]:
    (c,) = one(objs, "Deployment", "tiny-epp")["spec"]["template"]["spec"]["containers"]
    return c


def parsed(args: list[str]) -> argparse.Namespace:
    """The args as `pdfleet epp` reads them."""
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(args[1:])


POOLS = [
    ("defaults", {}),
    ("another ext_proc port", {"eppPort": 19002}),
    ("callerAuth None", {"callerAuth": gw.CALLER_AUTH_NONE}),
]


@pytest.mark.parametrize("case, pool", POOLS, ids=[p[0] for p in POOLS])
def test_the_epp_serves_tls_with_a_plaintext_health_port(case, pool) -> None:
    objs = epp_objs(pool)
    c = container(objs)
    args = parsed(c["args"])
    assert args.secure_serving is True and args.cert_path is None  # a self-signed certificate made at start
    assert args.grpc_health_port == gw.EPP_GRPC_HEALTH
    assert args.grpc_port == pool.get("eppPort", gw.EPP_GRPC)
    assert args.any_caller is (pool.get("callerAuth") == gw.CALLER_AUTH_NONE)
    assert command._port_problem(args.grpc_port, args.grpc_health_port, args.port) is None
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports[gw.GRPC_HEALTH_PORT_NAME] == args.grpc_health_port
    assert ports[gw.GRPC_PORT_NAME] == args.grpc_port
    kubernetes_validate.validate(one(objs, "Deployment", "tiny-epp"), "1.33.0", strict=True)


@pytest.mark.parametrize("probe, service, period", [
    ("readinessProbe", gw.HEALTH_READINESS, 5),
    ("livenessProbe", gw.HEALTH_LIVENESS, 10),
])
def test_the_probes_are_grpc_on_the_health_port(probe, service, period) -> None:
    """The kubelet's gRPC probe cannot do TLS: it asks the plaintext port, for the names the EPP answers."""
    c = container(epp_objs({}))
    assert c[probe] == {"grpc": {"port": gw.EPP_GRPC_HEALTH, "service": service}, "periodSeconds": period,
                        "failureThreshold": 3}
    assert "httpGet" not in c[probe]


def test_the_router_keeps_its_http_probes() -> None:
    """Negative control for the override: only the EPP's container changed."""
    (rtr,) = one(epp_objs({}), "Deployment", "tiny-router")["spec"]["template"]["spec"]["containers"]
    assert "httpGet" in rtr["readinessProbe"] and "grpc" not in rtr["readinessProbe"]


def test_the_service_offers_only_ext_proc_as_http2() -> None:
    """The kubelet reaches the health port on the pod: the Service names ext_proc alone, http2 (TLS) as GAIE's
    chart has it, not kubernetes.io/h2c."""
    svc = one(epp_objs({}), "Service", "tiny-epp")
    assert svc["spec"]["ports"] == [{"name": gw.GRPC_PORT_NAME, "port": gw.EPP_GRPC, "targetPort": gw.GRPC_PORT_NAME,
                                     "protocol": "TCP", "appProtocol": "http2"}]
    kubernetes_validate.validate(svc, "1.33.0", strict=True)

