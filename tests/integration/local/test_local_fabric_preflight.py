"""`pdfleet local --preflight-only`: the fabric preflight with real NIXL over UCX on this machine.

The default local fleet reports KVTransport=True with its measured GB/s; a fleet whose network
profile asks for a UCX transport this machine does not have (rc: no InfiniBand here) reports
KVTransport=False with UCX's own reason, and one that accepts TCP besides rc is a TCPFallback.
No vLLM engine is started: the preflight is NIXL only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(180)


def run_local(tmp_path: Path, network: dict | None) -> tuple[int, str, dict]:
    cr = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    if network is not None:
        cr["spec"]["network"] = network
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(cr))
    state = tmp_path / "state.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    proc = subprocess.run([sys.executable, "-m", "pdfleet.operator.cli", "local", "-f", str(path), "--preflight-only",
                           "--state-file", str(state), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=150)
    (condition,) = json.loads(state.read_text())["conditions"]
    return proc.returncode, proc.stdout, condition


def test_default_local_fleet_reports_kv_transport_true_with_measured_rate(tmp_path: Path) -> None:
    rc, out, cond = run_local(tmp_path, None)
    assert rc == 0, out
    assert cond["type"] == "KVTransport" and cond["status"] == "True", cond
    assert cond["transport"] == "cma/memory" and cond["gBps"] > 0.05
    assert out.startswith("KVTransport: True") and "GB/s" in out


def test_a_transport_that_does_not_exist_is_refused_with_ucx_reason(tmp_path: Path) -> None:
    rc, out, cond = run_local(tmp_path, {"ucxTransports": ["rc"]})
    assert rc == 1
    assert cond["status"] == "False" and cond["reason"] == "DeviceMissing", cond
    assert "transport 'rc' is not available" in cond["message"] and "UCX_TLS=rc" in cond["message"]


def test_rdma_asked_tcp_allowed_is_a_tcp_fallback(tmp_path: Path) -> None:
    rc, out, cond = run_local(tmp_path, {"ucxTransports": ["rc", "tcp"]})
    assert rc == 1
    assert cond["status"] == "False" and cond["reason"] == "TCPFallback", cond
    assert cond["transport"].startswith("tcp/") and cond["gBps"] > 0
