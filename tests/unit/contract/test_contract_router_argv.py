"""The router's argv: the plan renders it from a RouterConfig, the router's CLI parses it back."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml

from pdfleet.connector.router import command
from pdfleet.contract.flow_control import FlowControlConfig, Priority
from pdfleet.contract.router_config import NOT_FLAGS, RouterConfig, parse_argv
from pdfleet.operator.plan import plan
from pdfleet.operator.plan.router import router_config

ROOT = Path(__file__).resolve().parents[3]


def cli_parses(argv: list[str]) -> RouterConfig:
    """What `pdfleet router ARGV` runs with: the router command's own parser."""
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.config_from_args(parser.parse_args(argv))


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_plan_renders_what_the_router_parses(example, monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "elsewhere")  # the pod's env must not change what the args say
    monkeypatch.setenv("PDFLEET_FLEET", "other")
    cr = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    (router,) = [o for o in plan(cr) if o["kind"] == "Deployment"]
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["pdfleet"] and container["args"][0] == "router"
    parsed = cli_parses(container["args"][1:])
    from pdfleet.operator.api import parse
    from pdfleet.operator.plan import context

    resource = parse(cr)
    assert parsed == router_config(context(resource), resource.spec)
    assert parsed.kubernetes_fleet == cr["metadata"]["name"] and parsed.host == "0.0.0.0"


FLAGGED = [f.name for f in fields(RouterConfig) if f.name not in NOT_FLAGS]
VARIANTS = {
    "host": "10.1.2.3", "port": 9001, "kubeconfig": "/k", "port_name": "api",
    "prefill_policy": "leastOutstanding", "decode_policy": "leastOutstanding", "tokenizer": "org/model",
    "block_size": 32, "hash_seed": "7", "prefix_max_imbalance": 0, "max_body_bytes": 10, "prefill_attempts": 3,
    "decode_attempts": 4, "lease_margin_s": 2.5, "connect_timeout_s": 1.5, "prefill_timeout_s": 9.0,
    "decode_first_byte_timeout_s": 8.0, "decode_idle_timeout_s": 7.5, "eject_s": 0.25, "upstream_keepalive_s": 3.0,
    "kubernetes_namespace": "ns1", "prefill": ("http://a:1", "http://b:2"), "decode": ("http://c:3",),
    "kv_events": (("http://a:1", "tcp://a:5557,tcp://a:5558"),),
    "prompt_cache_max_bytes": 4096, "disaggregation_policy": "Conditional", "min_remote_prefill_tokens": 512,
    "prefill_busy_in_flight": 2, "prefix_tier_weights": (("GPU", 1.0), ("CPU", 0.5), ("STORAGE", 0.0)), "kubernetes_fleet_uid": "0d7c-uid", "kv_events_max_total_bytes": 64 * 2**20,
    "scale_to_zero_max_waiting": 100, "scale_to_zero_activation_timeout_s": 30.0,
    "scale_to_zero_max_waiting_bytes": 2**20, "decode_reuse_min_tokens": 256,
    "flow_control": FlowControlConfig(enabled=True, max_queued=5, priorities=(Priority("hi", 4), Priority("lo", 1))),
}
STATIC = RouterConfig(prefill=("http://p:1",), decode=("http://d:1",))
K8S = RouterConfig(kubernetes_fleet="f1", kubernetes_namespace="ns")


@pytest.mark.parametrize("name", [n for n in FLAGGED if n != "kubernetes_fleet"])
def test_every_flag_round_trips(name):
    base = K8S if name in ("kubernetes_namespace", "kubernetes_fleet_uid") else STATIC
    cfg = replace(base, **{name: VARIANTS[name]})
    assert cfg != base  # the variant is a real change (or this test would prove nothing)
    assert parse_argv(cfg.to_argv()) == cfg
    assert cli_parses(cfg.to_argv()) == cfg


def test_every_flag_has_a_variant():
    assert set(FLAGGED) - {"kubernetes_fleet"} == set(VARIANTS)


def test_kubernetes_config_round_trips_and_names_its_namespace():
    cfg = replace(K8S, kubernetes_namespace="default")
    argv = cfg.to_argv()
    assert argv[argv.index("--namespace") + 1] == "default"  # rendered although it is the default
    assert parse_argv(argv, env={"POD_NAMESPACE": "other"}) == cfg


def test_fields_without_a_flag_refuse_to_render():
    with pytest.raises(ValueError, match="forward_headers"):
        replace(STATIC, forward_headers=("x",)).to_argv()


def test_a_mismatch_is_caught():
    """Negative control: a parser that drops one flag no longer round-trips."""
    cfg = replace(STATIC, lease_margin_s=2.5)
    argv = cfg.to_argv()
    i = argv.index("--lease-margin-s")
    assert parse_argv(argv[:i] + argv[i + 2:]) != cfg


def test_the_old_revision_flag_is_accepted_and_ignored():
    assert cli_parses(["--kubernetes", "--fleet", "f1", "--namespace", "ns", "--revision", "abc"]) == K8S
