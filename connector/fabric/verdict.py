"""The fabric preflight's verdict (pure): a probe record in, the KVTransport condition out.

Reasons when False:
- DeviceMissing: UCX has no usable device/transport for what was asked (its own message kept);
- TCPFallback: RDMA was asked for but UCX moved the READ over TCP;
- BelowMinGBps: the READ worked but slower than network.preflight.minGBps;
- ProbeFailed: the READ failed or returned wrong bytes for another reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from pdfleet.contract.fabric import (
    BELOW_MIN,
    CONDITION_TYPE,
    DEVICE_MISSING,
    PROBE_FAILED,
    TCP_FALLBACK,
    VERIFIED,
    FabricVerdict,
)

__all__ = ["BELOW_MIN", "CONDITION_TYPE", "DEVICE_MISSING", "PROBE_FAILED", "TCP_FALLBACK", "VERIFIED",
           "ProbeRecord", "Verdict", "decide", "family", "read_transport", "ucx_problems"]

# UCX transport names, by what they are.
_FAMILIES = (
    ("rdma", re.compile(r"^(rc|ud|dc)(_mlx5|_verbs|_v|_x)?$|^ib$")),
    ("tcp", re.compile(r"^tcp$")),
    ("shm", re.compile(r"^(cma|posix|sysv|xpmem|knem|mm|self)$")),
    ("gpu", re.compile(r"^(cuda_ipc|cuda_copy|gdr_copy|rocm_ipc|rocm_copy)$")),
)
# "rc_mlx5/mlx5_0:1", "tcp/eth0", "cma/memory" inside a UCX_PROTO_INFO table cell.
_LANE = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:-]+)")
_READ_TABLE = re.compile(r"remote memory read by ucp_get")
_UCX_PROBLEM = re.compile(r"UCX\s+(?:WARN|ERROR)\s+(.*)$")
_DEVICE_MISSING_HINTS = (
    "no usable transports", "is not available", "no such device", "not found", "unreachable",
    "no active", "failed to create", "unsupported",
)  # fmt: skip


@dataclass(frozen=True)
class ProbeRecord:
    """What one probe saw: the request, UCX's own log, and the measured READ."""

    want: str                       # "rdma" or "any"
    min_gbps: float = 0.0
    ucx_tls: Optional[str] = None
    ucx_net_devices: Optional[str] = None
    ucx_log: str = ""               # stderr/stdout of the probe process (UCX WARN/ERROR, UCX_PROTO_INFO tables)
    error: Optional[str] = None     # agent creation or transfer failure
    gbps: Optional[float] = None    # best READ rate, GB/s (1e9 bytes/s)
    bytes_ok: bool = False
    mib: int = 8


Verdict = FabricVerdict  # the verdict's fields and JSON form are the contract's


def family(transport: Optional[str]) -> Optional[str]:
    """'rdma', 'tcp', 'shm' or 'gpu' for a lane like 'rc_mlx5/mlx5_0:1'; None if unknown."""
    if not transport:
        return None
    name = transport.split("/", 1)[0]
    return next((fam for fam, pattern in _FAMILIES if pattern.match(name)), None)


def read_transport(ucx_log: str) -> Optional[str]:
    """The lane(s) UCX chose for the READ, from the last 'remote memory read' UCX_PROTO_INFO table."""
    lines = ucx_log.splitlines()
    starts = [i for i, line in enumerate(lines) if _READ_TABLE.search(line)]
    if not starts:
        return None
    lanes: list[str] = []
    for line in lines[starts[-1] + 1:]:
        if "cfg#" in line or _READ_TABLE.search(line):
            break  # the next table
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 4 and cells[1] and cells[1] != "Range":
            for name, device in _LANE.findall(cells[-2]):
                lane = f"{name}/{device}"
                if lane not in lanes:
                    lanes.append(lane)
    return ",".join(lanes) or None


def ucx_problems(ucx_log: str) -> list[str]:
    """UCX's own WARN/ERROR messages, in order, without duplicates."""
    out: list[str] = []
    for line in ucx_log.splitlines():
        m = _UCX_PROBLEM.search(line)
        if m and m.group(1).strip() not in out:
            out.append(m.group(1).strip())
    return out


def _asked(record: ProbeRecord) -> str:
    parts = [f"UCX_TLS={record.ucx_tls}" if record.ucx_tls else "UCX_TLS unset"]
    if record.ucx_net_devices:
        parts.append(f"UCX_NET_DEVICES={record.ucx_net_devices}")
    return ", ".join(parts)


def decide(record: ProbeRecord) -> Verdict:
    problems = ucx_problems(record.ucx_log)
    ucx_says = "; ".join(problems)
    transport = read_transport(record.ucx_log)
    lanes = [family(t) for t in (transport or "").split(",") if t]
    if record.error is not None or record.gbps is None:
        detail = ucx_says or record.error or "the probe produced no measurement"
        text = f"{detail} {record.error or ''}".lower()
        reason = DEVICE_MISSING if any(h in text for h in _DEVICE_MISSING_HINTS) else PROBE_FAILED
        return Verdict(False, reason, f"UCX cannot move KV with {_asked(record)}: {detail}", transport)
    if not record.bytes_ok:
        return Verdict(False, PROBE_FAILED, f"loopback READ over {transport or 'UCX'} returned wrong bytes",
                       transport, record.gbps)
    rate = f"{record.gbps:.2f} GB/s"
    if record.want == "rdma" and "rdma" not in lanes:
        why = f" (UCX: {ucx_says})" if ucx_says else ""
        reason = TCP_FALLBACK if "tcp" in lanes or not lanes else DEVICE_MISSING
        return Verdict(False, reason, f"RDMA was asked for ({_asked(record)}) but UCX moved the READ over "
                       f"{transport or 'an unknown transport'} at {rate}{why}", transport, record.gbps)
    if record.min_gbps and record.gbps < record.min_gbps:
        return Verdict(False, BELOW_MIN, f"loopback READ of {record.mib} MiB over {transport or 'UCX'} ran at {rate}, "
                       f"below network.preflight.minGBps {record.min_gbps:g}", transport, record.gbps)
    return Verdict(True, VERIFIED, f"loopback READ of {record.mib} MiB over {transport or 'UCX'} at {rate}",
                   transport, record.gbps)
