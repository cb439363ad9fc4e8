"""Rollouts never cut off work in flight (issue 20 row 7): every grace period and the rollout drain
agree with the router's timeouts (pure). On main the old pair went 30 s after the switch, decode
drained 45 s and the router kept Kubernetes' 30 s, against a 120 s prefill leg and a 600 s wait
for decode's first byte."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.api import parse
from pdfleet.operator.plan import plan
from pdfleet.operator.plan.drain import ROUTER, rollout_drain_seconds
from pdfleet.operator.reconcile.reconciler import ReconcileOptions

ROOT = Path(__file__).resolve().parents[3]


def _pods(example):
    objs = plan(parse(yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())))
    out = {}
    for o in objs:
        if o["kind"] in ("StatefulSet", "Deployment"):
            out[o["metadata"]["labels"]["pdfleet.io/role"]] = o["spec"]["template"]["spec"]
    return out


def _arg(container, flag):
    args = container["args"]
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma"])
def test_grace_periods_cover_the_routers_timeouts(example):
    pods = _pods(example)
    decode = pods["decode"]
    drain = int(_arg(decode["containers"][0], "--shutdown-timeout"))
    # a decode leg the router still waits for is never aborted by the engine's drain ...
    assert drain >= ROUTER.decode_first_byte_timeout_s
    # ... nor by the kubelet's SIGKILL
    assert decode["terminationGracePeriodSeconds"] > drain
    # the router finishes what it admitted before its pod is killed
    assert pods["router"]["terminationGracePeriodSeconds"] > ROUTER.max_request_seconds()


def test_the_old_pair_stays_until_every_admitted_request_reached_its_decode():
    assert ReconcileOptions().drain_seconds == rollout_drain_seconds()
    assert rollout_drain_seconds() > 2 * ROUTER.connect_timeout_s + ROUTER.prefill_timeout_s


@pytest.mark.parametrize("prefill, connect, want", [(120.0, 3.0, 141), (10.0, 1.0, 27), (0.5, 0.1, 16)])
def test_rollout_drain_follows_the_router(prefill, connect, want):
    router = dataclasses.replace(RouterConfig(kubernetes_fleet="-"), prefill_timeout_s=prefill,
                                 connect_timeout_s=connect)
    assert rollout_drain_seconds(router) == want


def test_max_request_seconds():
    cfg = RouterConfig(kubernetes_fleet="-", connect_timeout_s=2, prefill_timeout_s=10, decode_first_byte_timeout_s=30)
    assert cfg.max_request_seconds() == 44
