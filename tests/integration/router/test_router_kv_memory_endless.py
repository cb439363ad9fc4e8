"""Issue 31: a KV-event message that never ends cannot grow the router past its budget.

A publisher that speaks ZMTP itself (as any peer on the network may: a libzmq PUB never sends a
message before its last frame) starts a multipart message and never finishes it: 1 MiB frames with
MORE set, 256 KiB frames, 160 MiB in all. libzmq bounds frames (ZMQ_MAXMSGSIZE) and counts its high-water mark in
whole messages, so a libzmq SUB socket buffers such a message without limit. A real `pdfleet router`
process with `--kv-events-max-total-bytes 16 MiB` reads frames itself (kvaware/zmtp.py): it refuses the
message at its bound (here its fourth frame: a batch has three), counts it dropped and drops the
connection; its peak RSS grows by
less than the budget. Negative control: the same publisher feeding a process that holds a libzmq SUB
socket set up as the router's was before (RCVHWM, MAXMSGSIZE) grows it by more than half the flood."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import aiohttp
import pytest
from test_router_kv_memory_total import free_port, peak_rss_mib

from pdfleet.connector.serving.kvaware import kv_subscriber as ks
from pdfleet.connector.serving.kvaware import zmtp
from pdfleet.connector.serving.kvaware.kv_events import MAX_MESSAGE_BYTES

pytestmark = pytest.mark.timeout(180)

MiB = 2**20
BUDGET = 16 * MiB
FLOOD_MIB = 160


class EndlessPublisher:
    """A ZMTP 3.0 PUB, written by hand, that answers every subscriber with one message that never ends."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.endpoint = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.sent_mib = 0
        self.go = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        frame = MiB // 4  # each frame under any per-frame bound (ZMQ_MAXMSGSIZE): only the message is endless
        chunk = (zmtp.frame_header(frame, more=True) + b"\x91" * frame) * 4
        while not self.stop.is_set() and self.sent_mib < FLOOD_MIB:
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    conn.sendall(zmtp.greeting())
                    conn.recv(64)
                    conn.sendall(zmtp.ready("PUB"))
                    while not self.go.wait(0.1):  # until the test has its baseline
                        if self.stop.is_set():
                            return
                    conn.sendall(zmtp.frame_header(0, more=True) + zmtp.frame_header(8, more=True) + bytes(8))
                    while not self.stop.is_set() and self.sent_mib < FLOOD_MIB:
                        conn.sendall(chunk)
                        self.sent_mib += 1
                        time.sleep(0.005)
                except OSError:
                    continue  # the subscriber dropped us: serve the next connection the same way

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.server.close()


async def growth_while_flooded(pid: int, ready, pub: EndlessPublisher, seconds: float) -> float:
    await ready()
    await asyncio.sleep(1.5)  # the subscriber connects
    baseline = peak_rss_mib(pid)
    pub.go.set()
    deadline = time.monotonic() + seconds
    while pub.sent_mib < FLOOD_MIB and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # what is in flight arrives
    return peak_rss_mib(pid) - baseline


async def dropped(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("pdfleet_router_kv_events_dropped_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            out[reason] = out.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    return out


async def test_an_endless_multipart_message_holds_the_router_under_its_budget():
    pub = EndlessPublisher()
    port = free_port()
    engine = "http://127.0.0.1:11"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.operator.cli", "router", "--port", str(port), "--prefill", engine,
         "--decode", "http://127.0.0.1:9", "--kv-events", f"{engine}={pub.endpoint}",
         "--event-loop", "asyncio", "--log-level", "ERROR", "--kv-events-max-total-bytes", str(BUDGET)],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as session:
            async def ready() -> None:
                for _ in range(300):
                    await asyncio.sleep(0.1)
                    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/health") as r:
                            if engine in (await r.json())["prefix_routing"]["streams"]:
                                return
                    except aiohttp.ClientError:
                        continue
                raise AssertionError("the router never subscribed")

            # the router drops each connection at its bound and reconnects after a backoff: 15 s see several
            growth = await growth_while_flooded(proc.pid, ready, pub, 15.0)
            drops = await dropped(session, port)
    finally:
        proc.kill()
        proc.wait(10)
        pub.close()
    print(f"endless message ({pub.sent_mib} MiB sent): router peak RSS +{growth:.1f} MiB under a "
          f"{BUDGET // MiB} MiB budget; dropped {drops}")
    # refused at a bound (a fourth frame, or the bytes), and counted
    assert drops.get("frames", 0) + drops.get("oversized", 0) >= 1, drops
    assert growth < BUDGET / MiB, growth


_LIBZMQ_SUB = textwrap.dedent("""
    import sys, time, zmq
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, int(sys.argv[2]))
    sub.setsockopt(zmq.MAXMSGSIZE, int(sys.argv[3]))
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(sys.argv[1])
    print("ready", flush=True)
    time.sleep(600)
""")


async def test_negative_control_a_libzmq_sub_socket_buffers_the_endless_message():
    budget = ks.plan_budget(1, total_bytes=BUDGET, max_bytes=MAX_MESSAGE_BYTES, index_max_blocks=10**6)
    pub = EndlessPublisher()
    # the socket options the router's SUB had before issue 31 (per-frame bound, HWM in messages)
    proc = subprocess.Popen([sys.executable, "-c", _LIBZMQ_SUB, pub.endpoint, str(budget.depth),
                             str(budget.max_bytes + 64 * 1024)], stdout=subprocess.PIPE, text=True)
    try:
        async def ready() -> None:
            assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "ready"

        growth = await growth_while_flooded(proc.pid, ready, pub, 60.0)
    finally:
        proc.kill()
        proc.wait(10)
        pub.close()
    print(f"endless message ({pub.sent_mib} MiB sent): a libzmq SUB's peak RSS +{growth:.0f} MiB")
    assert growth > FLOOD_MIB / 2, growth
