"""Prefill process for the layout tests: a worker-side PdfleetConnector over a KV cache
that vLLM's ``allocate_kv_cache`` laid out in ``--layout``, filled with ``fill``.

Prints one JSON line when ready, then answers JSON-line commands (hold, stats, exit).
The side channel binds 127.0.0.1 on VLLM_NIXL_SIDE_CHANNEL_PORT (set by the test).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # PYTHONSAFEPATH=1 leaves the script's folder out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", required=True)
    ap.add_argument("--heads", type=int, required=True)
    args = ap.parse_args()

    from vllm_kv_caches import build_worker, fill

    conn, kv = build_worker(args.layout, "kv_producer", heads=args.heads)
    fill(kv)
    worker = conn._worker

    def say(obj: dict) -> None:
        sys.stdout.write("@@pdfleet " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True, "port": worker.source.base_port, "instance_id": worker.source.instance_id,
         "regions": len(worker.regions), "registrations": len(worker.source.spans),
         "kv_cache_layout": worker.layout.kv_cache_layout})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "hold":
            say({"expiry": worker.source.hold(cmd["rid"], cmd["blocks"])})
        elif cmd["op"] == "stats":
            say(worker.source.stats())
        elif cmd["op"] == "exit":
            break
    conn.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
