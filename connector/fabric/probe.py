"""Run the loopback READ in a child process with the engine's UCX settings and decide (I/O edge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Mapping, Optional

from pdfleet.connector.fabric.verdict import ProbeRecord, Verdict, decide

# Transports that never leave the host: an RDMA check must not let UCX pick them for the
# loopback, or a READ between two agents of one process would never touch the NIC.
INTRA_NODE = ("self", "sm", "shm", "mm", "cma", "posix", "sysv", "xpmem", "knem", "cuda_ipc")


def probe_tls(want: str, ucx_tls: Optional[str]) -> Optional[str]:
    """UCX_TLS for the loopback: the engine's own, minus host-only transports when RDMA is checked."""
    if want != "rdma":
        return ucx_tls
    if not ucx_tls:
        return "^" + ",".join(INTRA_NODE)
    if ucx_tls.startswith("^"):
        excluded = [t for t in ucx_tls[1:].split(",") if t]
        return "^" + ",".join(dict.fromkeys(excluded + list(INTRA_NODE)))
    kept = [t for t in ucx_tls.split(",") if t and t not in INTRA_NODE]
    return ",".join(kept) or ucx_tls


def run_probe(*, want: str, min_gbps: float = 0.0, mib: int = 8, rounds: int = 3,
              env: Optional[Mapping[str, str]] = None, timeout: float = 120.0) -> tuple[Verdict, ProbeRecord]:
    base = dict(os.environ if env is None else env)
    child_env = {**base, "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": base.get("UCX_LOG_LEVEL", "warn")}
    tls = probe_tls(want, base.get("UCX_TLS"))
    if tls:
        child_env["UCX_TLS"] = tls
    cmd = [sys.executable, "-m", "pdfleet.connector.fabric.loopback", "--mib", str(mib), "--rounds", str(rounds)]
    try:
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"{exc.stdout or ''}{exc.stderr or ''}"
        proc = None
    result: dict[str, object] = {}
    for line in reversed(log.splitlines()):
        if line.startswith("{") and '"gbps"' in line:
            result = json.loads(line)
            break
    error = result.get("error") if result else (
        f"probe timed out after {timeout:g} s" if proc is None else f"probe exited with {proc.returncode}")
    record = ProbeRecord(
        want=want, min_gbps=min_gbps, ucx_tls=tls, ucx_net_devices=base.get("UCX_NET_DEVICES"), ucx_log=log,
        error=str(error) if error else None, gbps=result.get("gbps"),  # type: ignore[arg-type]
        bytes_ok=bool(result.get("bytes_ok")), mib=mib,
    )
    return decide(record), record
