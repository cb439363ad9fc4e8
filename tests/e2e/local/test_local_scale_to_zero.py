"""Scale to zero as a pair on `pdfleet local` with real engines (issue 41). A fleet whose roles both have 0
replicas starts asleep; a burst sent at zero, half through the router and half through `--gateway` (Envoy and
the Endpoint Picker), is held by both front ends, wakes both engines once, and is answered token-identical to a
plain server, nothing lost, nothing answered decode-alone; idle for idleSeconds, both engines stop again. One
cycle here (a wake takes ~13 s on 2 cores); bench/scale_from_zero.py runs 20. The engines are forked by
`pdfleet local`'s pre-imported launcher (its default with scale to zero), so this also checks its engines
answer as a plain server.

Negative control of the identity check: the plain server's answers differ from prompt to prompt (so a
fleet answering one canned output would fail); of the retirement: the engines are checked alive before it."""

from __future__ import annotations

import asyncio
import os
import re
import time

import httpx
import yaml

from local_fleet import REPO, ask_all, local_fleet, metric_sum

from pdfleet.contract.scale_to_zero import (
    DROPPED_REASON_HEADER, REJECTED_NO_ENDPOINTS, REJECTED_WAITING_ROOM_FULL, ROUTER_WAITING_REQUESTS,
)
from pdfleet.operator.local.scale_to_zero import RETIRED_LINE, WAKE_LINE

STZ_CR = REPO / "examples" / "tiny-cpu-scale-to-zero.yaml"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(fleet, text: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while fleet.stderr().count(text) < count:
        assert time.monotonic() < deadline, f"no {count} x {text!r} in:\n{fleet.stderr()[-3000:]}"
        assert fleet.proc.poll() is None, fleet.stderr()[-3000:]
        time.sleep(0.5)


def asleep_cr(tmp_path, **scale_to_zero):
    """The example with both roles at 0 replicas (the pair starts asleep) and these scaleToZero fields."""
    cr = yaml.safe_load(STZ_CR.read_text())
    spec = cr["spec"]
    spec["prefill"]["replicas"] = spec["decode"]["replicas"] = 0
    spec["scaling"]["scaleToZero"].update(scale_to_zero)
    path = tmp_path / "asleep-cr.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


def _pids(fleet) -> list[int]:
    return [int(p) for p in re.findall(r"^started \S+ \(pid (\d+)\)", fleet.stderr(), re.M)]


def test_a_held_burst_wakes_the_pair_and_it_sleeps_when_idle(tmp_path, prompts, reference):
    reqs = [q for q in prompts.identity][:6]
    assert len({tuple(reference[q.label].token_ids) for q in reqs}) > len(reqs) // 2
    with local_fleet(tmp_path / "stz", cr=asleep_cr(tmp_path), extra_args=("--gateway",)) as fleet:
        gateway = None
        while gateway is None:
            line = fleet.next_line(60.0)
            assert line is not None, fleet.stderr()[-3000:]
            if line.startswith("gateway: http"):
                gateway = line[len("gateway: "):]
        _wait(fleet, RETIRED_LINE, 1)  # it starts at zero
        assert fleet.state()["engines"] == [] and _pids(fleet) == []

        async def burst() -> list:  # sent at zero, half through the router, half through the gateway: all held
            return [a for answers in await asyncio.gather(ask_all(fleet.router, reqs[::2], concurrency=3),
                                                          ask_all(gateway, reqs[1::2], concurrency=3))
                    for a in answers]

        answers = asyncio.run(burst())
        order = reqs[::2] + reqs[1::2]
        problems = [f"{q.label}: {a.status} {a.error or a.text[:200]}" for q, a in zip(order, answers)
                    if a.status != 200 or a.error]
        problems += [f"{q.label}: {a.token_ids} != {reference[q.label].token_ids}" for q, a in zip(order, answers)
                     if a.status == 200 and a.token_ids != reference[q.label].token_ids]
        problems += [f"{q.label}: answered {a.fallback}" for q, a in zip(order, answers) if a.fallback]
        assert not problems, problems
        assert fleet.stderr().count(WAKE_LINE) == 1  # one wake for both front ends' held requests
        # forked by the pre-imported launcher, scale to zero's default (operator/local/launcher.py)
        assert fleet.stderr().count("forked by the launcher") == 2, fleet.stderr()[-3000:]
        pids = _pids(fleet)
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        _wait(fleet, RETIRED_LINE, 2)  # idle for idleSeconds: both stop
        assert not any(_alive(pid) for pid in pids), "engines still run at zero"
        assert fleet.state()["engines"] == []


TTL_S = 2  # activationTimeoutSeconds, well under a wake (an engine start: ~13 s here, bench/scale_from_zero.py)


def test_a_pair_that_starts_asleep_answers_past_the_activation_timeout_with_the_reason(tmp_path, prompts, reference):
    """Both roles at 0 replicas: no engine starts until a request. The first request is held and starts the
    wake, but the wake outlasts activationTimeoutSeconds: 503 with the reason rejected-no-endpoints, not before
    the timeout. Negative control, in the same room: a second request the room (maxWaiting 1) cannot hold is
    refused at once (503 rejected-waiting-room-full) while the first is still held, so the wait is the room's
    doing. (That a pair started asleep then serves: the test above.)"""
    q = prompts.identity[0]
    path = asleep_cr(tmp_path, activationTimeoutSeconds=TTL_S, maxWaiting=1, idleSeconds=600)
    with local_fleet(tmp_path / "asleep", cr=path) as fleet:
        _wait(fleet, RETIRED_LINE, 1)
        assert fleet.state()["engines"] == [] and "started " not in fleet.stderr()

        async def at_zero() -> tuple[httpx.Response, float, httpx.Response, bool]:
            async with httpx.AsyncClient(timeout=60.0) as client:
                t0 = time.monotonic()
                held = asyncio.create_task(client.post(fleet.router + q.path, json=q.body))
                while metric_sum((await client.get(fleet.router + "/metrics")).text, ROUTER_WAITING_REQUESTS) < 1:
                    assert not held.done(), held.result().text  # the room holds it
                    await asyncio.sleep(0.05)
                over = await client.post(fleet.router + q.path, json=q.body)
                first_still_held = not held.done()
                first = await held
                return first, time.monotonic() - t0, over, first_still_held

        first, waited, over, first_still_held = asyncio.run(at_zero())
        assert (over.status_code, over.headers.get(DROPPED_REASON_HEADER)) == (503, REJECTED_WAITING_ROOM_FULL)
        assert first_still_held  # refused at once: not after the held request's timeout
        assert (first.status_code, first.headers.get(DROPPED_REASON_HEADER)) == (503, REJECTED_NO_ENDPOINTS)
        assert waited >= TTL_S, f"answered after {waited:.2f}s, before activationTimeoutSeconds"
        deadline = time.monotonic() + 120
        while len(_pids(fleet)) < 2:  # the wake the expired request asked for goes on
            assert time.monotonic() < deadline and fleet.proc.poll() is None, fleet.stderr()[-3000:]
            time.sleep(0.2)
