"""The keyed work queue: one run per key at a time, bursts collapse, failures back off, nothing crashes."""

from __future__ import annotations

import asyncio

from pdfleet.operator.reconcile.workqueue import WorkQueue


async def test_a_burst_collapses_and_a_key_never_runs_twice_at_once():
    running: set[str] = set()
    overlaps: list[str] = []
    runs: list[str] = []

    async def work(key):
        if key in running:
            overlaps.append(key)
        running.add(key)
        runs.append(key)
        await asyncio.sleep(0.02)
        running.discard(key)
        return None

    q = WorkQueue(work, workers=4)
    q.start()
    try:
        for _ in range(20):
            q.add("a")
        q.add("b")
        await asyncio.sleep(0.005)
        for _ in range(20):
            q.add("a")  # arrives while "a" runs: exactly one more run
        await asyncio.wait_for(q.idle.wait(), 2)
        await asyncio.sleep(0.05)
        await asyncio.wait_for(q.idle.wait(), 2)
    finally:
        await q.stop()
    assert overlaps == []
    assert runs.count("a") == 2 and runs.count("b") == 1


async def test_failures_are_retried_with_backoff_and_do_not_stop_the_queue():
    attempts: list[float] = []
    loop = asyncio.get_running_loop()

    async def work(key):
        attempts.append(loop.time())
        if len(attempts) < 3:
            raise RuntimeError("transient")
        return None

    q = WorkQueue(work, workers=1, backoff=(0.05, 1.0))
    q.start()
    try:
        q.add("k")
        for _ in range(100):
            if len(attempts) >= 3:
                break
            await asyncio.sleep(0.02)
    finally:
        await q.stop()
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] >= 0.045 and attempts[2] - attempts[1] >= 0.095  # 0.05, then 0.1


async def test_requeue_after_runs_again_later():
    runs: list[float] = []
    loop = asyncio.get_running_loop()

    async def work(key):
        runs.append(loop.time())
        return 0.1 if len(runs) == 1 else None

    q = WorkQueue(work, workers=1)
    q.start()
    try:
        q.add("k")
        for _ in range(50):
            if len(runs) >= 2:
                break
            await asyncio.sleep(0.02)
    finally:
        await q.stop()
    assert len(runs) == 2 and runs[1] - runs[0] >= 0.095
