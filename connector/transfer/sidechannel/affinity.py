"""CPU affinity for the side channel's threads: started unpinned, wherever a CPU is free."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

__all__ = ["unpinned"]


@contextmanager
def unpinned() -> Iterator[None]:
    """Threads started inside may run on every CPU the process may use, not only the caller's.

    vLLM pins an engine's worker thread to the engine's CPUs, and every thread it starts inherits
    that pinning, ZMQ's I/O threads included. Where engines share CPUs the side channel's threads
    then wait behind the engines' spinning threads and answer heartbeats seconds late (measured:
    p99 6-10 s in 2 prefill + 1 decode local fleets, docs/reliability.md). Started in here, they
    go wherever a CPU is free. The caller's own pinning is restored on the way out."""
    try:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the kernel keeps only the CPUs allowed
    except (AttributeError, OSError):  # not Linux, or not allowed: leave the pinning as it is
        yield
        return
    try:
        yield
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass
