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
Prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import msgspec

from pdfleet.connector.adapter.params import (
    SIGNATURE_KEY,
    parse_remote_prefill,
    producer_params,
    sign_params,
    verify_params,
)
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
    p = producer_params(block_ids=list(range(128)), engine_id="prefill-0", request_id="cmpl-" + "a" * 32,
                        host="10.0.0.7", port=SIDE_CHANNEL, tp_size=1, instance_id="0123456789abcdef" * 2,
                        lease_seconds=30, num_tokens=2048)
    signed = dict(p, **{SIGNATURE_KEY: sign_params(p, KEY)})
    ring = KeyRing(KEY)
    parse = lambda ring_=None, q=signed: parse_remote_prefill(  # noqa: E731
        q, num_prompt_tokens=2048, block_size=BLOCK, local_tp_size=1, now=now, ring=ring_)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pulls", type=int, default=2000, help="calls per params measurement")
    ap.add_argument("--rtts", type=int, default=2000, help="heartbeat round trips per side-channel measurement")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
