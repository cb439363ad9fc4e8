"""The plan's part in KV-cache-aware routing: every engine publishes KV events on named ports,
the router gets the policies and the engines' hashing settings, and `pdfleet local` does the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdfleet.connector.router.command import add_arguments, config_from_args
from pdfleet.connector.serving.discovery import parse_slice
from pdfleet.operator.api import InvalidResource, parse
from pdfleet.operator.local.fleet import EnginePorts, kv_events_endpoints, plan_local
from pdfleet.operator.plan import plan
from pdfleet.operator.rollout.paired import Endpoint

ROOT = Path(__file__).resolve().parents[3]


def load(name="gpu-rdma"):
    return yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())


def arg(args, flag):
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_every_engine_publishes_kv_events_on_named_ports(example):
    objs = plan(load(example))
    for sts in (o for o in objs if o["kind"] == "StatefulSet"):
        c = sts["spec"]["template"]["spec"]["containers"][0]
        events = json.loads(arg(c["args"], "--kv-events-config"))
        assert events == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
                          "replay_endpoint": "tcp://*:5558"}
        assert arg(c["args"], "--prefix-caching-hash-algo") == "sha256_cbor"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["kv-events"] == 5557 and ports["kv-events-replay"] == 5558
    for svc in (o for o in objs if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None"):
        named = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
        assert named["kv-events"] == (5557, "kv-events") and named["kv-events-replay"] == (5558, "kv-events-replay")


def test_network_policy_lets_the_router_reach_the_event_ports():
    (netpol,) = [o for o in plan(load("gpu-rdma")) if o["kind"] == "NetworkPolicy"]
    ports = {p["port"] for p in netpol["spec"]["ingress"][0]["ports"]}
    assert {5557, 5558} <= ports


@pytest.mark.parametrize("router, env, expected", [
    ({}, [], ("prefixAware", "prefixAware", "vllm-none-hash")),
    ({"prefillPolicy": "leastOutstanding"}, [], ("leastOutstanding", "prefixAware", "vllm-none-hash")),
    ({"decodePolicy": "leastOutstanding"}, [{"name": "PYTHONHASHSEED", "value": "7"}],
     ("prefixAware", "leastOutstanding", "7")),
])
def test_router_gets_policies_and_the_engines_hashing(router, env, expected):
    cr = load()
    cr["spec"]["router"] = {**cr["spec"].get("router", {}), **router}
    cr["spec"].setdefault("engine", {})["env"] = env
    (dep,) = [o for o in plan(cr) if o["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert (arg(args, "--prefill-policy"), arg(args, "--decode-policy"), arg(args, "--hash-seed")) == expected
    assert arg(args, "--block-size") == str(parse(cr).spec.engine.block_size)
    assert arg(args, "--tokenizer") == cr["spec"]["model"]["name"]
    # the arguments the plan writes are ones the router accepts
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    config = config_from_args(p.parse_args(args[1:]))
    assert (config.prefill_policy, config.decode_policy, config.hash_seed) == expected


@pytest.mark.parametrize("patch, field", [
    ({"router": {"prefillPolicy": "roundRobin"}}, "spec.router.prefillPolicy"),
    ({"router": {"decodePolicy": "prefix"}}, "spec.router.decodePolicy"),
    ({"engine": {"port": 5557}}, "spec.kvTransfer.sideChannelPort"),
    ({"kvTransfer": {"sideChannelPort": 5558}}, "spec.kvTransfer.sideChannelPort"),
    ({"engine": {"extraArgs": ["--kv-events-config", "{}"]}}, "spec.engine.extraArgs"),
])
def test_bad_policies_and_port_clashes_are_refused_naming_the_field(patch, field):
    cr = load()
    for key, value in patch.items():
        cr["spec"][key] = {**cr["spec"].get(key, {}), **value}
    with pytest.raises(InvalidResource) as exc:
        parse(cr)
    assert any(str(e).startswith(field) for e in exc.value.errors), exc.value.errors


def test_status_endpoint_names_the_event_port():
    e = Endpoint("f-prefill-r-0", "10.0.0.7", 5600, 8000, "r", 5557)
    assert e.as_status()["kvEventsPort"] == 5557
    assert "kvEventsPort" not in Endpoint("p", "ip", 1, 2, "r").as_status()


def test_discovery_reads_the_event_ports_from_the_slice():
    obj = {
        "metadata": {"labels": {"pdfleet.io/fleet": "f", "pdfleet.io/role": "prefill", "pdfleet.io/revision": "r"}},
        "ports": [{"name": "http", "port": 8000}, {"name": "kv-events", "port": 5557},
                  {"name": "kv-events-replay", "port": 5558}],
        "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}],
    }
    (ep,) = parse_slice(obj, "f", "http").endpoints
    assert (ep.url, ep.kv_events, ep.kv_events_replay) == (
        "http://10.0.0.7:8000", "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")


def test_local_engines_publish_on_local_sockets():
    spec = parse(load("tiny-cpu")).spec
    ports = {role: [EnginePorts(8100 + i, 5600, *kv_events_endpoints("/run", f"{role}-0"))] for i, role in
             enumerate(("prefill", "decode"))}
    lp = plan_local(spec, revision="r", model_path="/m", cpus=[0, 1], ports=ports, base_env={})
    for e in lp.engines:
        events = json.loads(arg(list(e.argv), "--kv-events-config"))
        assert events["endpoint"] == f"ipc:///run/{e.name}.kv-events"
        assert events["replay_endpoint"] == f"ipc:///run/{e.name}.kv-events-replay"
