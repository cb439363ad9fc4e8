"""`gpu` tier: the transfer core on VRAM between two processes on one GPU, bytes checked on the GPU.

Skipped without CUDA (tests/conftest.py). Both processes run with
UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y, as pdfleet sets it for GPU fleets (else UCX reads
over TCP). Shown per layout: the pulled blocks equal prefill's (compared with
torch.equal on the device; a negative control first), and the descriptor count is as
designed (block-outermost: one per run; per layer: layers x runs).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from line_proc import LineProc  # noqa: E402

REMOTE = [2, 3, 4, 5, 30, 31, 50, 51, 52]  # three runs
LOCAL = [0, 1, 2, 3, 10, 11, 20, 21, 22]
RUNS, NUM_BLOCKS = 3, 64


class GpuSource(LineProc):
    def __init__(self, kind: str) -> None:
        super().__init__([sys.executable, str(HERE / "gpu_source_proc.py"), "--kind", kind], cwd=HERE,
                         env=dict(os.environ, UCX_CUDA_IPC_ENABLE_GET_ZCOPY="y"))
        self.info = self.read(120)

    def close(self) -> None:
        try:
            self.cmd("exit")
            self.proc.wait(10)
        except Exception:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.mark.parametrize("kind, descriptors", [("page", RUNS), ("layer", 8 * RUNS)])
def test_vram_pull_between_two_processes_is_byte_exact(kind, descriptors, monkeypatch):
    import torch
    from gpu_source_proc import KV_BLOCK, LAYERS, PAGE, layout, regions, vram_pattern

    from pdfleet.connector.transfer import KVSink, Span

    monkeypatch.setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y")
    src = GpuSource(kind)
    local = torch.zeros(NUM_BLOCKS * PAGE, dtype=torch.uint8, device="cuda")
    sink = KVSink(engine_id=f"gpu-sink-{kind}", regions=regions(local.data_ptr(), NUM_BLOCKS, kind),
                  layout=layout(kind), compat_hash="gpu", secret=None,
                  backing=[Span(local.data_ptr(), local.numel(), "VRAM", local.device.index or 0)])
    try:
        want = vram_pattern(NUM_BLOCKS * PAGE)  # prefill's bytes, regenerated on this GPU

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
            pytest.fail("the VRAM pull did not finish in 30 s")
        torch.cuda.synchronize()
        assert pulled_equal()
        assert sink.stats()["descriptors"] == descriptors
    finally:
        sink.close()
        src.close()
