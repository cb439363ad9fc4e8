"""Issue 20 row 10, with real UCX (through NIXL): an engine's environment from the plan makes UCX's TCP
transport listen only on ports the fleet's NetworkPolicy opens, whatever ucxTransports says; without the
pin (main) the kernel picks ports the policy does not open."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pdfleet.operator.api import parse
from pdfleet.operator.plan import plan
from pdfleet.operator.plan.engine import engine_env

pytestmark = pytest.mark.timeout(120)

AGENT = """
import os, subprocess, sys, time
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("a", nixl_agent_config(backends=["UCX"]))
out = subprocess.run(["ss", "-ltnH", "-p"], capture_output=True, text=True).stdout
mine = [l.split()[3].rsplit(":", 1)[1] for l in out.splitlines() if f"pid={os.getpid()}," in l]
print("PORTS", " ".join(mine))
"""


def listening_ports(env: dict[str, str]) -> list[int]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    full.update(env)
    result = subprocess.run([sys.executable, "-c", AGENT], env=full, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = [l for l in result.stdout.splitlines() if l.startswith("PORTS")]
    return [int(p) for p in line.split()[1:]]


def opened(obj) -> list[tuple[int, int]]:
    (np,) = [o for o in plan(parse(obj)) if o["kind"] == "NetworkPolicy"]
    return [(p["port"], p.get("endPort", p["port"])) for p in np["spec"]["ingress"][0]["ports"]]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
@pytest.mark.parametrize("transports", [None, ["tcp"]])
def test_ucx_listens_only_where_the_policy_opens(transports):
    obj = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
           "spec": {"model": {"name": "m"}, "engine": {"blockSize": 32}, "prefill": {"replicas": 1},
                    "decode": {"replicas": 1}, "network": {"networkPolicy": True,
                                                           **({"ucxTransports": transports} if transports else {})}}}
    env = {k: v for k, v in engine_env(parse(obj).spec, "prefill").items() if k.startswith("UCX_")}
    ranges = opened(obj)
    ports = listening_ports(env)
    assert ports, "UCX's TCP transport listens nowhere: nothing was checked"
    assert all(any(lo <= p <= hi for lo, hi in ranges) for p in ports), (ports, ranges)
    # negative control: without the pin the kernel's ephemeral ports are outside what the policy opens
    unpinned = listening_ports({k: v for k, v in env.items() if k != "UCX_TCP_PORT_RANGE"})
    assert unpinned and not all(any(lo <= p <= hi for lo, hi in ranges) for p in unpinned), (unpinned, ranges)
