"""`pdfleet router` as a real process in front of fake engines; clean exit on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import subprocess
import sys

import pytest
from waits import http_ok, until

from pdfleet.connector.router import command

pytestmark = pytest.mark.timeout(60)


def parse(argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_become_config(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    args = parse(["--kubernetes", "--fleet", "f1", "--max-body-bytes", "10", "--prefill-attempts", "3",
                  "--decode-idle-timeout-s", "7.5"])
    cfg = command.config_from_args(args)
    assert (cfg.kubernetes_fleet, cfg.kubernetes_namespace) == ("f1", "serving")
    assert (cfg.max_body_bytes, cfg.prefill_attempts, cfg.decode_idle_timeout_s) == (10, 3, 7.5)
    cfg = command.config_from_args(parse(["--prefill", "http://a:1", "--prefill", "http://b:2", "--decode", "http://c:3"]))
    assert cfg.prefill == ("http://a:1", "http://b:2") and cfg.decode == ("http://c:3",)


@pytest.mark.parametrize("argv, needle", [
    (["--prefill", "a:1", "--decode", "http://c:3"], "must start with http://"),
    (["--kubernetes"], "--kubernetes needs --fleet"),
    (["--kubernetes", "--fleet", "f", "--prefill", "http://a:1"], "exclude each other"),
    (["--prefill", "http://a:1"], "prefill/decode"),
])
def test_bad_flags_exit_2_naming_the_field(capsys, monkeypatch, argv, needle):
    monkeypatch.delenv("PDFLEET_FLEET", raising=False)
    assert command.run(parse(argv)) == 2
    assert needle in capsys.readouterr().err


async def test_router_process_serves_and_stops_on_sigterm(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "pdfleet.operator.cli", "router", "--port", str(port),
                             "--prefill", p.url, "--decode", d.url, "--log-level", "WARNING"],
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        await until(lambda: http_ok(fleet.session, url + "/health"), "the router's /health", timeout=10.0)
        async with fleet.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x"},
                                      headers={"X-Request-Id": "cli-1"}) as r:
            assert r.status == 200
            assert (await r.json())["kv_seen"]["remote_engine_id"] == "p0"
        assert [x.headers["X-Request-Id"] for x in p.received + d.received] == ["cli-1", "cli-1"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_operator_plan_arguments_parse():
    """The argument shape an operator from before the serving label gave the router: --revision is ignored."""
    from pdfleet.operator.cli import build_parser

    argv = ["router", "--host", "0.0.0.0", "--port", "8000", "--kubernetes", "--namespace", "serving",
            "--fleet", "f1", "--revision", "abcdef0123"]
    parser, module = build_parser(argv)
    cfg = module.config_from_args(parser.parse_args(argv))
    assert (cfg.kubernetes_fleet, cfg.kubernetes_namespace, cfg.host) == ("f1", "serving", "0.0.0.0")
