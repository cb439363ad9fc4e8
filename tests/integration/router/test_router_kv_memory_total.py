"""Issue 20: the router's KV-event memory is bounded in total, across publishers, not only per publisher.

Six real ZMQ publishers flood a real `pdfleet router` process with valid batches as large as it accepts,
faster than it applies them, so its ZMQ queues fill. With `--kv-events-max-total-bytes 128 MiB` the
peak RSS grows by at most that budget's queue half plus one decoded batch; the same flood against a
router whose total is effectively unbounded (8 GiB: per-publisher bounds only, as before) grows it
several times more, which shows the flood does fill the queues (negative control)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import aiohttp
import msgspec
import pytest
import zmq

from pdfleet.connector.serving.kvaware import kv_subscriber as ks
from pdfleet.connector.serving.kvaware.kv_events import MAX_MESSAGE_BYTES
from ports import free_port  # noqa: F401 (also imported from here by this folder's tests)

pytestmark = pytest.mark.timeout(300)

PUBLISHERS = 6
MiB = 2**20


def batch(nbytes: int) -> bytes:
    """A valid batch of about ``nbytes`` (BlockStored events of 65,536 hashes; the same hashes every time)."""
    per_event = 65_536
    events = []
    size, start = 0, 2**40
    while size + per_event * 9 < nbytes:
        events.append({"type": "BlockStored", "block_hashes": list(range(start, start + per_event)), "medium": "GPU",
                       "group_idx": 0})
        size, start = size + per_event * 9, start + per_event
    rest = max(1, (nbytes - size - 200) // 9)
    events.append({"type": "BlockStored", "block_hashes": list(range(start, start + rest)), "medium": "GPU",
                   "group_idx": 0})
    data = msgspec.msgpack.encode([1.0, events, 0])
    while len(data) > nbytes:  # per-event overhead: trim the last event
        del events[-1]["block_hashes"][-((len(data) - nbytes) // 9 + 1):]
        data = msgspec.msgpack.encode([1.0, events, 0])
    return data


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")



async def flood_growth(total_bytes: int, message_bytes: int, enough_mib: float = float("inf")) -> float:
    """Peak RSS growth (MiB) of a router process while six publishers flood it with ``message_bytes`` batches
    for 6 s, or until the growth passes ``enough_mib``."""
    ctx = zmq.Context()
    pubs = []
    for _ in range(PUBLISHERS):
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 2)  # the test process must not buffer the flood itself
        pubs.append((pub, pub.bind_to_random_port("tcp://127.0.0.1")))
    port = free_port()
    engines = [f"http://127.0.0.1:{10 + i}" for i in range(PUBLISHERS)]
    argv = [sys.executable, "-m", "pdfleet.operator.cli", "router", "--port", str(port), "--decode", "http://127.0.0.1:9",
            "--event-loop", "asyncio", "--log-level", "ERROR", "--kv-events-max-total-bytes", str(total_bytes)]
    for e, (_, p) in zip(engines, pubs):
        argv += ["--prefill", e, "--kv-events", f"{e}=tcp://127.0.0.1:{p}"]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    data = batch(message_bytes)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                await asyncio.sleep(0.1)
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as r:
                        if len((await r.json())["prefix_routing"]["streams"]) == PUBLISHERS:
                            break
                except aiohttp.ClientError:
                    continue
            else:
                raise AssertionError("the router never subscribed to every publisher")
            await asyncio.sleep(1.5)  # the SUB sockets connect
            baseline = peak_rss_mib(proc.pid)
            stop = threading.Event()

            def flood(pub):
                seq = 0
                while not stop.is_set():
                    try:
                        pub.send_multipart([b"", seq.to_bytes(8, "big"), data], zmq.NOBLOCK)
                        seq += 1
                    except zmq.Again:
                        time.sleep(0.005)

            threads = [threading.Thread(target=flood, args=(p,), daemon=True) for p, _ in pubs]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline and peak_rss_mib(proc.pid) - baseline <= enough_mib:
                await asyncio.sleep(0.1)
            stop.set()
            for t in threads:
                t.join()
            return peak_rss_mib(proc.pid) - baseline
    finally:
        proc.kill()  # it still has the flood's backlog to apply
        proc.wait(10)
        for pub, _ in pubs:
            pub.close(0)
        ctx.term()


async def test_the_total_budget_bounds_the_queues_of_all_publishers_together():
    small = 128 * MiB
    cap = ks.plan_budget(PUBLISHERS, total_bytes=small, max_bytes=MAX_MESSAGE_BYTES, index_max_blocks=10**6).max_bytes
    bounded = await flood_growth(small, cap - 1024)
    unbounded = await flood_growth(8192 * MiB, MAX_MESSAGE_BYTES - 1024, enough_mib=small / MiB)
    print(f"{PUBLISHERS} publishers flooding: peak RSS +{bounded:.0f} MiB with a 128 MiB total "
          f"(messages of {cap / MiB:.2f} MiB), +{unbounded:.0f} MiB with per-publisher bounds only (8 MiB messages)")
    # the queue half of the budget, plus one decoded batch and the index share in Python objects
    assert bounded < small / 2 / MiB + 48, bounded
    assert unbounded > small / MiB, unbounded  # negative control: the flood fills the queues past the whole total
