"""The router's KV event subscribers against real ZMQ publishers (PUB + replay ROUTER, vLLM's wire format),
with fake HTTP engines: prefix-aware choice, replay, restart, endpoint gone, and a fuzz table of bad
messages that are dropped, counted, and leave routing as it was."""

from __future__ import annotations

import asyncio
import pickle
import threading

import msgspec
import pytest
import zmq
from waits import until

from pdfleet.connector.router.app import ROUTER_KEY, start_router
from pdfleet.connector.serving.kvaware.kv_events import decode_message
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, HashConfig


BS = 4
HASHER = BlockHasher(HashConfig(BS))
PROMPT = list(range(100, 132))  # 8 blocks
KEYS = HASHER.keys(PROMPT)
enc = msgspec.msgpack.encode


def batch(*events):
    return enc([1.0, list(events), 0])


def stored(keys, medium="GPU"):
    return {"type": "BlockStored", "block_hashes": list(keys), "parent_block_hash": None, "token_ids": [],
            "block_size": BS, "lora_id": None, "medium": medium, "lora_name": None, "group_idx": 0}


class Publisher:
    """A stand-in for one engine's vLLM publisher: PUB + a replay ROUTER serving a buffer, in a thread."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay_port = self.replay.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoints(self) -> str:
        return f"tcp://127.0.0.1:{self.port},tcp://127.0.0.1:{self.replay_port}"

    def publish(self, payload: bytes, *, lose: bool = False) -> None:
        with self._lock:
            seq, self.seq = self.seq, self.seq + 1
            self.buffer.append((seq, payload))
            if not lose:
                self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def raw(self, frames: list[bytes]) -> None:
        with self._lock:
            self.pub.send_multipart(frames)

    def restart(self) -> None:
        with self._lock:
            self.seq, self.buffer = 0, []

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.replay, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            client, _, start = self.replay.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            with self._lock:
                for seq, payload in self.buffer:
                    if seq >= start_seq:
                        self.replay.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), payload])
                self.replay.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(0)
        self.replay.close(0)


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    pubs: list[Publisher] = []
    yield ctx, pubs
    for p in pubs:
        p.close()
    ctx.term()


async def serve(fleet, config: RouterConfig):
    """The real router app on a free port (stopped with the fleet); returns (url, router)."""
    runner, port = await start_router(config)
    fleet.runners.append(runner)
    return f"http://127.0.0.1:{port}", runner.app[ROUTER_KEY]


async def start(fleet, pubs_by_prefill, **overrides):
    """A router over two fake prefills (each with a publisher) and one fake decode; returns (url, router)."""
    prefill = [await fleet.engine(f"p{i}", "prefill") for i in range(len(pubs_by_prefill))]
    decode = await fleet.engine("d0", "decode")
    config = RouterConfig(
        prefill=tuple(p.url for p in prefill), decode=(decode.url,), block_size=BS, decode_policy="leastOutstanding",
        kv_events=tuple((p.url, pub.endpoints) for p, pub in zip(prefill, pubs_by_prefill)), eject_s=0.0,
        **overrides,
    )
    url, router = await serve(fleet, config)
    if router.prefix.enabled("prefill"):
        await until(lambda: all(s.synced for s in router.prefix.states.values()))
    return url, router, prefill


async def served_by(fleet, url, prompt):
    async with fleet.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                 "max_tokens": 2}) as resp:
        assert resp.status == 200, await resp.text()
    return [e.name for e in fleet.engines if e.role == "prefill" and e.received and e.received[-1].body
            and e.received[-1].body.get("prompt") == prompt][-1:]


def index(router, url):
    return router.prefix.states[url].index.hashes


def counter(router, name, **labels):
    for metric in router.metrics.registry.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


async def test_prefill_goes_where_the_events_say_the_prefix_is(fleet, zctx):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    url, router, prefill = await start(fleet, pubs)
    pubs[1].publish(batch(stored(KEYS[:6])))
    await until(lambda: len(index(router, prefill[1].url)) == 6)
    for _ in range(4):  # sequential: load never outweighs the cache
        assert await served_by(fleet, url, PROMPT) == ["p1"]
    assert counter(router, "pdfleet_router_prefix_cached_tokens_total", leg="prefill", kind="chosen",
                   source="events", medium="GPU") == 4 * 6 * BS
    # an unrelated prompt balances as before (no cache anywhere): both prefills get some
    others = [await served_by(fleet, url, list(range(1000 + 40 * i, 1040 + 40 * i))) for i in range(4)]
    assert {"p0", "p1"} <= {o[0] for o in others}


async def test_least_outstanding_policy_ignores_the_cache(fleet, zctx):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    url, router, prefill = await start(fleet, pubs, prefill_policy="leastOutstanding")
    pubs[1].publish(batch(stored(KEYS)))
    await asyncio.sleep(0.2)
    got = {(await served_by(fleet, url, PROMPT))[0] for _ in range(4)}
    assert got == {"p0", "p1"}  # rotation, not the cache (negative control of the test above)


async def test_lost_message_is_replayed_and_restart_resets(fleet, zctx):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    url, router, prefill = await start(fleet, pubs)
    p1 = prefill[1].url
    pubs[1].publish(batch(stored(KEYS[:2])))
    pubs[1].publish(batch(stored(KEYS[2:4])), lose=True)  # never reaches the SUB socket
    pubs[1].publish(batch(stored(KEYS[4:6])))
    await until(lambda: len(index(router, p1)) == 6)  # the gap was filled from the replay buffer
    assert 1 in pubs[1].replay_requests
    assert counter(router, "pdfleet_router_kv_index_resets_total", endpoint=router.labels(p1), reason="gap") == 0
    pubs[1].restart()  # the engine started over: what it cached is gone
    pubs[1].publish(batch(stored(KEYS[:1])))
    await until(lambda: len(index(router, p1)) == 1)
    assert counter(router, "pdfleet_router_kv_index_resets_total", endpoint=router.labels(p1), reason="restart") == 1


async def test_endpoint_gone_drops_its_index(fleet, zctx):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    url, router, prefill = await start(fleet, pubs)
    pubs[1].publish(batch(stored(KEYS)))
    await until(lambda: len(index(router, prefill[1].url)) == len(KEYS))
    decode = router.selection.revision.decode
    router.set_endpoints([RevisionEndpoints("static", prefill=(Endpoint(prefill[0].url),), decode=decode)])
    assert prefill[1].url not in router.prefix.states
    assert await served_by(fleet, url, PROMPT) == ["p0"]


async def test_late_subscriber_learns_the_past_from_the_replay(fleet, zctx):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    for k in range(0, len(KEYS), 2):  # published before any router existed
        pubs[1].publish(batch(stored(KEYS[k:k + 2])))
    url, router, prefill = await start(fleet, pubs)
    assert len(index(router, prefill[1].url)) == len(KEYS)
    assert await served_by(fleet, url, PROMPT) == ["p1"]


FUZZ = [
    ("garbage", [b"", (1).to_bytes(8, "big"), b"\xc1\xff garbage"], "malformed"),
    ("pickle", [b"", (1).to_bytes(8, "big"), pickle.dumps([1.0, [stored(KEYS)], 0])], "malformed"),
    ("truncated", [b"", (1).to_bytes(8, "big"), batch(stored(KEYS))[:-5]], "malformed"),
    ("huge", [b"", (1).to_bytes(8, "big"), b"\x00" * (8 * 1024 * 1024 + 1024)], "oversized"),
    # issue 20 row 4: 1 KB of nesting made the decoder raise and ended the subscriber for good (now refused
    # before decoding, by its depth: issue 19 row 1)
    ("nested", [b"", (1).to_bytes(8, "big"), b"\x93" + enc(1.0) + b"\x91" * 1000 + b"\xc0\x00"], "too_deep"),
    ("wrong types", [b"", (1).to_bytes(8, "big"), enc([1.0, [{**stored(KEYS), "block_hashes": {"a": 1}}], 0])],
     "malformed"),
    ("wrong frame count", [batch(stored(KEYS))], "frames"),
    ("bad sequence", [b"", b"\x01", batch(stored(KEYS))], "bad_seq"),
    ("other engine's rank", [b"", (1).to_bytes(8, "big"), enc([1.0, [stored(KEYS)], 3])], "dp_rank"),
]


@pytest.mark.parametrize("label, frames, reason", FUZZ, ids=[f[0] for f in FUZZ])
async def test_fuzzed_event_messages_are_dropped_counted_and_change_no_route(fleet, zctx, label, frames, reason):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    url, router, prefill = await start(fleet, pubs)
    p0, p1 = prefill[0].url, prefill[1].url
    pubs[1].publish(batch(stored(KEYS[:3])))  # seq 0: p1 holds 3 blocks
    await until(lambda: len(index(router, p1)) == 3)
    if label == "nested":
        # msgspec refuses nesting through Python's recursion limit, which other code in the process may have
        # raised: decoded that deep, the batch is refused by its shape instead. Either way dropped and counted.
        reason = decode_message(frames)
        assert reason in ("too_deep", "malformed"), reason
    pubs[0].raw(frames)  # the bad message claims p0 holds everything
    await until(lambda: counter(router, "pdfleet_router_kv_events_dropped_total", endpoint=router.labels(p0), reason=reason) == 1)
    assert len(index(router, p0)) == 0 and len(index(router, p1)) == 3
    assert await served_by(fleet, url, PROMPT) == ["p1"]  # routing as before the bad message
    # the stream goes on: the next good message of p0 applies
    pubs[0].publish(batch(stored(KEYS)))
    await until(lambda: len(index(router, p0)) == len(KEYS))


async def test_a_publisher_the_router_was_not_told_about_changes_nothing(fleet, zctx):
    """'Unknown endpoint': events from a socket outside the fleet never reach any index."""
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    rogue = Publisher(ctx)
    pubs.append(rogue)
    url, router, prefill = await start(fleet, pubs[:2])
    rogue.publish(batch(stored(KEYS)))
    await asyncio.sleep(0.2)
    assert all(len(s.index) == 0 for s in router.prefix.states.values())
    assert len(router.prefix.states) == 2


async def test_decode_leg_goes_to_the_decode_that_holds_the_prefix(fleet, zctx):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    prefill = await fleet.engine("p0", "prefill")
    decodes = [await fleet.engine(f"d{i}", "decode") for i in range(2)]
    config = RouterConfig(prefill=(prefill.url,), decode=tuple(d.url for d in decodes), block_size=BS, eject_s=0.0,
                          kv_events=tuple((d.url, pub.endpoints) for d, pub in zip(decodes, pubs)))
    url, router = await serve(fleet, config)
    await until(lambda: all(s.synced for s in router.prefix.states.values()))
    pubs[1].publish(batch(stored(KEYS[:5])))
    await until(lambda: len(index(router, decodes[1].url)) == 5)
    for _ in range(3):
        async with fleet.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT,
                                                                     "max_tokens": 2}) as resp:
            assert resp.status == 200
    assert [len(d.received) for d in decodes] == [0, 3]
    assert counter(router, "pdfleet_router_prefix_cached_tokens_total", leg="decode", kind="chosen",
                   source="events", medium="GPU") == 3 * 5 * BS


@pytest.mark.parametrize("weights, chosen", [
    (None, 1),  # default weights: 5 blocks in d1's CPU tier (0.75 x 20 tokens) beat 2 on d0's GPU (8)
    ((("GPU", 1.0), ("CPU", 0.0), ("STORAGE", 0.0)), 0),  # negative control: GPU only, as before issue 40
])
async def test_decode_leg_goes_to_the_decode_whose_cpu_tier_holds_the_prefix(fleet, zctx, weights, chosen):
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    prefill = await fleet.engine("p0", "prefill")
    decodes = [await fleet.engine(f"d{i}", "decode") for i in range(2)]
    config = RouterConfig(prefill=(prefill.url,), decode=tuple(d.url for d in decodes), block_size=BS, eject_s=0.0,
                          kv_events=tuple((d.url, pub.endpoints) for d, pub in zip(decodes, pubs)),
                          **({"prefix_tier_weights": weights} if weights else {}))
    url, router = await serve(fleet, config)
    await until(lambda: all(s.synced for s in router.prefix.states.values()))
    pubs[0].publish(batch(stored(KEYS[:2])))
    # the OffloadingConnector's CPU-tier stores, one 1-block chunk each, one of them re-announced and removed once
    pubs[1].publish(batch(*(stored([k], medium="CPU") for k in KEYS[:5]), stored(KEYS[1:2], medium="CPU"),
                          {"type": "BlockRemoved", "block_hashes": KEYS[1:2], "medium": "CPU", "group_idx": 0}))
    await until(lambda: len(index(router, decodes[0].url)) == 2 and router.prefix.states[decodes[1].url].received)
    assert len(router.prefix.states[decodes[1].url].index) == (5 if weights is None else 0)
    for _ in range(3):
        async with fleet.session.post(url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT,
                                                                     "max_tokens": 2}) as resp:
            assert resp.status == 200
    assert [len(d.received) for d in decodes] == ([0, 3] if chosen else [3, 0])
    medium, tokens = ("CPU", 5 * BS) if chosen else ("GPU", 2 * BS)
    assert counter(router, "pdfleet_router_prefix_cached_tokens_total", leg="decode", kind="chosen",
                   source="events", medium=medium) == 3 * tokens


async def test_a_replay_socket_that_never_answers_does_not_stall_the_stream(fleet, zctx, tmp_path):
    """A replay endpoint nobody binds (an engine still starting, or gone): live batches still apply."""
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    prefill = [await fleet.engine(f"p{i}", "prefill") for i in range(2)]
    decode = await fleet.engine("d0", "decode")
    dead = f"ipc://{tmp_path}/nobody-binds-this"
    config = RouterConfig(prefill=tuple(p.url for p in prefill), decode=(decode.url,), block_size=BS, eject_s=0.0,
                          decode_policy="leastOutstanding",
                          kv_events=((prefill[1].url, f"tcp://127.0.0.1:{pubs[1].port},{dead}"),))
    _, router = await serve(fleet, config)
    await asyncio.sleep(0.3)  # SUB connected
    pubs[1].publish(batch(stored(KEYS[:2])))
    pubs[1].publish(batch(stored(KEYS[2:4])))
    await until(lambda: len(index(router, prefill[1].url)) == 4, timeout=10)
    assert router.prefix.states[prefill[1].url].synced


async def test_more_publishers_shrink_every_share_and_keep_what_the_router_knows(fleet, zctx):
    """Issue 20 (total bound): a new publisher makes every publisher's share smaller; running subscribers
    start again with the smaller queues, resuming on the index they had (no reset, no replay from 0)."""
    ctx, pubs = zctx
    pubs += [Publisher(ctx), Publisher(ctx)]
    url, router, prefill = await start(fleet, pubs[:1], kv_events_max_total_bytes=16 * 2**20)
    p0 = prefill[0].url
    pubs[0].publish(batch(stored(KEYS[:3])))
    await until(lambda: len(index(router, p0)) == 3)
    before = router.prefix.budget
    replays = len(pubs[0].replay_requests)
    old_task = router.prefix._tasks[p0]
    p1 = await fleet.engine("p1", "prefill")
    groups = list(router.groups.values())
    g = groups[0]
    router.set_endpoints([RevisionEndpoints(g.revision, (*g.prefill, Endpoint(p1.url, kv_events=pubs[1].endpoints.split(",")[0],
                                                                           kv_events_replay=pubs[1].endpoints.split(",")[1])),
                                            g.decode)])
    after = router.prefix.budget
    assert after.max_bytes < before.max_bytes and after.index_blocks < before.index_blocks
    assert old_task.cancelled() or old_task.done() or router.prefix._tasks[p0] is not old_task
    assert router.prefix._budgets[p0] == after and router.prefix.states[p0].index.max_blocks == after.index_blocks
    await asyncio.sleep(0.5)  # the new SUB socket connects (a batch before that is lost: then a gap, replayed)
    pubs[0].publish(batch(stored(KEYS[3:5])))  # the resumed subscriber goes on from seq 1
    pubs[0].publish(batch(stored(KEYS[5:6])))
    await until(lambda: len(index(router, p0)) == 6)
    assert counter(router, "pdfleet_router_kv_index_resets_total", endpoint=router.labels(p0)) == 0
    assert 0 not in pubs[0].replay_requests[replays:]  # resumed: never replayed from the start
