"""What issue 19's defences cost on the fast path, measured in one run.

    flock /tmp/pdfleet-cpu.lock .venv/bin/python bench/hostile_costs.py [--pulls 2000] [--rtts 2000]

1. Signed kv_transfer_params: ``sign_params`` (prefill, once per request) and
   ``verify_params`` (decode, once per pull) on the params of a 2,048-token request
   (128 block ids), against ``parse_remote_prefill`` without a signature (the baseline
   the decode already paid).
2. The side channel's round trip (one heartbeat, the message every pull waits for):
   keyed (CURVE handshake done once per connection, then CURVE encryption + HMAC per
   message, depth check) against unkeyed in the same run; both real ZMQ over loopback.
3. ``check_depth`` on a heartbeat request and a heartbeat reply (its share of the above).
4. Single-use leases (issue 30, params 1.4) against 1.3 in the same run (``--lease-pulls``):
   a. the CPU work per pull: a lease id made and signed (v3) vs v2, parse + verify, the source's
      lease table (hold, heartbeat, completion, collect) with and without lease ids, and the
      heartbeat request and completion notification coded with and without them (goal: under
      50 us per pull);
   b. a pull end to end (the source in its own process, real NIXL over loopback, a cached peer,
      keyed side channel), interleaved 1.3/1.4: 1.3 posts the READ on the lease bound and
      overlaps it with the first heartbeat; 1.4 waits for the source's grant, so a pull pays up
      to one side-channel round trip more (the price of never reading a replayed lease).
Prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import time

import msgspec

from pdfleet.connector.adapter.signed_params import sign_params, verifier, verify_params
from pdfleet.contract.connector_config import ConnectorExtraConfig
from pdfleet.contract.kv_params import SIG_KEY, parse_remote_prefill, produce
from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.auth import KeyRing
from pdfleet.contract.ports import SIDE_CHANNEL
from pdfleet.connector.transfer.bounds import check_depth
from pdfleet.connector.transfer.sidechannel import SideChannelClient, SideChannelServer

KEY = b"bench-fleet-key-" * 2
BLOCK = 16


def per_call_us(fn, n: int) -> float:
    for _ in range(min(100, n)):
        fn()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return min(best)


def params_costs(n: int) -> dict[str, float]:
    now = time.time()
    p = produce(block_ids=list(range(128)), engine_id="prefill-0", request_id="cmpl-" + "a" * 32,
                host="10.0.0.7", port=SIDE_CHANNEL, tp_size=1, instance_id="0123456789abcdef" * 2,
                lease_seconds=30, num_tokens=2048)
    signed = dict(p, **{SIG_KEY: sign_params(p, KEY)})
    ring = KeyRing(KEY)
    parse = lambda ring_=None, q=signed: parse_remote_prefill(  # noqa: E731
        q, num_prompt_tokens=2048, block_size=BLOCK, local_tp_size=1, now=now, verify=verifier(ring_))
    return {
        "sign_params": per_call_us(lambda: sign_params(p, KEY), n),
        "verify_params": per_call_us(lambda: verify_params(signed, ring), n),
        "parse (no signature check)": per_call_us(lambda: parse(None, p), n),
        "parse + verify": per_call_us(lambda: parse(ring), n),
    }


def rtt_us(secret, n: int) -> float:
    srv = SideChannelServer("127.0.0.1", 0, secret=secret,
                            handler=lambda r: wire.HeartbeatReply(id=r.id, instance_id="i", remaining={"r": 30.0}))
    srv.start()
    client = SideChannelClient(secret=secret)
    try:
        samples = []
        for i in range(n + 50):
            req = wire.HeartbeatRequest(id=SideChannelClient.next_id(), request_ids=["cmpl-" + "a" * 32],
                                        agent="pdfleet-sink-decode-0-r0-0123456789ab")
            t0 = time.perf_counter()
            call = client.submit("127.0.0.1", srv.port, req, timeout=5.0, attempts=1)
            while not call.done():
                client.poll()
            call.result()
            if i >= 50:  # the first ones include the connection (and CURVE) handshake
                samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    finally:
        client.close()
        srv.close()


def paired_us(old, new, n: int, rounds: int = 7) -> tuple[float, float]:
    """Best-of-``rounds`` microseconds per call of ``old`` and ``new``, timed in alternation (a loaded
    machine's drift then hits both alike)."""
    for fn in (old, new):
        for _ in range(min(100, n)):
            fn()
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((old, new)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / n * 1e6)
    return best[0], best[1]


def lease_cpu_costs(n: int) -> dict[str, tuple[float, float]]:
    """(1.3, 1.4) microseconds per pull of each piece of work single-use leases change."""
    from pdfleet.connector.transfer.leases import LeaseTable
    from pdfleet.contract import kv_params as K

    ring = KeyRing(KEY)
    base = dict(block_ids=list(range(128)), engine_id="prefill-0", request_id="cmpl-" + "a" * 32, host="10.0.0.7",
                port=SIDE_CHANNEL, tp_size=1, instance_id="0123456789abcdef" * 2, lease_seconds=30, num_tokens=2048)
    p14 = produce(**base)
    p13 = {k: v for k, v in p14.items() if k != K.REMOTE_LEASE_ID} | {K.VERSION_KEY: "1.3"}
    s14 = dict(p14, **{SIG_KEY: sign_params(p14, KEY)})
    s13 = dict(p13, **{SIG_KEY: sign_params(p13, KEY, "v2")})
    now = time.time()

    def produce_and_sign(v14: bool):
        def run():
            q = produce(**base) if v14 else p13  # 1.4 makes a fresh lease id per hold
            return sign_params(q, KEY, "v3" if v14 else "v2")
        return run

    def decode_parse(q):
        return lambda: parse_remote_prefill(q, num_prompt_tokens=2048, block_size=BLOCK, local_tp_size=1, now=now,
                                            verify=verifier(ring), accepted_at=time.monotonic())

    def table(v14: bool):
        t = LeaseTable(30.0)
        ids = [secrets.token_bytes(16) if v14 else None for _ in range(64)]
        state = {"i": 0}

        def run():
            i = state["i"] = state["i"] + 1
            rid, lid = f"cmpl-{i}", ids[i % 64]
            t.hold(rid, [1, 2, 3], 1000.0 + i, lid)
            t.extend([rid], 1000.0 + i, "sink-a", 1, [lid] if v14 else None)
            t.complete(rid, 1, 0, 1, 0, "sink-a", lid)
            t.collect(1000.0 + i)
        return run

    req_codec = wire.request_codec(KEY)
    lid = secrets.token_bytes(16)

    def heartbeat(v14: bool):
        msg = wire.HeartbeatRequest(id=1, request_ids=["cmpl-" + "a" * 32], agent="x" * 40,
                                    lease_ids=[lid] if v14 else [])

        def run():
            req_codec.decode(req_codec.encode(msg))
            return wire.lease_id_list(msg)
        return run

    def notif(v14: bool):
        n = wire.Notif("cmpl-" + "a" * 32, 1, 0, 1, 0, lid if v14 else b"")
        return lambda: wire.decode_notif(wire.encode_notif(n))

    return {
        "prefill: params made + signed": paired_us(produce_and_sign(False), produce_and_sign(True), n),
        "decode: parse + verify": paired_us(decode_parse(s13), decode_parse(s14), n),
        "source: lease table per pull": paired_us(table(False), table(True), n),
        "heartbeat request coded (keyed)": paired_us(heartbeat(False), heartbeat(True), n),
        "notification coded": paired_us(notif(False), notif(True), n),
    }


# -- 4b: a pull end to end, the source in its own process -----------------------------------------------
NUM_BLOCKS, BLOCK_LEN = 64, 16 * 1024
MARK = "@@bench "  # the child's answers; NIXL may log on stdout too


def _answer(out) -> dict:
    while True:
        line = out.readline()
        if not line:
            raise RuntimeError("the source process exited")
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])


def _layout():
    from pdfleet.connector.transfer import KVLayout

    return KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=2, head_dim=64, tp_rank=0, tp_size=1)


def source_child() -> int:
    import numpy as np

    from pdfleet.connector.transfer import KVSource, Region

    bufs = [np.random.default_rng(i).integers(0, 256, NUM_BLOCKS * BLOCK_LEN, dtype=np.uint8) for i in range(2)]
    regions = [Region(base=b.ctypes.data, num_blocks=NUM_BLOCKS, block_stride=BLOCK_LEN, block_len=BLOCK_LEN)
               for b in bufs]
    src = KVSource(engine_id="bench-prefill", regions=regions, layout=_layout(), host="127.0.0.1", port=0,
                   compat_hash="bench", secret=KEY, settings=ConnectorExtraConfig(lease_seconds=30.0))
    src.start()
    print(MARK + json.dumps({"port": src.base_port, "instance_id": src.instance_id}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "hold":
            src.hold(cmd["rid"], cmd["blocks"], bytes.fromhex(cmd["lease"]) if cmd["lease"] else None)
            src.poll_released()
            print(MARK + "{}", flush=True)
        else:
            break
    src.close()
    return 0


def pull_latency_ms(pulls: int) -> tuple[list[float], list[float]]:
    """Median-ready samples (ms) of a whole pull, 1.3 then 1.4 interleaved, one source process."""
    import numpy as np

    from pdfleet.connector.transfer import KVSink, Region

    child = subprocess.Popen([sys.executable, __file__, "--child-source"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    ready = _answer(child.stdout)
    buf = [np.zeros(NUM_BLOCKS * BLOCK_LEN, dtype=np.uint8) for _ in range(2)]
    regions = [Region(base=b.ctypes.data, num_blocks=NUM_BLOCKS, block_stride=BLOCK_LEN, block_len=BLOCK_LEN)
               for b in buf]
    sink = KVSink(engine_id="bench-decode", regions=regions, layout=_layout(), compat_hash="bench", secret=KEY)
    samples: tuple[list[float], list[float]] = ([], [])
    try:
        for i in range(pulls + 20):
            for v14 in (False, True):
                rid = f"r{i}-{int(v14)}"
                lease = secrets.token_bytes(16) if v14 else None
                child.stdin.write(json.dumps({"op": "hold", "rid": rid, "blocks": [1, 2, 3, 4],
                                              "lease": lease.hex() if lease else ""}) + "\n")
                child.stdin.flush()
                _answer(child.stdout)  # held: the pull does not overtake the hold here
                t0 = time.perf_counter()
                sink.pull(rid, host="127.0.0.1", port=ready["port"], remote_engine_id="bench-prefill",
                          remote_instance_id=ready["instance_id"], remote_block_ids=[1, 2, 3, 4],
                          local_block_ids=[5, 6, 7, 8], remote_lease_deadline=time.monotonic() + 30.0,
                          lease_id=lease)
                while True:
                    done, failed = sink.poll()
                    if rid in done or rid in failed:
                        break
                assert rid in done, failed
                if i >= 20:  # the first ones include the handshake and the connection's warm-up
                    samples[v14].append((time.perf_counter() - t0) * 1e3)
    finally:
        sink.close()
        child.stdin.write(json.dumps({"op": "exit"}) + "\n")
        child.stdin.flush()
        child.wait(30)
    return samples


def main() -> None:
    if "--child-source" in sys.argv:
        sys.exit(source_child())
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pulls", type=int, default=2000, help="calls per params measurement")
    ap.add_argument("--rtts", type=int, default=2000, help="heartbeat round trips per side-channel measurement")
    ap.add_argument("--lease-pulls", type=int, default=300, help="end-to-end pulls per version in part 4b")
    ap.add_argument("--parts", default="1,2,3,4", help="which parts to run (comma-separated)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts == {"4"}:
        lease_report(args)
        return
    rows = [(k, v, "us/call") for k, v in params_costs(args.pulls).items()]
    plain, keyed = rtt_us(None, args.rtts), rtt_us(KEY, args.rtts)
    rows += [("heartbeat RTT, no key", plain, "us p50"), ("heartbeat RTT, keyed (CURVE+HMAC)", keyed, "us p50")]
    req = msgspec.msgpack.encode(wire.HeartbeatRequest(id=1, request_ids=["cmpl-" + "a" * 32], agent="x" * 40))
    rep = msgspec.msgpack.encode(wire.HeartbeatReply(id=1, instance_id="i" * 32, remaining={"cmpl-" + "a" * 32: 30.0}))
    rows += [("check_depth(heartbeat request)", per_call_us(lambda: check_depth(req, wire.MAX_DEPTH), args.pulls),
              "us/call"),
             ("check_depth(heartbeat reply)", per_call_us(lambda: check_depth(rep, wire.MAX_DEPTH), args.pulls),
              "us/call")]
    width = max(len(r[0]) for r in rows)
    for name, value, unit in rows:
        print(f"{name:{width}}  {value:10.2f}  {unit}")
    d = dict((r[0], r[1]) for r in rows)
    print(f"signing + verifying per pull: {d['sign_params'] + d['verify_params']:.1f} us"
          f" ({(d['sign_params'] + d['verify_params']) / keyed * 100:.1f}% of one keyed side-channel round trip)")
    print(f"keyed / unkeyed round trip: {keyed / plain:.2f}x")
    if "4" in parts:
        lease_report(args)


def lease_report(args: argparse.Namespace) -> None:
    costs = lease_cpu_costs(args.pulls)
    width = max(len(k) for k in costs)
    print(f"\nsingle-use leases (params 1.4) vs 1.3, same run; us per pull (best of 7 x {args.pulls}, alternating)")
    print(f"{'':{width}}  {'1.3':>9}  {'1.4':>9}  {'1.4-1.3':>9}")
    for name, (old, new) in costs.items():
        print(f"{name:{width}}  {old:9.2f}  {new:9.2f}  {new - old:9.2f}")
    delta = sum(new - old for old, new in costs.values())
    print(f"CPU work single-use leases add per pull: {delta:.1f} us = {delta / 1000:.4f} ms (goal < 0.05 ms)")
    if args.lease_pulls > 0:
        old, new = pull_latency_ms(args.lease_pulls)
        m_old, m_new = statistics.median(old), statistics.median(new)
        q = lambda xs: statistics.quantiles(xs, n=10)[-1]  # noqa: E731
        print(f"pull end to end ({args.lease_pulls} each, interleaved; 4 blocks x 2 regions x 16 KiB, keyed):"
              f" 1.3 median {m_old:.3f} ms (min {min(old):.3f}, p90 {q(old):.3f}), 1.4 median {m_new:.3f} ms"
              f" (min {min(new):.3f}, p90 {q(new):.3f}); 1.4 - 1.3 = {m_new - m_old:+.3f} ms median,"
              f" {min(new) - min(old):+.3f} ms min per pull")


if __name__ == "__main__":
    main()
