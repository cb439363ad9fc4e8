"""Fixtures for transfer-core integration tests: real prefill processes, real NIXL/UCX, real ZMQ."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent

from source_proc import pattern  # noqa: E402

from line_proc import LineProc  # noqa: E402

from pdfleet.connector.transfer import KVLayout, KVSink, Region  # noqa: E402
from pdfleet.contract.connector_config import ConnectorExtraConfig  # noqa: E402
from ports import free_port  # noqa: F401 (also imported from here by this folder's tests)

LAYOUT = dict(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=2, head_dim=64, tp_rank=0, tp_size=1)



class SourceProc(LineProc):
    """A KVSource in its own process, driven over stdin/stdout JSON lines."""

    def __init__(self, **opts) -> None:
        self.opts = opts
        argv = [sys.executable, str(HERE / "source_proc.py")]
        for key, value in opts.items():
            argv += [f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
        super().__init__(argv, cwd=HERE)
        ready = self.read(timeout=60)
        self.port: int = ready["port"]
        self.base_port: int = ready["base_port"]
        self.instance_id: str = ready["instance_id"]

    def hold(self, rid: str, blocks: list[int], lease_id: bytes | None = None) -> float:
        return self.cmd("hold", rid=rid, blocks=blocks, lease=lease_id.hex() if lease_id else "")["expiry"]

    def released(self) -> list[str]:
        return self.cmd("poll")["released"]

    def stats(self) -> dict:
        return self.cmd("stats")

    def expected(self, region: int, block: int, seed: int | None = None) -> np.ndarray:
        """The bytes of one source block (regenerated from the seeded pattern)."""
        block_len = self.opts.get("block_len", 4096)
        stride = self.opts.get("block_stride", 0) or block_len
        nblocks = self.opts.get("num_blocks", 64)
        data = pattern(self.opts.get("seed", 1) if seed is None else seed, region,
                       (nblocks - 1) * stride + block_len)
        return data[block * stride : block * stride + block_len]

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.cmd("exit")
            except Exception:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class LocalKV:
    """Decode-side DRAM buffers (zeroed) and their Regions."""

    def __init__(self, regions: int = 2, num_blocks: int = 64, block_len: int = 4096) -> None:
        self.block_len = block_len
        self.buffers = [np.zeros(num_blocks * block_len, dtype=np.uint8) for _ in range(regions)]
        self.regions = [
            Region(base=b.ctypes.data, num_blocks=num_blocks, block_stride=block_len, block_len=block_len)
            for b in self.buffers
        ]

    def block(self, region: int, block: int) -> np.ndarray:
        return self.buffers[region][block * self.block_len : (block + 1) * self.block_len]


SETTINGS = {f.name for f in dataclasses.fields(ConnectorExtraConfig)}


def make_sink(local: LocalKV, *, layout: dict | None = None, **kw) -> KVSink:
    fields = dict(LAYOUT)
    fields.update(layout or {})
    # The connector's settings (kv_connector_extra_config keys) by name, the sink's own arguments as they are.
    settings = dict(handshake_timeout=1.0, handshake_retries=2)
    settings.update({k: kw.pop(k) for k in list(kw) if k in SETTINGS})
    opts = dict(engine_id="decode-0", compat_hash="compat-1", secret=None, settings=ConnectorExtraConfig(**settings))
    opts.update(kw)
    return KVSink(regions=local.regions, layout=KVLayout(**fields), **opts)


def wait_for(sink: KVSink, rid: str, timeout: float = 20.0) -> tuple[bool, str]:
    """Poll until ``rid`` is done (True, "") or failed (False, reason)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, failed = sink.poll()
        if rid in failed:
            return False, failed[rid]
        if rid in done:
            return True, ""
        time.sleep(0.001)
    raise TimeoutError(f"request {rid} neither done nor failed within {timeout}s")


@pytest.fixture
def source_factory():
    procs: list[SourceProc] = []

    def start(**opts) -> SourceProc:
        proc = SourceProc(**opts)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.close()


@pytest.fixture
def local_kv() -> LocalKV:
    return LocalKV()


@pytest.fixture
def sink_factory():
    # Each sink with its buffers: NIXL keeps them registered (and READs land in them) until the sink
    # closes, so they must outlive it (a LocalKV() made in the call was freed first: a segfault at close).
    sinks: list[tuple[KVSink, LocalKV]] = []

    def make(local: LocalKV, **kw) -> KVSink:
        sink = make_sink(local, **kw)
        sinks.append((sink, local))
        return sink

    yield make
    for sink, _ in sinks:
        sink.close()
