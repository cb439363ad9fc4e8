"""One loopback NIXL READ between two agents of this process, measured (the probe's child).

Run as `python -m pdfleet.connector.fabric.loopback --mib N --rounds R`; prints one JSON line
`{"gbps": best GB/s or null, "bytes_ok": bool, "error": str or null}` last. UCX writes its
own log (UCX_PROTO_INFO tables, WARN/ERROR lines) to the same streams; the parent reads both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def measure(mib: int, rounds: int, timeout: float = 30.0) -> dict[str, object]:
    from pdfleet.connector.transfer.nixl_agent import NixlAgent

    n = mib << 20
    src = np.frombuffer(np.random.default_rng().bytes(n), dtype=np.uint8).copy()
    dst = np.zeros(n, dtype=np.uint8)
    try:
        source, sink = NixlAgent("pdfleet-preflight-source"), NixlAgent("pdfleet-preflight-sink")
    except Exception as exc:  # UCX found nothing usable: its log says why
        return {"gbps": None, "bytes_ok": False, "error": f"{type(exc).__name__}: {exc}"}
    source._agent.register_memory([(src.ctypes.data, n, 0, "")], "DRAM")
    sink._agent.register_memory([(dst.ctypes.data, n, 0, "")], "DRAM")
    peer = sink.add_peer(source.metadata())
    source.add_peer(sink.metadata())
    local = np.array([(dst.ctypes.data, n, 0)])
    remote = np.array([(src.ctypes.data, n, 0)])
    best = 0.0
    for _ in range(rounds):  # the first READ includes connection setup: keep the best
        dst[:] = 0
        started = time.perf_counter()
        try:
            handle = sink.read(peer, "DRAM", local, "DRAM", remote, b"preflight")
        except Exception as exc:
            return {"gbps": None, "bytes_ok": False, "error": str(exc)}
        while (state := sink.state(handle)) == "PROC":
            if time.perf_counter() - started > timeout:
                return {"gbps": None, "bytes_ok": False, "error": f"READ of {mib} MiB not done after {timeout:g} s"}
        elapsed = time.perf_counter() - started
        sink.release(handle)
        if state != "DONE":
            return {"gbps": None, "bytes_ok": False, "error": f"READ ended in state {state}"}
        best = max(best, n / elapsed / 1e9)
    return {"gbps": best, "bytes_ok": bool(np.array_equal(src, dst)), "error": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure(args.mib, args.rounds)
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
