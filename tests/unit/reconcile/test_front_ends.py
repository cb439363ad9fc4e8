"""Which pods' /metrics the canary analysis and the planner read (kube/front_ends.py, pure)."""

from __future__ import annotations

import pytest

from pdfleet.contract.gateway import EPP_METRICS
from pdfleet.operator.kube.front_ends import metrics_targets
from pdfleet.operator.kube.observed import ObservedPod


def pod(name: str, role: str | None, *, ready: bool = True, ip: str | None = "10.0.0.1", deleting: bool = False,
        ports: tuple[tuple[str, int], ...] = ()) -> ObservedPod:
    return ObservedPod("ns", name, role, "r1", ip, ready, deleting, ports)


@pytest.mark.parametrize("pods, expected", [
    ([pod("r", "router")], [("r", "http://10.0.0.1:8000/metrics")]),  # the router's port from the spec
    ([pod("r", "router", ports=(("http", 8080),))], [("r", "http://10.0.0.1:8080/metrics")]),
    # The Endpoint Picker serves the same series (the serving pipeline's): it is read too. Negative control:
    # before, only role "router" was read, and gateway traffic reached no canary or planner.
    ([pod("e", "epp")], [("e", f"http://10.0.0.1:{EPP_METRICS}/metrics")]),
    ([pod("e", "epp", ports=(("grpc", 9002), ("http", 9191)))], [("e", "http://10.0.0.1:9191/metrics")]),
    ([pod("r", "router", ready=False), pod("e", "epp", deleting=True), pod("x", "epp", ip=None)], []),
    ([pod("p", "prefill"), pod("d", "decode"), pod("n", None)], []),  # engines and strays are no front end
])
def test_metrics_targets(pods, expected):
    assert metrics_targets(pods, router_port=8000) == expected
