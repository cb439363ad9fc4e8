"""The /health wait: healthy when a real HTTP server answers 200, gives up on a dead process or a deadline."""

from __future__ import annotations

import http.server
import threading

import pytest

from pdfleet.operator.local.health import NotHealthy, healthy, wait_healthy
from pdfleet.operator.local.processes import reserve_ports


@pytest.fixture
def server():
    status = {"code": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", status
    srv.shutdown()


def test_healthy_only_on_200(server):
    url, status = server
    assert not healthy(url)
    status["code"] = 200
    assert healthy(url)
    assert not healthy(f"http://127.0.0.1:{reserve_ports(1)[0]}")  # nothing listens


def test_wait_returns_once_healthy(server):
    url, status = server
    probes = []

    def sleep(_):
        probes.append(1)
        if len(probes) == 2:
            status["code"] = 200

    assert wait_healthy(url, sleep=sleep, timeout=60) >= 0
    assert len(probes) == 2


def test_wait_gives_up_on_a_dead_process_and_on_the_deadline(server):
    url, _ = server
    with pytest.raises(NotHealthy, match="exited"):
        wait_healthy(url, alive=lambda: False)
    now = iter(range(100))
    with pytest.raises(NotHealthy, match="not healthy after 3s"):
        wait_healthy(url, timeout=3, sleep=lambda _: None, clock=lambda: float(next(now)))
