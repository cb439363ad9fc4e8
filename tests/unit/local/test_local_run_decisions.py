"""The pure decisions of `pdfleet local`'s run (runner.py's helpers): which ports a moved engine must
avoid, the in-process router's configuration, the state file's content, the exit code after a stop,
the smoke verdict and the warm-up's line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pdfleet.contract.routing import DISAGGREGATION_CONDITIONAL, LEAST_OUTSTANDING
from pdfleet.operator.api import parse
from pdfleet.operator.local.console import EXIT_FAILED, EXIT_OK, exit_code_after_stop
from pdfleet.operator.local.fleet import EngineLaunch, EnginePorts, fleet_ports, plan_local, router_config
from pdfleet.operator.local.run_state import fleet_state
from pdfleet.operator.local.smoke import SmokeRequest, SmokeResult, clip, result_line, verdict
from pdfleet.operator.local.warmup import WarmResult, summary_line
from pdfleet.operator.plan import router as cluster_router
from pdfleet.operator.plan.meta import Context


def spec(**router):
    return parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
                  "spec": {"model": {"name": "m"}, "engine": {"blockSize": 32}, "kvTransfer": {"bufferDevice": "cpu"},
                           "prefill": {"replicas": 2}, "decode": {"replicas": 1}, "router": router}}).spec


def launch(name: str, http: int, side: int, tp: int = 1, kv_events: str | None = None) -> EngineLaunch:
    role = name.split("-")[0]
    return EngineLaunch(name=name, role=role, index=0, argv=("--port", str(http)), env={},
                        ports=EnginePorts(http, side, kv_events, kv_events and kv_events + "-replay"),
                        cpus=tuple((k,) for k in range(tp)))


@pytest.mark.parametrize("launches, ports", [
    ([], set()),
    ([launch("prefill-0", 10000, 20000)], {10000, 20000}),
    # each TP rank has its own side-channel port
    ([launch("prefill-0", 10000, 20000, tp=2), launch("decode-0", 10001, 20002, tp=4)],
     {10000, 20000, 20001, 10001, 20002, 20003, 20004, 20005}),
])
def test_fleet_ports_are_every_http_and_side_channel_port(launches, ports):
    assert fleet_ports(launches) == ports


def planned(s, kv_events: bool):
    ports = {"prefill": [EnginePorts(9000, 9100, *(("ipc://p0", "ipc://p0r") if kv_events else ())),
                         EnginePorts(9001, 9101)],
             "decode": [EnginePorts(9002, 9102, *(("ipc://d0", "ipc://d0r") if kv_events else ()))]}
    return plan_local(s, revision="r", model_path="/m", cpus=[0, 1, 2], ports=ports, base_env={}).engines


@pytest.mark.parametrize("kv_events, model_path, events, tokenizer", [
    (True, "/cache/tiny", (("http://127.0.0.1:9000", "ipc://p0,ipc://p0r"),
                           ("http://127.0.0.1:9002", "ipc://d0,ipc://d0r")), "/cache/tiny"),
    (False, None, (), "m"),  # no generated model: the spec's model names the tokenizer
])
def test_router_config_serves_the_local_engines(kv_events, model_path, events, tokenizer):
    config = router_config(spec(), planned(spec(), kv_events), model_path)
    assert config.prefill == ("http://127.0.0.1:9000", "http://127.0.0.1:9001")
    assert config.decode == ("http://127.0.0.1:9002",)
    assert config.kv_events == events
    assert config.tokenizer == tokenizer


@pytest.mark.parametrize("router", [
    {},
    {"prefillPolicy": LEAST_OUTSTANDING, "decodePolicy": LEAST_OUTSTANDING,
     "disaggregation": {"policy": DISAGGREGATION_CONDITIONAL, "minRemotePrefillTokens": 64},
     "flowControl": {"enabled": True}},
])
def test_the_local_router_routes_as_the_fleets_router_pod(router):
    s = spec(**router)
    local = router_config(s, planned(s, False), None)
    pod = cluster_router.router_config(Context("t", "ns", "r", "img"), s)
    fields = ("prefill_policy", "decode_policy", "block_size", "hash_seed", "flow_control",
              "disaggregation_policy", "min_remote_prefill_tokens", "prefill_busy_in_flight")
    assert {f: getattr(local, f) for f in fields} == {f: getattr(pod, f) for f in fields}
    if router:  # negative control: the settings reached the config (the defaults would not compare equal)
        assert local.prefill_policy == LEAST_OUTSTANDING and local.flow_control.enabled


def child(pid: int, log: str) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, pgid=pid, log_path=Path(log))


@pytest.mark.parametrize("started, watchdog_pid, kv, conditions", [
    ([], None, {}, []),  # before any engine starts (the preflight's state)
    (["prefill-0"], 7, {"type": "KVTransport", "status": "True"}, [{"type": "KVTransport", "status": "True"}]),
    (["prefill-0", "decode-0"], 7, {}, []),
])
def test_the_state_file_lists_the_started_engines(started, watchdog_pid, kv, conditions):
    launches = {"prefill-0": launch("prefill-0", 9000, 9100, tp=2, kv_events="ipc://p"),
                "decode-0": launch("decode-0", 9001, 9102)}
    children = {name: child(100 + i, f"/run/{name}.log") for i, name in enumerate(started)}
    state = fleet_state(runner_pid=1, healthy=False, router=None, run_dir=Path("/run"), watchdog_pid=watchdog_pid,
                        kv_transport=kv, launches=launches, children=children,
                        restarts={"prefill-0": 2, "decode-0": 0})
    assert {k: state[k] for k in ("runner_pid", "healthy", "router", "run_dir", "watchdog_pid", "conditions")} == {
        "runner_pid": 1, "healthy": False, "router": None, "run_dir": "/run", "watchdog_pid": watchdog_pid,
        "conditions": conditions}
    assert [e["name"] for e in state["engines"]] == started
    if "prefill-0" in started:
        assert state["engines"][0] == {
            "name": "prefill-0", "role": "prefill", "pid": 100, "pgid": 100, "url": "http://127.0.0.1:9000",
            "side_channel_port": 9100, "kv_events": "ipc://p", "cpus": [[0], [1]], "log": "/run/prefill-0.log",
            "restarts": 2}


@pytest.mark.parametrize("reason, code", [
    ("SIGINT", EXIT_OK), ("SIGTERM", EXIT_OK),
    ("prefill-0 exited 4 times", EXIT_FAILED), ("", EXIT_FAILED), ("SIGKILL", EXIT_FAILED),
])
def test_exit_code_after_stop(reason, code):
    assert exit_code_after_stop(reason) == code


@pytest.mark.parametrize("passed, total, moved, ok, lines", [
    (4, 4, 256.0, True, ["smoke: 4/4 requests passed, 256 prompt tokens moved by KV transfer -> PASS"]),
    (3, 4, 256.0, False, ["smoke: 3/4 requests passed, 256 prompt tokens moved by KV transfer -> FAIL"]),
    (4, 4, 0.0, False, ["smoke: decode received no prompt tokens by KV transfer",
                        "smoke: 4/4 requests passed, 0 prompt tokens moved by KV transfer -> FAIL"]),
    (2, 4, -1.0, False, ["smoke: decode received no prompt tokens by KV transfer",  # a counter reset meanwhile
                         "smoke: 2/4 requests passed, -1 prompt tokens moved by KV transfer -> FAIL"]),
])
def test_smoke_verdict(passed, total, moved, ok, lines):
    assert verdict(passed, total, moved) == (ok, lines)


@pytest.mark.parametrize("body, result, line", [
    ({"prompt": "The river runs"}, SmokeResult("completion", True, " on"), "P/D completion: 'The river runs' -> ' on' [ok]"),
    ({"messages": [{"role": "user", "content": "Hi"}]}, SmokeResult("chat", False, "", "HTTP 500: x"),
     "P/D chat: 'Hi' -> '' [FAILED: HTTP 500: x]"),
    ({"prompt": "w" * 61}, SmokeResult("long", True, "t"), f"P/D long: '{'w' * 57}...' -> 't' [ok]"),
])
def test_smoke_result_line(body, result, line):
    assert result_line(SmokeRequest(result.label, "/v1/completions", body), result) == line


@pytest.mark.parametrize("text, clipped", [("", ""), ("a" * 60, "a" * 60), ("a" * 61, "a" * 57 + "...")])
def test_clip(text, clipped):
    assert clip(text) == clipped and len(clip(text)) <= 60


@pytest.mark.parametrize("result, line", [
    (WarmResult(pairs=2, answered=2, pulled=2, seconds=0.44), "warm-up: 2/2 P/D requests answered, 2 KV pulls, 0.4s"),
    (WarmResult(pairs=4, answered=0, pulled=0, seconds=60.0, errors=("a", "b", "c", "d")),
     "warm-up: 0/4 P/D requests answered, 0 KV pulls, 60.0s; 4 failed: a; b; c"),
])
def test_warmup_summary_line(result, line):
    assert summary_line(result) == line

