"""The NetworkPolicy opens the ports of UCX's TCP transport, pinned by UCX_TCP_PORT_RANGE, for every
ucxTransports choice (issue 20 row 10: it opened only HTTP, side-channel and KV-event ports)."""

from __future__ import annotations

import pytest

from pdfleet.operator.api import errors_of, parse
from pdfleet.operator.api.rules import parse_port_range
from pdfleet.operator.plan import plan
from pdfleet.operator.plan.engine import UCX_TCP_PORT_RANGE, engine_env


def resource(transports=None, env=(), decode_env=(), policy=True):
    network = {"networkPolicy": policy}
    if transports is not None:
        network["ucxTransports"] = transports
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
            "spec": {"model": {"name": "m"}, "engine": {"blockSize": 32, "env": list(env)}, "network": network,
                     "prefill": {"replicas": 1}, "decode": {"replicas": 1, "env": list(decode_env)}}}


def policy_ports(obj):
    (np,) = [o for o in plan(parse(obj)) if o["kind"] == "NetworkPolicy"]
    (rule,) = np["spec"]["ingress"]
    return rule["ports"]


DEFAULT = {"protocol": "TCP", "port": UCX_TCP_PORT_RANGE[0], "endPort": UCX_TCP_PORT_RANGE[1]}


@pytest.mark.parametrize("transports", [None, [], ["tcp"], ["rc"], ["rc", "tcp"], ["ud", "cma"], ["^cuda_ipc"],
                                        ["all"]])
def test_every_transport_choice_gets_the_pinned_ports_opened(transports):
    obj = resource(transports)
    assert DEFAULT in policy_ports(obj)
    s = parse(obj).spec
    for role in ("prefill", "decode"):
        assert engine_env(s, role)["UCX_TCP_PORT_RANGE"] == "{}-{}".format(*UCX_TCP_PORT_RANGE)


def test_a_users_range_is_what_the_policy_opens():
    obj = resource(env=[{"name": "UCX_TCP_PORT_RANGE", "value": "30000-30009"}])
    ports = policy_ports(obj)
    assert {"protocol": "TCP", "port": 30000, "endPort": 30009} in ports and DEFAULT not in ports
    # a role's own range is opened too
    obj = resource(decode_env=[{"name": "UCX_TCP_PORT_RANGE", "value": "31000"}])
    assert {"protocol": "TCP", "port": 31000} in policy_ports(obj) and DEFAULT in policy_ports(obj)


@pytest.mark.parametrize("value, ok", [("0", False), ("abc", False), ("9-1", False), ("1-70000", False),
                                       ("30000-30009", True)])
def test_an_unpinned_range_is_refused_by_name_while_the_policy_is_on(value, ok):
    errors = errors_of(resource(env=[{"name": "UCX_TCP_PORT_RANGE", "value": value}]))
    assert (not errors) == ok, errors
    if not ok:
        assert [e.field for e in errors] == ["spec.engine.env[0].value"]
    assert not errors_of(resource(env=[{"name": "UCX_TCP_PORT_RANGE", "value": value}], policy=False))


@pytest.mark.parametrize("value, want", [("20000-20127", (20000, 20127)), ("5", (5, 5)), (" 7-9 ", (7, 9)),
                                         ("0", None), ("", None), ("1-", None), ("2-1", None), ("0-5", None)])
def test_parse_port_range(value, want):
    assert parse_port_range(value) == want
