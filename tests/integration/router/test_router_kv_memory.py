"""Issue 20 row 4, measured: the router process's peak RSS while it takes a large replay of KV events.

A real `pdfleet router` process subscribes to a real ZMQ publisher (PUB + replay ROUTER) that buffered
80 batches of ~0.5 MiB (60,000 block hashes each, the same hashes in every batch so the index itself stays
small). The router used to decode the whole replay into a list before applying it (about 4-5 times the
wire bytes in Python objects); it now applies each batch as it arrives. Compared with a router whose
publisher buffered nothing, in the same test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp
import msgspec
import pytest
import zmq
from test_router_kv_events import Publisher
from ports import free_port  # noqa: F401 (also imported from here by this folder's tests)

pytestmark = pytest.mark.timeout(120)

BATCHES = 80
HASHES = list(range(2**40, 2**40 + 60_000))  # under the decoder's 65,536 per event


def payload() -> bytes:
    event = {"type": "BlockStored", "block_hashes": HASHES, "parent_block_hash": None, "token_ids": [],
             "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
    return msgspec.msgpack.encode([1.0, [event], 0])


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def run_router(pub: Publisher, port: int, want_batches: int) -> float:
    engine = "http://127.0.0.1:9"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.operator.cli", "router", "--port", str(port), "--prefill", engine,
         "--decode", "http://127.0.0.1:10", "--kv-events", f"{engine}={pub.endpoints}", "--event-loop", "asyncio",
         "--log-level", "WARNING"],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as session:
            health = {}
            for _ in range(600):
                await asyncio.sleep(0.1)
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as r:
                        health = await r.json()
                except aiohttp.ClientError:
                    continue
                stream = health["prefix_routing"]["streams"].get(engine) or {}
                if stream.get("synced") and stream.get("batches") == want_batches:
                    break
            else:
                raise AssertionError(f"the router never synced {want_batches} batches: {health}")
            assert stream["blocks"] == (len(HASHES) if want_batches else 0)
            return peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)



async def test_a_large_replay_does_not_grow_the_router_by_its_decoded_size():
    ctx = zmq.Context()
    empty, full = Publisher(ctx), Publisher(ctx)
    try:
        data = payload()
        for _ in range(BATCHES):
            full.publish(data, lose=True)  # buffered for replay only
        wire_mib = BATCHES * len(data) / 2**20
        baseline = await run_router(empty, free_port(), 0)
        loaded = await run_router(full, free_port(), BATCHES)
    finally:
        empty.close()
        full.close()
        ctx.term()
    growth = loaded - baseline
    print(f"replay of {BATCHES} batches, {wire_mib:.0f} MiB on the wire: peak RSS {baseline:.0f} MiB -> "
          f"{loaded:.0f} MiB (+{growth:.0f} MiB)")
    # one decoded batch (~3 MiB) and the index (60,000 blocks) at a time; holding the replay was +150 MiB or more
    assert growth < wire_mib, f"peak RSS grew by {growth:.0f} MiB for a {wire_mib:.0f} MiB replay"
