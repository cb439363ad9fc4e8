"""Prefill process of the `gpu` tier: a KVSource over one torch allocation on the GPU (VRAM)
or, with ``--device cpu``, on DRAM (the CPU tier runs the same test body that way).

``--kind page``: one region of block-outermost pages (all layers of a block adjacent);
``--kind layer``: one region per layer view inside the same allocation (layer-outermost).
The allocation holds ``pattern(nbytes, device)`` (generated on the device, seeded), so the
test regenerates what prefill holds. Prints one JSON line when ready, then answers
JSON-line commands: hold, and exit (answered once the source is closed; then it exits 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # PYTHONSAFEPATH=1 leaves the script's folder out

LAYERS, KV_BLOCK = 8, 16 * 1024  # 8 layers (K and V in one page each), 16 KiB per layer and block
PAGE = LAYERS * KV_BLOCK
MEMORY = {"cuda": "VRAM", "cpu": "DRAM"}


def pattern(nbytes: int, device: str, seed: int = 11):
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=gen)


def vram_pattern(nbytes: int, seed: int = 11):
    return pattern(nbytes, "cuda", seed)


def regions(base: int, num_blocks: int, kind: str, mem: str = "VRAM"):
    from pdfleet.connector.transfer import Region

    if kind == "page":
        return [Region(base=base, num_blocks=num_blocks, block_stride=PAGE, block_len=PAGE, device=mem)]
    return [Region(base=base + layer * num_blocks * KV_BLOCK, num_blocks=num_blocks, block_stride=KV_BLOCK,
                   block_len=KV_BLOCK, device=mem) for layer in range(LAYERS)]


def layout(kind: str):
    from pdfleet.connector.transfer import KVLayout

    return KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=4, head_dim=64, tp_rank=0,
                    tp_size=1, kv_cache_layout="BHLNC" if kind == "page" else "LBHNC")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["page", "layer"], required=True)
    ap.add_argument("--device", choices=sorted(MEMORY), default="cuda")
    ap.add_argument("--num-blocks", type=int, default=64)
    args = ap.parse_args()

    from pdfleet.connector.transfer import KVSource, Span
    from pdfleet.contract.connector_config import ConnectorExtraConfig

    mem = MEMORY[args.device]
    nbytes = args.num_blocks * PAGE
    buf = pattern(nbytes, args.device)
    source = KVSource(engine_id=f"gpu-{args.kind}", regions=regions(buf.data_ptr(), args.num_blocks, args.kind, mem),
                      layout=layout(args.kind), host="127.0.0.1", port=0, compat_hash="gpu", secret=None,
                      settings=ConnectorExtraConfig(lease_seconds=30.0), backing=[Span(buf.data_ptr(), nbytes, mem, max(buf.device.index or 0, 0))])
    source.start()

    def say(obj: dict) -> None:
        sys.stdout.write("@@pdfleet " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True, "port": source.base_port, "instance_id": source.instance_id})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "hold":
            say({"expiry": source.hold(cmd["rid"], cmd["blocks"])})
        elif cmd["op"] == "exit":
            break
    source.close()
    say({"closed": True})  # answers exit: the parent's close() waits for this, then for status 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
