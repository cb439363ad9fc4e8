"""The fabric preflight's verdict: table tests on UCX/NIXL output captured on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.connector.fabric.probe import probe_tls
from pdfleet.connector.fabric.verdict import (
    BELOW_MIN, DEVICE_MISSING, PROBE_FAILED, TCP_FALLBACK, VERIFIED, ProbeRecord, decide, family, read_transport,
    ucx_problems,
)  # fmt: skip

CAPTURED = Path(__file__).resolve().parent / "captured"


def log(name: str) -> str:
    return (CAPTURED / f"{name}.log").read_text()


def rdma_log() -> str:
    """SYNTHESIZED: the captured cma READ table with its lane rewritten to an InfiniBand HCA (no NIC here)."""
    return log("cpu-default-cma").replace("cma/memory", "rc_mlx5/mlx5_0:1")


@pytest.mark.parametrize("name,transport", [
    ("cpu-default-cma", "cma/memory"),
    ("rdma-wanted-got-tcp", "tcp/lo"),
    ("tls-rc-tcp", "tcp/lo"),
    ("rc-missing", None),
])
def test_read_transport_from_captured_proto_info(name: str, transport: str | None) -> None:
    assert read_transport(log(name)) == transport


def test_read_transport_takes_the_read_table_not_the_active_message_ones() -> None:
    # the cma log's active-message tables all say tcp/lo; only the READ table says cma
    assert "tcp/lo" in log("cpu-default-cma") and read_transport(log("cpu-default-cma")) == "cma/memory"


def test_multi_lane_and_family() -> None:
    table = ("[1] [h:1:0]   | sink intra-node cfg#1 |\n"
             "[1] [h:1:0]   | remote memory read by ucp_get*(multi) into host memory from host |\n"
             "[1] [h:1:0]   | Range | Description | Config |\n"
             "[1] [h:1:0]   | 0..inf | zero-copy | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 |\n")
    assert read_transport(table) == "rc_mlx5/mlx5_0:1,rc_mlx5/mlx5_1:1"
    assert [family(t) for t in ("rc_mlx5/mlx5_0:1", "dc_mlx5/x", "ud_verbs/x", "tcp/eth0", "cma/memory",
                                "cuda_ipc/cuda", "weird/x", None)] == \
        ["rdma", "rdma", "rdma", "tcp", "shm", "gpu", None, None]


def test_ucx_problems_are_ucx_own_words() -> None:
    assert ucx_problems(log("rc-missing")) == [
        "transport 'rc' is not available, please use one or more of: cma, mm, posix, self, shm, sm, sysv, tcp",
        "no usable transports/devices (asked rc on network:intra-node:accelerator:loopback:)",
    ]


NIXL_ERROR = "nixlBackendError: NIXL_ERR_BACKEND"
# (case, record, status, reason, transport, words the message must hold)
TABLE = [
    ("cpu-any-cma", ProbeRecord("any", ucx_log=log("cpu-default-cma"), gbps=4.2, bytes_ok=True),
     True, VERIFIED, "cma/memory", ["cma/memory", "4.20 GB/s"]),
    ("rc-asked-no-device", ProbeRecord("rdma", ucx_tls="rc", ucx_log=log("rc-missing"), error=NIXL_ERROR),
     False, DEVICE_MISSING, None, ["UCX_TLS=rc", "transport 'rc' is not available"]),
    ("rdma-asked-got-tcp", ProbeRecord("rdma", ucx_log=log("rdma-wanted-got-tcp"), gbps=0.3, bytes_ok=True),
     False, TCP_FALLBACK, "tcp/lo", ["RDMA was asked for", "tcp/lo", "0.30 GB/s"]),
    ("rc-tcp-asked-got-tcp", ProbeRecord("rdma", ucx_tls="rc,tcp", ucx_log=log("tls-rc-tcp"), gbps=0.3, bytes_ok=True),
     False, TCP_FALLBACK, "tcp/lo", ["UCX_TLS=rc,tcp", "transport 'rc' is not available"]),
    ("rdma-asked-got-rdma", ProbeRecord("rdma", ucx_net_devices="mlx5_0:1", ucx_log=rdma_log(), gbps=22.0,
                                        bytes_ok=True, min_gbps=10), True, VERIFIED, "rc_mlx5/mlx5_0:1", ["22.00 GB/s"]),
    ("rdma-but-slow", ProbeRecord("rdma", ucx_log=rdma_log(), gbps=3.0, bytes_ok=True, min_gbps=10),
     False, BELOW_MIN, "rc_mlx5/mlx5_0:1", ["3.00 GB/s", "minGBps 10"]),
    ("any-tcp-is-fine", ProbeRecord("any", ucx_log=log("rdma-wanted-got-tcp"), gbps=0.3, bytes_ok=True),
     True, VERIFIED, "tcp/lo", ["tcp/lo"]),
    ("any-but-slow", ProbeRecord("any", ucx_log=log("cpu-default-cma"), gbps=0.4, bytes_ok=True, min_gbps=1),
     False, BELOW_MIN, "cma/memory", ["below"]),
    ("wrong-bytes", ProbeRecord("any", ucx_log=log("cpu-default-cma"), gbps=5.0, bytes_ok=False),
     False, PROBE_FAILED, "cma/memory", ["wrong bytes"]),
    ("timeout-no-ucx-words", ProbeRecord("any", error="READ of 8 MiB not done after 30 s"),
     False, PROBE_FAILED, None, ["not done after 30 s"]),
]


@pytest.mark.parametrize("case,record,status,reason,transport,words", TABLE, ids=[t[0] for t in TABLE])
def test_verdict_table(case, record, status, reason, transport, words) -> None:
    v = decide(record)
    assert (v.status, v.reason, v.transport) == (status, reason, transport), v
    for word in words:
        assert word in v.message, (word, v.message)
    d = v.as_dict()
    assert d["type"] == "KVTransport" and d["status"] == ("True" if status else "False")


def test_verdict_depends_on_what_was_asked() -> None:
    """Negative control: the same captured TCP run is fine for 'any' and a fallback for 'rdma'."""
    same = dict(ucx_log=log("rdma-wanted-got-tcp"), gbps=0.3, bytes_ok=True)
    assert decide(ProbeRecord("any", **same)).status is True
    assert decide(ProbeRecord("rdma", **same)).reason == TCP_FALLBACK


@pytest.mark.parametrize("want,tls,expected", [
    ("any", None, None),
    ("any", "rc,cuda_copy", "rc,cuda_copy"),
    ("rdma", None, "^self,sm,shm,mm,cma,posix,sysv,xpmem,knem,cuda_ipc"),
    ("rdma", "rc,cuda_copy,cuda_ipc", "rc,cuda_copy"),
    ("rdma", "^tcp", "^tcp,self,sm,shm,mm,cma,posix,sysv,xpmem,knem,cuda_ipc"),
    ("rdma", "sm", "sm"),  # nothing left: keep what was asked, the verdict will say it is not RDMA
])
def test_probe_keeps_the_loopback_off_host_only_transports_when_checking_rdma(want, tls, expected) -> None:
    assert probe_tls(want, tls) == expected


def test_connector_exports_the_verified_transport(tmp_path) -> None:
    import json as _json

    from pdfleet.connector.fabric.exported import info_labels, read_info_labels
    from pdfleet.connector.fabric.verdict import decide as _decide

    verdict = _decide(ProbeRecord("rdma", ucx_log=log("rdma-wanted-got-tcp"), gbps=0.3, bytes_ok=True))
    path = tmp_path / "kv-transport.json"
    path.write_text(_json.dumps(verdict.as_dict()))
    assert read_info_labels({"PDFLEET_KV_TRANSPORT_FILE": str(path)}) == \
        {"transport": "tcp", "status": "False", "reason": "TCPFallback"}
    assert read_info_labels({})["status"] == "Unknown"
    assert info_labels("garbage")["status"] == "Unknown"
