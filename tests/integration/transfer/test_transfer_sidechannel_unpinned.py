"""The side channel's threads are not pinned to the engine's CPUs (they would answer late where engines
share CPUs): a server started from a thread pinned to one CPU serves from a thread that may use them all,
and the caller keeps its pinning."""

from __future__ import annotations

import os
import threading

import pytest

from pdfleet.connector.transfer.sidechannel import SideChannelServer

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                                reason="needs Linux CPU affinity and 2 CPUs")


def thread_cpus(native_id: int) -> set[int]:
    return os.sched_getaffinity(native_id)


def started_from_a_pinned_thread(start) -> tuple[set[int], set[int], set[int]]:
    """(caller's CPUs before, caller's CPUs after, CPUs of the thread `start` created)."""
    out = {}

    def pinned() -> None:
        os.sched_setaffinity(0, {0})  # as vLLM pins an engine's worker
        out["before"] = os.sched_getaffinity(0)
        known = {t.native_id for t in threading.enumerate()}
        start()
        new = [t for t in threading.enumerate() if t.native_id not in known and t.native_id is not None]
        out["after"] = os.sched_getaffinity(0)
        out["started"] = set.union(*(thread_cpus(t.native_id) for t in new)) if new else set()

    t = threading.Thread(target=pinned)
    t.start()
    t.join(30)
    return out["before"], out["after"], out["started"]


def test_a_server_started_from_a_pinned_engine_thread_serves_from_every_cpu():
    everyone = set(range(os.cpu_count()))
    server = SideChannelServer("127.0.0.1", 0, secret=bytes(32), handler=lambda req: None)
    try:
        before, after, started = started_from_a_pinned_thread(server.start)
        assert before == after == {0}
        assert started >= everyone & os.sched_getaffinity(0)  # every CPU the process may use
        assert len(started) >= 2
    finally:
        server.close()


def test_negative_control_a_thread_started_outside_unpinned_stays_pinned():
    box = []
    _, _, started = started_from_a_pinned_thread(
        lambda: box.append(threading.Thread(target=threading.Event().wait, args=(0.5,), daemon=True)) or box[0].start())
    assert started == {0}

