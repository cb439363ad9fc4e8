"""/metrics names no pod address (issue 20 row 8): `pdfleet router` as a real process in front of fake
engines and a real ZMQ KV-event publisher; every label value of a scrape is checked."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import subprocess
import sys

import msgspec
import pytest
import zmq
from waits import http_ok, until
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.connector.serving.metrics import RouterMetrics

pytestmark = pytest.mark.timeout(60)

_URLISH = re.compile(r"://|\[[0-9a-fA-F:]+\]|\b\d{1,3}(?:\.\d{1,3}){3}\b")


def addresses_in_labels(text: str, ports: set[int]) -> list[tuple[str, str, str]]:
    """(sample, label, value) of every label value that holds a URL, an IP address or an engine port."""
    found = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for k, v in s.labels.items():
                if k == "le":
                    continue
                try:
                    ipaddress.ip_address(v)
                    is_ip = True
                except ValueError:
                    is_ip = False
                if is_ip or _URLISH.search(v) or any(re.search(rf"(?<!\d){p}(?!\d)", v) for p in ports):
                    found.append((s.name, k, v))
    return found


def test_the_check_finds_an_address_label():
    """Negative control: series labelled as before this change are caught."""
    m = RouterMetrics()
    m.in_flight.labels("prefill", "http://10.0.3.7:8000").inc()
    m.kv_index_blocks.labels("http://[fd00::7]:8000").set(1)
    m.kv_events_received.labels("prefill-0").inc()
    found = addresses_in_labels(generate_latest(m.registry).decode(), {8000})
    assert {(n, v) for n, _, v in found} == {("pdfleet_router_in_flight", "http://10.0.3.7:8000"),
                                             ("pdfleet_router_kv_index_blocks", "http://[fd00::7]:8000")}
    assert addresses_in_labels('x{endpoint="decode-1"} 1\n', {8000}) == []
    assert addresses_in_labels('x{endpoint="10.0.0.1"} 1\n', set()) != []
    assert addresses_in_labels('x{endpoint="pod-a:31234"} 1\n', {31234}) != []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_router_process_metrics_carry_no_pod_address(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pdfleet.operator.cli", "router", "--port", str(port),
                             "--prefill", p.url, "--decode", d.url, "--block-size", "4",
                             "--kv-events", f"{p.url}=tcp://127.0.0.1:{pub_port}", "--log-level", "WARNING"],
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        await until(lambda: http_ok(fleet.session, url + "/health"), "the router's /health", timeout=10.0)
        for i in range(3):
            async with fleet.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": f"x{i}"}) as r:
                assert r.status == 200
        event = {"type": "BlockStored", "block_hashes": [1, 2, 3], "medium": "GPU", "group_idx": 0}
        text = ""
        for seq in range(200):  # until the subscriber (connected at some point) has applied a batch
            pub.send_multipart([b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([1.0, [event], 0])])
            async with fleet.session.get(url + "/metrics") as r:
                text = await r.text()
            if 'pdfleet_router_kv_events_received_total{endpoint="prefill-0"}' in text:
                break
            await asyncio.sleep(0.05)
        engine_ports = {int(e.url.rsplit(":", 1)[1]) for e in (p, d)} | {pub_port}
        assert addresses_in_labels(text, engine_ports) == []
        # the series are still there, under the endpoints' names
        assert 'pdfleet_router_in_flight{endpoint="prefill-0",role="prefill"} 0.0' in text
        assert 'pdfleet_router_in_flight{endpoint="decode-0",role="decode"} 0.0' in text
        # where each of the 3 requests went (P/D, Always): one leg each on the prefill and on the decode
        assert 'pdfleet_router_legs_started_total{endpoint="prefill-0",role="prefill"} 3.0' in text
        assert 'pdfleet_router_legs_started_total{endpoint="decode-0",role="decode"} 3.0' in text
        assert 'pdfleet_router_kv_events_received_total{endpoint="prefill-0"}' in text
        assert 'pdfleet_router_kv_index_blocks{endpoint="prefill-0"} 3.0' in text
        assert "127.0.0.1" not in text
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pub.close(0)
        ctx.term()
