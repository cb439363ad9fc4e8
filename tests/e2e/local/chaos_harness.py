"""The fault suite: a `pdfleet local` fleet under steady load, one fault at a time, one row each.

A fleet (2 prefill, 1-2 decode, the real CLI as a subprocess) serves a few concurrent
clients through a router this harness runs itself (pdfleet's router, in this process), so
that it can do what Kubernetes does around a pod: mark an endpoint not serving when the
pod is terminating (EndpointSlice ``serving=false, terminating=true``) and serving again
once it is ready. `pdfleet local` restarts an engine that exits.

Each scenario prints one row:

- sent: requests the clients sent during the scenario;
- answered: HTTP 200 with a complete answer;
- identical: answered and token-identical to a single plain vLLM server (same prompts);
- wrong: answered but not identical (must be 0);
- fallback: served by decode alone (``x-pdfleet-fallback``);
- recomputed: KV pulls that failed on decode and were recomputed (decode's
  ``vllm:pdfleet_connector_pull_failures_total``);
- failed: an error the client saw (HTTP error, broken stream);
- lost: sent and never finished, neither answered nor failed (must be 0);
- back_s: seconds from the end of the fault (the signal sent, the process resumed, the
  router started) until a request is served by P/D (no fallback) and token-identical;
- restored_s: seconds from the end of the fault until every engine is healthy again (an
  engine that exited was restarted by `pdfleet local`, which takes long on 2 shared cores).

Used by bench/chaos.py (`make chaos`, every scenario) and tests/e2e/local/test_local_two_prefills.py
(a CI-sized subset that asserts the goals, on the fleet it shares with the KV-aware routing tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import httpx
import yaml

from local_fleet import TINY_CR, Answer, Fleet, Req, ask, metric_sum

from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.contract.env import TEST_STUCK_READS, TEST_WALL_CLOCK_STEP
from pdfleet.connector.router.app import ROUTER_KEY, start_router
from pdfleet.operator.local.health import healthy
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints

LEASE_SECONDS = 20
# pdfleet local restarts an engine that exits; faults make them exit many times.
CHAOS_RUNNER_ARGS = ("--max-restarts", "50")
FALLBACK_HEADER = "x-pdfleet-fallback"


def chaos_cr(workdir: Path, *, prefill: int = 2, decode: int = 1, lease: int = LEASE_SECONDS,
             router: Optional[dict[str, str]] = None) -> Path:
    """The tiny CPU example with more engines and a shorter lease (and ``router``: spec.router)."""
    cr = yaml.safe_load(TINY_CR.read_text())
    cr["spec"]["prefill"]["replicas"] = prefill
    cr["spec"]["decode"]["replicas"] = decode
    cr["spec"]["kvTransfer"]["leaseSeconds"] = lease
    if router:
        cr["spec"]["router"] = dict(router)
    path = workdir / "chaos-cr.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


def fault_hook_env(workdir: Path) -> dict[str, str]:
    """The environment of a fleet whose engines the fault suite can give a stuck READ or a wall-clock
    step (connector/testhooks.py: off while the files do not exist)."""
    return {TEST_STUCK_READS: str(workdir / "fault-stuck-reads"), TEST_WALL_CLOCK_STEP: str(workdir / "fault-wall-step")}


@dataclass
class Outcome:
    req: Req
    answer: Optional[Answer] = None  # None: never finished (lost)


@dataclass
class Row:
    scenario: str
    sent: int = 0
    answered: int = 0
    identical: int = 0
    wrong: int = 0
    fallback: int = 0
    recomputed: int = 0
    failed: int = 0
    lost: int = 0
    back_s: float = float("nan")
    restored_s: float = float("nan")
    notes: list[str] = field(default_factory=list)

    HEADER = ("scenario", "sent", "answered", "identical", "wrong", "fallback", "recomputed", "failed", "lost",
              "back_s", "restored_s")

    def cells(self) -> list[str]:
        return [self.scenario, *(str(getattr(self, k)) for k in self.HEADER[1:-2]), f"{self.back_s:.1f}",
                f"{self.restored_s:.1f}"]


def format_table(rows: list[Row]) -> str:
    table = [list(Row.HEADER)] + [r.cells() for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(Row.HEADER))]
    out = []
    for k, line in enumerate(table):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")
        if k == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    notes = [f"- {r.scenario}: {'; '.join(r.notes)}" for r in rows if r.notes]
    return "\n".join(out + notes)


class Load:
    """`clients` concurrent clients sending prompts in a loop through the router until stopped."""

    def __init__(self, base: str, reqs: list[Req], clients: int = 3, seed: int = 1) -> None:
        self.base = base
        self.reqs = reqs
        self.clients = clients
        self.outcomes: list[Outcome] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._rng = random.Random(seed)

    async def _client(self, http: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            req = self._rng.choice(self.reqs)
            outcome = Outcome(req)
            self.outcomes.append(outcome)
            outcome.answer = await ask_retrying_refused(http, self.base, req)

    async def __aenter__(self) -> "Load":
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(240.0))
        self._tasks = [asyncio.create_task(self._client(self._http)) for _ in range(self.clients)]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        # Every request in flight gets time to finish; what does not is lost.
        done, pending = await asyncio.wait(self._tasks, timeout=240)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._http.aclose()


async def ask_retrying_refused(http: httpx.AsyncClient, base: str, req: Req, *, for_s: float = 30.0) -> Answer:
    """One request; a refused connection (the router is restarting: nothing was sent) is tried again."""
    deadline = time.monotonic() + for_s
    while True:
        answer = await ask(http, base, req)
        if answer.status == 0 and "ConnectError" in answer.error and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            continue
        return answer


def score(row: Row, outcomes: list[Outcome], reference: dict[str, Answer]) -> None:
    for o in outcomes:
        row.sent += 1
        a = o.answer
        if a is None:
            row.lost += 1
            continue
        if a.status != 200 or a.error:
            row.failed += 1
            row.notes.append(f"{o.req.label}: HTTP {a.status} {(a.error or a.text)[:80]}")
            continue
        row.answered += 1
        if a.fallback:
            row.fallback += 1
        ref = reference[o.req.label]
        if a.token_ids == ref.token_ids and a.text == ref.text:
            row.identical += 1
        else:
            row.wrong += 1
            row.notes.append(f"{o.req.label}: {a.token_ids[:8]}... != reference {ref.token_ids[:8]}...")
    if len(row.notes) > 6:
        row.notes[6:] = [f"... {len(row.notes) - 6} more"]


class ChaosFleet:
    """`pdfleet local` (subprocess) plus this harness's router in front of its engines."""

    def __init__(self, workdir: Path, *, prefill: int = 2, decode: int = 1, lease: int = LEASE_SECONDS,
                 router_port: int = 0, fleet: Optional[Fleet] = None) -> None:
        """A fleet of its own, or ``fleet``: one already running (made with ``chaos_cr``'s lease),
        shared with other tests; it is then left running by ``close``."""
        self.workdir = workdir
        self.lease = lease
        workdir.mkdir(parents=True, exist_ok=True)
        self.owns_fleet = fleet is None
        self.fleet = fleet or Fleet(workdir, cr=chaos_cr(workdir, prefill=prefill, decode=decode, lease=lease),
                                    env=fault_hook_env(workdir), extra_args=CHAOS_RUNNER_ARGS)
        # The hooks' files, if the fleet was started with fault_hook_env(its workdir).
        hooks = fault_hook_env(self.fleet.workdir)
        self.stuck_flag, self.step_flag = Path(hooks[TEST_STUCK_READS]), Path(hooks[TEST_WALL_CLOCK_STEP])
        self.router_port = router_port
        self.runner = None
        self.base = ""
        self.not_serving: set[str] = set()
        self.replaced: list[tuple[str, int]] = []  # (engine, old pid) a fault made exit

    # -- lifecycle ------------------------------------------------------------
    async def start(self, warm: Optional[list[Req]] = None) -> None:
        if self.fleet.router is None:
            await asyncio.to_thread(self.fleet.wait_router)
        await self.start_router()
        if warm:
            # A fleet in service is warm: every decode has met every prefill (first handshakes,
            # UCX wireup) before the first fault, so cold-start costs are not counted as faults.
            async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as http:
                for req in warm:
                    await ask(http, self.base, req)

    async def start_router(self) -> None:
        engines = self.engines()
        config = RouterConfig(prefill=tuple(e["url"] for e in engines if e["role"] == "prefill"),
                              decode=tuple(e["url"] for e in engines if e["role"] == "decode"))
        self.runner, self.router_port = await start_router(config, "127.0.0.1", self.router_port)
        self.base = f"http://127.0.0.1:{self.router_port}"
        self._publish()

    async def stop_router(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def close(self) -> None:
        await self.stop_router()
        if self.owns_fleet:
            await asyncio.to_thread(self.fleet.terminate)

    # -- endpoints, as an EndpointSlice would show them -------------------------
    @property
    def router(self):
        return self.runner.app[ROUTER_KEY]

    def _publish(self) -> None:
        engines = self.engines()
        group = RevisionEndpoints(
            "static",
            prefill=tuple(Endpoint(e["url"], e["url"] not in self.not_serving) for e in engines if e["role"] == "prefill"),
            decode=tuple(Endpoint(e["url"], e["url"] not in self.not_serving) for e in engines if e["role"] == "decode"),
        )
        if self.runner is not None:
            self.router.set_endpoints([group])

    def set_serving(self, url: str, serving: bool) -> None:
        (self.not_serving.discard if serving else self.not_serving.add)(url)
        self._publish()

    # -- engines ----------------------------------------------------------------
    def engines(self) -> list[dict[str, Any]]:
        return self.fleet.state()["engines"]

    def engine(self, name: str) -> dict[str, Any]:
        return next(e for e in self.engines() if e["name"] == name)

    async def healthy(self, url: str) -> bool:
        return await asyncio.to_thread(healthy, url)

    async def wait_back(self, name: str, old_pid: Optional[int], timeout: float = 600) -> None:
        """Until engine `name` runs (a new process if it was replaced) and answers /health."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            e = self.engine(name)
            if (old_pid is None or e["pid"] != old_pid) and await self.healthy(e["url"]):
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"{name} not back within {timeout}s")

    async def all_healthy(self) -> bool:
        return all([await self.healthy(e["url"]) for e in self.engines()])

    async def metric(self, role: str, name: str) -> dict[int, float]:
        """{engine pid: value} of a counter on every engine of a role."""
        out: dict[int, float] = {}
        async with httpx.AsyncClient(timeout=10) as http:
            for e in self.engines():
                if e["role"] != role:
                    continue
                try:
                    out[e["pid"]] = metric_sum((await http.get(e["url"] + "/metrics")).text, name)
                except httpx.HTTPError:
                    pass
        return out

    async def back_to_pd(self, probe: Req, reference: dict[str, Answer], since: float,
                         timeout: float = 600) -> float:
        """Seconds from `since` until `probe` is served by P/D (no fallback), token-identical."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
            while time.monotonic() < deadline:
                a = await ask_retrying_refused(http, self.base, probe)
                ref = reference[probe.label]
                if a.status == 200 and not a.fallback and a.token_ids == ref.token_ids:
                    return time.monotonic() - since
                await asyncio.sleep(0.2)
        raise AssertionError("the fleet did not come back to P/D service")

    async def restored(self, since: float, timeout: float = 900) -> float:
        """Seconds from `since` until every engine answers /health (and serves in the router again)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.fleet.state().get("healthy") and await self.all_healthy():
                self.not_serving.clear()
                self._publish()
                return time.monotonic() - since
            await asyncio.sleep(0.5)
        raise AssertionError("the fleet was not restored")


def recomputed(before: dict[int, float], after: dict[int, float]) -> int:
    """Counter increase summed over engines; a restarted engine (new pid) counts from 0."""
    return int(sum(v - before.get(pid, 0.0) for pid, v in after.items()))


# --- faults ----------------------------------------------------------------------------------------------
# Each takes the fleet and returns when the fault is over (the engine may still be coming back).


async def prefill_sigterm(cf: ChaosFleet, notes: list[str]) -> None:
    """A scale-down or rollout: the pod turns terminating (the router stops sending it legs), vLLM drains."""
    e = cf.engine("prefill-0")
    cf.set_serving(e["url"], False)
    os.kill(e["pid"], signal.SIGTERM)
    cf.replaced.append(("prefill-0", e["pid"]))


async def prefill_sigkill(cf: ChaosFleet, notes: list[str]) -> None:
    e = cf.engine("prefill-0")
    os.killpg(e["pgid"], signal.SIGKILL)
    cf.replaced.append(("prefill-0", e["pid"]))


async def decode_sigterm(cf: ChaosFleet, notes: list[str]) -> None:
    e = cf.engine("decode-0")
    cf.set_serving(e["url"], False)
    os.kill(e["pid"], signal.SIGTERM)
    cf.replaced.append(("decode-0", e["pid"]))


async def decode_sigkill(cf: ChaosFleet, notes: list[str]) -> None:
    e = cf.engine("decode-0")
    os.killpg(e["pgid"], signal.SIGKILL)
    cf.replaced.append(("decode-0", e["pid"]))


async def router_restart(cf: ChaosFleet, notes: list[str]) -> None:
    await cf.stop_router()
    await asyncio.sleep(1.0)
    await cf.start_router()


def _flood(port: int, count: int) -> int:
    """Garbage, unsigned and wrongly signed messages at one side channel; returns how many were sent."""
    import msgspec
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100000)
    sock.connect(f"tcp://127.0.0.1:{port}")
    hs = msgspec.msgpack.encode({"type": "hb", "id": 1, "request_ids": ["x"]})
    rng = random.Random(port)
    sent = 0
    try:
        for i in range(count):
            kind = i % 4
            if kind == 0:
                frames = [rng.randbytes(rng.randint(1, 512))]
            elif kind == 1:
                frames = [hs]  # well-formed but unsigned
            elif kind == 2:
                frames = [hs, rng.randbytes(64)]  # a forged auth frame
            else:
                frames = [b"\x80\x04\x95cos\nsystem\n."]  # a pickle
            sock.send_multipart(frames)
            sent += 1
    finally:
        sock.close()
    return sent


async def garbage_flood(cf: ChaosFleet, notes: list[str], count: int = 20000) -> None:
    before = await cf.metric("prefill", exported_name("messages_rejected") + "_total")
    ports = [e["side_channel_port"] for e in cf.engines() if e["role"] == "prefill"]
    sent = sum(await asyncio.gather(*(asyncio.to_thread(_flood, p, count) for p in ports)))
    await asyncio.sleep(3.0)
    after = await cf.metric("prefill", exported_name("messages_rejected") + "_total")
    notes.append(f"{sent} garbage messages sent, {recomputed(before, after)} counted as rejected so far")


def _fleet_key(cf: ChaosFleet) -> bytes:
    from pdfleet.connector.adapter.config import read_secret_file
    from pdfleet.operator.plan.engine import SECRET_FILE

    return read_secret_file(str(cf.fleet.run_dir / SECRET_FILE))


def _deep_flood(port: int, key: bytes, count: int) -> int:
    """Signed heartbeats carrying an extra field nested 3,000 deep (issue 19 row 1: a key holder's
    ~3 KB message that used to kill the side-channel thread)."""
    import msgspec
    import zmq

    from pdfleet.connector.transfer import auth
    from pdfleet.connector.transfer.sidechannel import secure_client_socket

    sock = secure_client_socket(zmq.Context.instance(), key)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    base = msgspec.msgpack.encode({"type": "hb", "id": 1, "request_ids": ["x"]})
    payload = b"\x84" + base[1:] + b"\xa1z" + b"\x91" * 3000 + b"\xc0"
    try:
        for _ in range(count):
            sock.send_multipart([payload, auth.sign(key, payload, now=time.time())])
        time.sleep(0.5)
    finally:
        sock.close()
    return count


async def deep_messages(cf: ChaosFleet, notes: list[str], count: int = 200) -> None:
    """Row 1: deeply nested, correctly signed messages at every prefill side channel; the fleet keeps serving."""
    key = _fleet_key(cf)
    before = await cf.metric("prefill", exported_name("messages_too_deep") + "_total")
    ports = [e["side_channel_port"] for e in cf.engines() if e["role"] == "prefill"]
    sent = sum(await asyncio.gather(*(asyncio.to_thread(_deep_flood, p, key, count) for p in ports)))
    await asyncio.sleep(2.0)
    after = await cf.metric("prefill", exported_name("messages_too_deep") + "_total")
    restarts = await cf.metric("prefill", exported_name("side_channel_restarts") + "_total")
    notes.append(f"{sent} nested messages sent, {recomputed(before, after)} counted too_deep,"
                 f" side-channel restarts {int(sum(restarts.values()))}")


async def unfinished_message_flood(cf: ChaosFleet, notes: list[str], seconds: float = 5.0) -> None:
    """Row 2: a peer without the key streams one never-ending multipart message at every prefill side
    channel (raw ZMTP); the prefills' RSS is measured."""
    import psutil

    import zmtp_flood

    prefills = [e for e in cf.engines() if e["role"] == "prefill"]

    def rss() -> int:
        total = 0
        for e in prefills:
            try:
                proc = psutil.Process(e["pid"])
                total += sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
            except psutil.Error:
                pass
        return total

    before = rss()
    sent = sum(await asyncio.gather(*(asyncio.to_thread(zmtp_flood.flood_server, "127.0.0.1",
                                                        e["side_channel_port"], seconds) for e in prefills)))
    grown = rss() - before
    notes.append(f"keyless peer streamed {sent / 2**20:.0f} MiB of unfinished messages;"
                 f" prefill RSS (engines and their children) grew {grown / 2**20:.1f} MiB")


async def client_aborts(cf: ChaosFleet, notes: list[str], reqs: list[Req], count: int = 100) -> dict[str, float]:
    """`count` streamed requests cut by their clients at random moments (prefill, between legs, pull, stream).

    Returns the prefills' lease counters measured 1 s after the last abort."""
    rng = random.Random(7)
    metrics = ("leases_held", "leases_completed", "leases_expired", "leases_released")
    before = {m: await cf.metric("prefill", exported_name(m) + "_total") for m in metrics}

    async def one(i: int) -> None:
        req = rng.choice(reqs)
        body = dict(req.body, stream=True, max_tokens=48)
        async with httpx.AsyncClient(timeout=60) as http:
            try:
                async with asyncio.timeout(rng.uniform(0.05, 1.5)):
                    async with http.stream("POST", cf.base + req.path, json=body) as resp:
                        async for _ in resp.aiter_lines():
                            pass
            except (TimeoutError, httpx.HTTPError):
                pass

    await asyncio.gather(*(one(i) for i in range(count)))
    await asyncio.sleep(1.0)
    async with httpx.AsyncClient(timeout=60) as http:  # a step on every engine: counters published
        await ask(http, cf.base, reqs[0])
    await asyncio.sleep(0.5)
    last_abort = time.monotonic() - 1.5

    async def leases() -> dict[str, float]:
        async with httpx.AsyncClient(timeout=60) as http:
            await ask(http, cf.base, reqs[0])  # makes every engine step and publish its counters
        after = {m: await cf.metric("prefill", exported_name(m) + "_total") for m in metrics}
        d = {m: float(recomputed(before[m], after[m])) for m in metrics}
        d["active"] = d["leases_held"] - d["leases_completed"] - d["leases_expired"] - d["leases_released"]
        return d

    delta = await leases()
    notes.append("leases ~1.5 s after the last abort: " + ", ".join(f"{k}={int(v)}" for k, v in delta.items()))
    # Then until every lease has ended: were they freed (released, read) or did some wait for expiry?
    final = delta
    while final["active"] > 0 and time.monotonic() - last_abort < cf.lease + 10:
        await asyncio.sleep(0.5)
        final = await leases()
    delta["all_freed_s"] = time.monotonic() - last_abort if final["active"] <= 0 else float("inf")
    delta["expired_in_the_end"] = final["leases_expired"]
    notes.append(f"all freed {delta['all_freed_s']:.1f}s after the last abort, {int(final['leases_expired'])} expired"
                 f" (lease {cf.lease}s)")
    return delta


async def decode_slowed(cf: ChaosFleet, notes: list[str]) -> None:
    """decode-0 stopped (SIGSTOP) longer than a lease: prefill's leases of its requests expire."""
    e = cf.engine("decode-0")
    os.killpg(e["pgid"], signal.SIGSTOP)
    try:
        await asyncio.sleep(cf.lease + 5)
    finally:
        os.killpg(e["pgid"], signal.SIGCONT)


async def prefill_unreachable(cf: ChaosFleet, notes: list[str], seconds: float = 8.0) -> None:
    """prefill-0 stopped (SIGSTOP: its side channel and HTTP port stop answering) for a while."""
    e = cf.engine("prefill-0")
    os.killpg(e["pgid"], signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.killpg(e["pgid"], signal.SIGCONT)


async def counters(cf: ChaosFleet, names: dict[str, str]) -> dict[str, dict[int, float]]:
    """{stats key: {pid: value}} of counters, by role: ``names`` maps stats key -> role."""
    return {k: await cf.metric(role, exported_name(k) + "_total") for k, role in names.items()}


def deltas(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, int]:
    return {k: recomputed(before[k], after[k]) for k in before}


# Prompts that each row sends itself, beside the load: the load repeats a small set, which decode soon
# holds in its own prefix cache (it then pulls nothing); these are sent once per fleet, so their
# whole blocks are pulled. Multi-block prompts of the identity set, no two rows sharing one. The stuck
# READ row sends its first probe before the fault (how long a pull-served request takes here).
FAULT_PROBES = {
    "stuck READ": ("chat: long", "1000 tokens", "500 tokens", "200 tokens"),
    "wall-clock step": ("100 tokens", "65 tokens", "64 tokens", "stream: 150 tokens"),
}


def fault_probes(prompts: Any) -> dict[str, list[Req]]:
    """{scenario: its probe requests} from local_fleet.prompt_sets()."""
    by_label = {r.label: r for r in prompts.identity}
    return {name: [by_label[label] for label in labels] for name, labels in FAULT_PROBES.items()}


async def timed(cf: ChaosFleet, reqs: list[Req]) -> list[tuple[float, Outcome]]:
    """The requests at once; (seconds, outcome) each."""
    async def one(req: Req) -> tuple[float, Outcome]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
            t0 = time.monotonic()
            answer = await ask_retrying_refused(http, cf.base, req)
            return time.monotonic() - t0, Outcome(req, answer)
    return list(await asyncio.gather(*(one(r) for r in reqs)))


async def publish_counters(cf: ChaosFleet, req: Req) -> None:
    async with httpx.AsyncClient(timeout=60) as http:  # a step on every engine: counters published
        await ask(http, cf.base, req)
    await asyncio.sleep(0.5)


async def stuck_reads(cf: ChaosFleet, notes: list[str], probes: list[Req], after: Req,
                      baseline: bool = True) -> dict[str, Any]:
    """Issue 19 row 3: every decode READ posted while the hook's file exists hangs (never posted,
    PDFLEET_TEST_STUCK_READS), while heartbeats keep its lease alive: only decode's read bound
    (read_timeout_floor + bytes at read_floor_bandwidth) can end it: cancelled, released, recomputed.
    The file stays until the probes (prompts decode has not seen, so they pull) are answered; with
    ``baseline`` the first probe is sent before the fault instead (how long a pulled request takes)."""
    names = {"reads_timed_out": "decode", "failures": "decode", "releases": "decode",
             "leases_released": "prefill", "leases_expired": "prefill"}
    normal = await timed(cf, probes[:1]) if baseline else []
    probes = probes[1:] if baseline else probes
    logs = {path: path.stat().st_size for path in cf.fleet.run_dir.glob("decode-*.log")}
    before = await counters(cf, names)
    cf.stuck_flag.touch()
    try:
        probed = await timed(cf, probes)
    finally:
        cf.stuck_flag.unlink(missing_ok=True)
    await publish_counters(cf, after)
    d = deltas(before, await counters(cf, names))
    secs = [s for s, _ in probed]
    # Decode's worker logs each failed pull (the sink's own line is rate-limited), a cancelled READ with
    # the time from its post to its cancel.
    failed_after = sorted(float(m) for path, size in logs.items()
                          for m in re.findall(r"will recompute or fail it: .*? cancelled after ([\d.]+)s",
                                              path.read_bytes()[size:].decode(errors="replace")))
    notes.append((f"a probe before the fault answered in {normal[0][0]:.2f}s; " if normal else "")
                 + f"{len(secs)} probes with their READs stuck answered in {min(secs):.2f}-{max(secs):.2f}s;"
                 f" stuck READs cancelled after"
                 f" {', '.join(f'{x:.2f}' for x in failed_after)}s; " + ", ".join(f"{k}={v}" for k, v in d.items()))
    return {"normal_s": normal[0][0] if normal else None, "stuck_s": secs, "failed_after_s": failed_after,
            "outcomes": [o for _, o in normal + probed], **d}


async def wall_clock_step(cf: ChaosFleet, notes: list[str], probes: list[Req], after: Req,
                          step: Optional[float] = None, seconds: float = 6.0) -> dict[str, Any]:
    """Issue 19 row 6: every engine's wall clock (time.time, PDFLEET_TEST_WALL_CLOCK_STEP) jumps
    ``step`` seconds ahead (default: the lease + 5 s; when leases ran on the wall clock, such a step
    freed every lease held at that moment), stays there ``seconds``, then jumps back. The probes
    (prompts decode pulls) are sent just before the step, so that their leases are held across it.
    Leases run on the monotonic clock: nothing may expire, fail or differ. Until kv_transfer_params
    1.3 the params carried ``remote_lease_expiry``, which decode's scheduler checked against its own
    clock, so params made before a forward step and checked after it could be refused (computed on
    decode: counted as params_rejected, correct output); 1.3 params carry ``remote_lease_seconds``,
    a duration read on decode's monotonic clock, so none should be. (The default step stays
    inside the side channel's 30 s replay window: a larger one also drops, counted, the few messages
    signed before it and read after it; they are retried.)"""
    step = float(cf.lease + 5 if step is None else step)
    names = {"leases_expired": "prefill", "leases_completed": "prefill", "expired_leases": "decode",
             "failures": "decode", "heartbeat_retries": "decode", "messages_replayed": "prefill",
             "params_rejected": "decode"}
    before = await counters(cf, names)
    probing = asyncio.create_task(timed(cf, probes))
    await asyncio.sleep(0.3)  # the probes are in prefill or wait for their pulls: leases held across the step
    cf.step_flag.write_text(f"{step}")
    try:
        t0 = time.monotonic()
        probed = await probing
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    finally:
        cf.step_flag.unlink(missing_ok=True)
    await asyncio.sleep(0.5)  # the engines see the file go within 0.05 s
    await publish_counters(cf, after)
    d = deltas(before, await counters(cf, names))
    notes.append(f"wall clock {step:+g}s for {seconds:g}s then back, {len(probes)} probes across the step: "
                 + ", ".join(f"{k}={v}" for k, v in d.items()))
    return {"step_s": step, "outcomes": [o for _, o in probed], **d}


async def replayed_params(cf: ChaosFleet, notes: list[str], reqs: list[Req], prompts: int = 3,
                          replays: int = 2) -> dict[str, Any]:
    """Issue 30: a client that can reach the engines takes signed kv_transfer_params from a prefill
    (its own prefill leg, ``do_remote_decode``), has a decode read them (the legitimate reader), then
    replays them to every decode, ``replays`` times each, while the load goes on and the prefill gives
    those blocks to other requests. Params 1.4 leases are single-use: each replay's pull is refused
    before any READ (counted by the prefill as ``spent_lease_refused``) and decode computes the prompt
    itself, so every answer is still token-identical. A fresh ``cache_salt`` per request keeps decode's
    prefix cache from answering instead of a pull. Legitimate readers lose nothing: decode's pull
    failures grow by the replays at most, and no prefill lease expires. Prompts of two blocks or more,
    so that every replay reaches a pull."""
    names = {"spent_lease_refused": "prefill", "lease_proof_refused": "prefill", "leases_expired": "prefill",
             "failures": "decode", "transfers": "decode"}
    before = await counters(cf, names)
    prefills = [e["url"] for e in cf.engines() if e["role"] == "prefill"]
    decodes = [e["url"] for e in cf.engines() if e["role"] == "decode"]
    rng = random.Random(30)
    outcomes: list[Outcome] = []
    sent_replays = 0
    salt = iter(range(10**6))

    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        # prompts of two full blocks or more (a shorter one pulls at most one, under a block none)
        spans = [r for r in reqs if not r.stream and isinstance(r.body.get("prompt"), list)
                 and len(r.body["prompt"]) >= 64]
        for req in spans[:prompts]:
            body = dict(req.body, cache_salt=f"replay-{rng.random()}-{next(salt)}")
            leg = dict(body, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
            resp = await http.post(prefills[0] + req.path, json=leg)
            params = resp.json().get("kv_transfer_params") if resp.status_code == 200 else None
            if not params or not params.get("do_remote_prefill"):
                notes.append(f"{req.label}: no params from the prefill leg (HTTP {resp.status_code})")
                continue
            legit = Req(req.label, req.path, dict(body, kv_transfer_params=params))
            outcomes.append(Outcome(legit, await ask(http, decodes[0], legit)))
            await asyncio.sleep(1.0)  # the load goes on: the prefill reuses the freed blocks
            for url in decodes:
                for _ in range(replays):
                    replay = Req(req.label, req.path, dict(req.body, cache_salt=f"replay-{next(salt)}",
                                                           kv_transfer_params=params))
                    outcomes.append(Outcome(replay, await ask(http, url, replay)))
                    sent_replays += 1
    await publish_counters(cf, reqs[0])
    d = deltas(before, await counters(cf, names))
    legit_lost = max(0, d["failures"] - sent_replays) + d["leases_expired"]
    notes.append(f"{sent_replays} replays of spent params to {len(decodes)} decode(s): "
                 + ", ".join(f"{k}={v}" for k, v in d.items()) + f"; leases lost by legitimate readers {legit_lost}")
    return {"replays": sent_replays, "legit_lost": legit_lost, "outcomes": outcomes, **d}


# Faults that need no engine restart first; then one restart each (minutes on 2 shared cores).
SCENARIOS: dict[str, Callable[..., Awaitable[Any]]] = {
    "replayed params under load": replayed_params,
    "side-channel garbage flood": garbage_flood,
    "deeply nested signed messages": deep_messages,
    "keyless unfinished-message flood": unfinished_message_flood,
    "100 client aborts": client_aborts,
    "stuck READ": stuck_reads,
    "wall-clock step": wall_clock_step,
    "router restart": router_restart,
    "prefill side channel unreachable": prefill_unreachable,
    "decode slowed past its leases": decode_slowed,
    "prefill SIGTERM": prefill_sigterm,
    "prefill SIGKILL": prefill_sigkill,
    "decode SIGTERM": decode_sigterm,
    "decode SIGKILL": decode_sigkill,
}


async def run_scenario(cf: ChaosFleet, name: str, reqs: list[Req], reference: dict[str, Answer], *,
                       warm_s: float = 3.0, after_s: float = 5.0, clients: int = 3, restore: bool = True,
                       **fault_kwargs: Any) -> tuple[Row, Any]:
    """Steady load, the fault, more load; then the time back to P/D service and to a whole fleet."""
    row = Row(name)
    fault = SCENARIOS[name]
    before = await cf.metric("decode", exported_name("failures") + "_total")
    result = None
    cf.replaced = []
    async with Load(cf.base, reqs, clients=clients) as load:
        await asyncio.sleep(warm_s)
        if fault in (client_aborts, replayed_params):
            fault_kwargs.setdefault("reqs", reqs)
        if fault in (stuck_reads, wall_clock_step):
            fault_kwargs.setdefault("after", reqs[0])
        result = await fault(cf, row.notes, **fault_kwargs)
        ended = time.monotonic()
        row.back_s = await cf.back_to_pd(reqs[0], reference, ended)
        await asyncio.sleep(after_s)
        if restore:
            try:
                for engine, old_pid in cf.replaced:  # the load goes on while pdfleet local restarts it
                    await cf.wait_back(engine, old_pid)
                row.restored_s = await cf.restored(ended)
            except AssertionError as exc:  # recorded in the row; the next scenario shows what it costs
                row.restored_s = float("inf")
                row.notes.insert(0, f"not restored: {exc}")
    after = await cf.metric("decode", exported_name("failures") + "_total")
    row.recomputed = recomputed(before, after)
    extra = result.pop("outcomes", []) if isinstance(result, dict) else []  # a fault's own probes
    score(row, load.outcomes + extra, reference)
    return row, result


def write_report(path: Path, rows: list[Row], extra: Optional[dict[str, Any]] = None) -> None:
    path.write_text(json.dumps({"rows": [r.__dict__ for r in rows], **(extra or {})}, indent=1, default=str))

