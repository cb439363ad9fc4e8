"""The transfer core between two processes over one torch allocation each: `gpu` tier on VRAM,
and the same body on DRAM in the CPU tier (so the path, teardown included, runs everywhere).

On a GPU the `cuda` cases run (skipped without CUDA, tests/conftest.py); both processes run
with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y, as pdfleet sets it for GPU fleets (else UCX reads over
TCP). Shown per layout: the pulled blocks equal prefill's (compared with torch.equal on the
device; a negative control first), the descriptor count is as designed (block-outermost:
one per run; per layer: layers x runs) and posted from descriptor lists prepared at
handshake, and the source process shuts down cleanly (it
answers `exit` and exits 0: a teardown failure fails the test).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from line_proc import LineProc  # noqa: E402

REMOTE = [2, 3, 4, 5, 30, 31, 50, 51, 52]  # three runs
LOCAL = [0, 1, 2, 3, 10, 11, 20, 21, 22]
RUNS, NUM_BLOCKS = 3, 64


class GpuSource(LineProc):
    def __init__(self, kind: str, device: str) -> None:
        super().__init__([sys.executable, str(HERE / "gpu_source_proc.py"), "--kind", kind, "--device", device],
                         cwd=HERE, env=dict(os.environ, UCX_CUDA_IPC_ENABLE_GET_ZCOPY="y"))
        self.info = self.read(120)


DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu, id="vram"), pytest.param("cpu", id="dram")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, descriptors, threads", [
    ("page", RUNS, 0), ("layer", 8 * RUNS, 0),
    # NIXL's thread pool (what GPU fleets run with): 24 descriptors split over 2 threads
    ("layer", 8 * RUNS, 2),
])
def test_pull_between_two_processes_is_byte_exact(kind, descriptors, threads, device, monkeypatch):
    import torch
    from gpu_source_proc import KV_BLOCK, LAYERS, MEMORY, PAGE, layout, pattern, regions

    from pdfleet.connector.transfer import KVSink, Span
    from pdfleet.contract.connector_config import ConnectorExtraConfig

    monkeypatch.setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y")
    mem = MEMORY[device]
    src = GpuSource(kind, device)
    local = torch.zeros(NUM_BLOCKS * PAGE, dtype=torch.uint8, device=device)
    sink = KVSink(engine_id=f"gpu-sink-{kind}", regions=regions(local.data_ptr(), NUM_BLOCKS, kind, mem),
                  layout=layout(kind), compat_hash="gpu", secret=None,
                  backing=[Span(local.data_ptr(), local.numel(), mem, local.device.index or 0)],
                  settings=ConnectorExtraConfig(nixl_threads=threads))
    try:
        want = pattern(NUM_BLOCKS * PAGE, device)  # prefill's bytes, regenerated on this device

        def pulled_equal() -> bool:
            if kind == "page":
                got = local.view(NUM_BLOCKS, PAGE)[LOCAL]
                return torch.equal(got, want.view(NUM_BLOCKS, PAGE)[REMOTE])
            got = local.view(LAYERS, NUM_BLOCKS, KV_BLOCK)[:, LOCAL]
            return torch.equal(got, want.view(LAYERS, NUM_BLOCKS, KV_BLOCK)[:, REMOTE])

        assert not pulled_equal()  # negative control: the comparison can fail
        expiry = src.cmd("hold", rid="r1", blocks=REMOTE)["expiry"]
        sink.pull("r1", host="127.0.0.1", port=src.info["port"], remote_engine_id=f"gpu-{kind}",
                  remote_instance_id=src.info["instance_id"], remote_block_ids=REMOTE, local_block_ids=LOCAL,
                  remote_lease_expiry=expiry)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, failed = sink.poll()
            assert "r1" not in failed, failed
            if "r1" in done:
                break
        else:
            pytest.fail(f"the {mem} pull did not finish in 30 s")
        if device == "cuda":
            torch.cuda.synchronize()
        assert pulled_equal()
        assert sink.stats()["descriptors"] == descriptors
        assert sink.stats()["prepped_transfers"] == 1  # from the lists prepared at handshake
        assert sink.nixl_threads == threads
    finally:
        sink.close()
        src.close()  # raises (after killing it) unless the child answered exit and exited 0
