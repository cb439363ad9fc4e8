"""A local fleet starts even when a port it chose is taken before the engine binds it (issue 31).

The runner's own start-up path (LocalRunner: _start, _wait_healthy) with real processes, kept light: each
engine is a small Python process that does what the engine does with its ports, no vLLM. It binds the
connector's real side channel (pdfleet.connector.transfer.sidechannel.SideChannelServer, the code that
failed with ``cannot bind the side channel on 127.0.0.1:PORT: Address already in use``) on the port in
VLLM_NIXL_SIDE_CHANNEL_PORT, then serves /health on its ``--port``. The test takes prefill-0's
side-channel port (or its HTTP port) before the fleet starts: the runner restarts that engine on new
ports under --max-restarts and every engine becomes healthy; with --max-restarts 0 the start fails, naming
the taken port (negative control). Restarts after the fleet was announced keep their ports (the router and
the decodes know them); only a start that failed on a port moves."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest
import zmq

from pdfleet.contract import env as env_names
from pdfleet.operator.api import parse
from pdfleet.operator.local.command import add_arguments
from pdfleet.operator.local.runner import LocalRunner
from pdfleet.operator.local.fleet import EnginePorts, plan_local
from pdfleet.operator.local.processes import Watchdog, reserve_ports

pytestmark = pytest.mark.timeout(120)

ENGINE = textwrap.dedent("""
    import http.server, os, sys
    from pdfleet.connector.transfer.sidechannel import SideChannelServer

    port = int(sys.argv[sys.argv.index("--port") + 1])
    side = int(os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"])
    SideChannelServer("127.0.0.1", side, secret=None, handler=lambda request: request).start()
    print(f"side channel on {side}", flush=True)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def runner(tmp_path: Path, max_restarts: int) -> LocalRunner:
    resource = parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                      "metadata": {"name": "t"},
                      "spec": {"model": {"name": "m"}, "engine": {"blockSize": 32},
                               "kvTransfer": {"bufferDevice": "cpu"}}})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["-f", str(tmp_path / "unused.yaml"), "--run-dir", str(tmp_path / "run"),
                              "--state-file", str(tmp_path / "state.json"), "--max-restarts", str(max_restarts),
                              "--startup-timeout", "60"])
    r = LocalRunner(resource, args)
    r.run_dir.mkdir(parents=True)
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    http = reserve_ports(2)
    side = reserve_ports(2, taken=http)
    ports = {"prefill": [EnginePorts(http[0], side[0])], "decode": [EnginePorts(http[1], side[1])]}
    plan = plan_local(resource.spec, revision="r", model_path="/m", cpus=[0, 1], ports=ports, base_env={})
    for launch in plan.engines:  # the plan's ports and env, a light process instead of vLLM
        port = launch.argv[launch.argv.index("--port") + 1]
        r.launches[launch.name] = dataclasses.replace(
            launch, argv=(sys.executable, str(script), "--port", port),
            env={env_names.SIDE_CHANNEL_PORT: launch.env[env_names.SIDE_CHANNEL_PORT]})
        r.restarts[launch.name] = 0
    return r


async def start(r: LocalRunner) -> bool:
    r.watchdog = Watchdog(cwd=r.run_dir)
    for name in r.launches:
        r._start(name)
    return await r._wait_healthy()


def take(port: int) -> zmq.Socket:
    """Another program binds the port first (as vLLM's own ZMQ sockets did)."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    return sock


@pytest.mark.parametrize("which", ["side_channel", "http"])
@pytest.mark.parametrize("max_restarts,starts", [(1, True), (0, False)])
def test_an_engine_whose_port_is_taken_starts_again_on_new_ports(
        tmp_path: Path, capsys, max_restarts: int, starts: bool, which: str) -> None:
    r = runner(tmp_path, max_restarts)
    before = r.launches["prefill-0"].ports
    taken_port = getattr(before, which)
    thief = take(taken_port)
    try:
        ok = asyncio.run(start(r))
        err = capsys.readouterr().err
        assert ok is starts, err
        if starts:
            moved = r.launches["prefill-0"]
            assert r.restarts == {"prefill-0": 1, "decode-0": 0}
            # both of its ports are new (the old ones may be taken by the same program), in its argv and env
            assert moved.ports.side_channel not in (before.side_channel, before.http)
            assert moved.ports.http not in (before.side_channel, before.http)
            assert moved.env[env_names.SIDE_CHANNEL_PORT] == str(moved.ports.side_channel)
            assert moved.argv[moved.argv.index("--port") + 1] == str(moved.ports.http)
            assert moved.url.endswith(f":{moved.ports.http}")
            assert (f"(http {before.http}, side channel {before.side_channel}) was taken; restarting on "
                    f"http {moved.ports.http}, side channel {moved.ports.side_channel}") in err
            state = json.loads((tmp_path / "state.json").read_text())
            engines = {e["name"]: e for e in state["engines"]}
            assert engines["prefill-0"]["side_channel_port"] == moved.ports.side_channel
            assert engines["prefill-0"]["url"] == moved.url
            # the engine really listens on its new ports now (a bind there fails)
            for port in (moved.ports.side_channel, moved.ports.http):
                with socket.socket() as s, pytest.raises(OSError):
                    s.bind(("127.0.0.1", port))
        else:
            assert "--max-restarts 0 spent" in err
            if which == "side_channel":
                assert f"cannot bind the side channel on 127.0.0.1:{taken_port}" in err
            else:
                assert "Address already in use" in err
    finally:
        thief.close()
        asyncio.run(r._shutdown())
