"""A prefill-side process for the transfer tests: a real KVSource over numpy DRAM buffers.

Run as a script; it prints one JSON line when ready, then answers JSON-line commands
read from stdin (hold, poll, stats, exit). Buffer contents are a seeded byte pattern
(``pattern(seed, region, nbytes)``) that the test regenerates to compare.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def pattern(seed: int, region: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng([seed, region]).integers(0, 256, nbytes, dtype=np.uint8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-id", default="prefill-0")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--secret", default="")
    ap.add_argument("--secret-file", default="", help="key file followed like the connector does (rotation)")
    ap.add_argument("--rotation-grace", type=float, default=-1.0, help="seconds the old key stays accepted")
    ap.add_argument("--lease", type=float, default=30.0)
    ap.add_argument("--compat-hash", default="compat-1")
    ap.add_argument("--regions", type=int, default=2)
    ap.add_argument("--num-blocks", type=int, default=64)
    ap.add_argument("--block-len", type=int, default=4096)
    ap.add_argument("--block-stride", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layout", default="{}", help="KVLayout fields as JSON")
    args = ap.parse_args()

    from pdfleet.connector.transfer import KVLayout, KVSource, Region
    from pdfleet.contract.connector_config import ConnectorExtraConfig

    stride = args.block_stride or args.block_len
    nbytes = (args.num_blocks - 1) * stride + args.block_len
    buffers = [pattern(args.seed, i, nbytes) for i in range(args.regions)]
    regions = [
        Region(base=b.ctypes.data, num_blocks=args.num_blocks, block_stride=stride, block_len=args.block_len)
        for b in buffers
    ]
    fields = dict(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=2, head_dim=64, tp_rank=0, tp_size=1)
    fields.update(json.loads(args.layout))
    secret = bytes.fromhex(args.secret) if args.secret else None
    if args.secret_file:
        from pdfleet.connector.adapter.config import read_secret_file
        from pdfleet.connector.transfer.auth import KeyRing

        grace = args.rotation_grace if args.rotation_grace >= 0 else args.lease
        secret = KeyRing(read_secret_file(args.secret_file), grace_seconds=grace,
                         loader=lambda: read_secret_file(args.secret_file), reload_seconds=0.2)
    source = KVSource(
        engine_id=args.engine_id,
        regions=regions,
        layout=KVLayout(**fields),
        host=args.host,
        port=args.port,
        compat_hash=args.compat_hash,
        secret=secret,
        settings=ConnectorExtraConfig(lease_seconds=args.lease),
    )
    source.start()

    def say(obj: dict) -> None:
        sys.stdout.write("@@pdfleet " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True, "port": source.port, "base_port": source.base_port, "instance_id": source.instance_id})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "hold":  # "lease": the hold's lease id in hex (params 1.4), absent for none
            lease = bytes.fromhex(cmd["lease"]) if cmd.get("lease") else None
            say({"expiry": source.hold(cmd["rid"], cmd["blocks"], lease_id=lease)})
        elif op == "hold_many":
            say({"expiries": [source.hold(rid, cmd["blocks"]) for rid in cmd["rids"]]})
        elif op == "poll":
            say({"released": source.poll_released()})
        elif op == "stats":
            say(source.stats())
        elif op == "stall_nixl":  # stop driving NIXL (progress, notifications); the side channel still answers
            real_notifs = source._agent.notifs
            source._agent.notifs = lambda: {}
            say({"ok": True})
        elif op == "resume_nixl":
            source._agent.notifs = real_notifs
            say({"ok": True})
        elif op == "clock_step":  # step this process's wall clock (time.time) by `seconds`
            import time as _time

            real_time, step = _time.time, float(cmd["seconds"])
            _time.time = lambda: real_time() + step
            say({"ok": True})
        elif op == "overwrite":  # the engine reused these blocks: new bytes in them
            stride_ = args.block_stride or args.block_len
            for buf in buffers:
                for b in cmd["blocks"]:
                    buf[b * stride_ : b * stride_ + args.block_len] = 0xEE
            say({"ok": True})
        elif op == "exit":
            break
    source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
