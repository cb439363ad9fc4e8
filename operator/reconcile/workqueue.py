"""A keyed work queue: each fleet is reconciled by one worker at a time, events that
arrive meanwhile collapse into one more run, failures come back after a backoff."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Awaitable, Callable, Hashable, Optional

logger = logging.getLogger("pdfleet.operator")


class WorkQueue:
    def __init__(self, work: Callable[[Hashable], Awaitable[Optional[float]]], *, workers: int = 4,
                 backoff: tuple[float, float] = (0.5, 60.0)):
        self._work = work
        self._workers = workers
        self._backoff_base, self._backoff_max = backoff
        self._due: dict[Hashable, float] = {}          # key -> when it should run
        self._heap: list[tuple[float, int, Hashable]] = []
        self._running: set[Hashable] = set()
        self._dirty: set[Hashable] = set()             # re-run when the current run ends
        self._failures: dict[Hashable, int] = {}
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, key: Hashable, delay: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        if key in self._running:
            if delay <= 0:
                self._dirty.add(key)
                return
        if key in self._due and self._due[key] <= when:
            return
        self._due[key] = when
        heapq.heappush(self._heap, (when, next(self._seq), key))
        self.idle.clear()
        self._wakeup.set()

    def forget(self, key: Hashable) -> None:
        self._due.pop(key, None)
        self._dirty.discard(key)
        self._failures.pop(key, None)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"pdfleet-worker-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _pop_ready(self) -> tuple[Optional[Hashable], Optional[float]]:
        loop = asyncio.get_running_loop()
        while self._heap:
            when, _, key = self._heap[0]
            if self._due.get(key) != when or key in self._running:
                if self._due.get(key) != when:
                    heapq.heappop(self._heap)  # superseded entry
                    continue
                # running: leave it queued; dirty handling re-adds after the run
                heapq.heappop(self._heap)
                self._due.pop(key, None)
                self._dirty.add(key)
                continue
            if when > loop.time():
                return None, when - loop.time()
            heapq.heappop(self._heap)
            del self._due[key]
            return key, None
        return None, None

    async def _worker(self) -> None:
        while True:
            key, wait = self._pop_ready()
            if key is None:
                if not self._heap and not self._running:
                    self.idle.set()
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=wait)
                except asyncio.TimeoutError:
                    pass
                continue
            self._running.add(key)
            requeue: Optional[float] = None
            try:
                requeue = await self._work(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # nothing crashes the operator: log, back off, try again
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                requeue = min(self._backoff_max, self._backoff_base * 2 ** (n - 1))
                logger.error("reconcile of %s failed (%d in a row); again in %.1fs: %s", key, n, requeue, exc,
                             exc_info=not getattr(exc, "expected", False))
            finally:
                self._running.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            elif requeue is not None:
                self.add(key, requeue)
            self._wakeup.set()
