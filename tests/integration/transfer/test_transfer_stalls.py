"""A source whose serving loop stalls (SIGSTOP: its side-channel thread, its NIXL progress, all of it),
between two real processes over NIXL/UCX and ZMQ.

- A 3 s stall with 20 s of lease left: the pull's heartbeats go unanswered (each times out after
  0.5 s, 2 attempts), it retries while the lease has time and succeeds with the right bytes. The
  negative control, the same stall without a retry budget, fails the pull: the retry is what holds.
- A stall that outlasts the lease: the pull fails (vLLM recomputes) and the source releases the
  blocks when it runs again.
- A reply read long after it arrived (its reader was blocked) is judged against when it could first
  have been read, not against the late clock.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from transfer_harness import LocalKV, local_kv, sink_factory, source_factory, wait_for  # noqa: F401

from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.retry import HeartbeatRetry
from pdfleet.connector.transfer.sidechannel import SideChannelClient, SideChannelServer

SECRET = bytes(range(32))


def pull(sink, src, rid: str, blocks: list[int], expiry: float) -> None:
    sink.pull(rid, host="127.0.0.1", port=src.base_port, remote_engine_id="prefill-0",
              remote_instance_id=src.instance_id, remote_block_ids=blocks, local_block_ids=blocks,
              remote_lease_expiry=expiry)


def warm(sink, src) -> None:
    """Handshake and one pull first: the stall then hits a pull, not the handshake."""
    pull(sink, src, "warm", [0], src.hold("warm", [0]))
    assert wait_for(sink, "warm") == (True, "")


def stop(pid: int) -> None:
    """SIGSTOP, and wait until every thread is stopped (kill() returns before a thread running on
    another CPU has stopped: it could still answer a heartbeat sent right after)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")


def stalled_pull(sink, src, rid: str, blocks: list[int], stall_s: float) -> tuple[bool, str, float]:
    """Hold, stop the source, pull while it is stopped, resume it after ``stall_s``; (ok, reason, seconds)."""
    expiry = src.hold(rid, blocks)
    stop(src.proc.pid)
    resumed = False
    try:
        started = time.monotonic()
        pull(sink, src, rid, blocks, expiry)
        while time.monotonic() - started < stall_s:
            done, failed = sink.poll()
            if rid in failed or rid in done:
                return rid in done, failed.get(rid, ""), time.monotonic() - started
            time.sleep(0.002)
        os.kill(src.proc.pid, signal.SIGCONT)
        resumed = True
        ok, reason = wait_for(sink, rid, timeout=30)
        return ok, reason, time.monotonic() - started
    finally:
        if not resumed:
            os.kill(src.proc.pid, signal.SIGCONT)


def test_a_3s_stall_with_20s_of_lease_left_does_not_fail_the_pull(source_factory, sink_factory, local_kv):
    src = source_factory(lease=20.0)
    sink = sink_factory(local_kv, heartbeat_timeout=0.5)
    warm(sink, src)
    ok, reason, seconds = stalled_pull(sink, src, "r1", [2, 3, 4], stall_s=3.0)
    assert ok, reason
    assert seconds >= 3.0  # it waited the stall out
    for region in range(2):
        for b in (2, 3, 4):
            assert np.array_equal(local_kv.block(region, b), src.expected(region, b))
    assert sink.stats()["heartbeat_retries"] >= 1


def test_negative_control_the_same_stall_without_a_retry_budget_fails(source_factory, sink_factory, local_kv):
    src = source_factory(lease=20.0)
    sink = sink_factory(local_kv, heartbeat_timeout=0.5, heartbeat_retry_policy=HeartbeatRetry(budget_seconds=0))
    warm(sink, src)
    ok, reason, seconds = stalled_pull(sink, src, "r1", [2, 3, 4], stall_s=3.0)
    assert not ok and "lease heartbeat" in reason, reason
    assert seconds < 3.0  # failed during the stall, while the lease had time


def test_a_stall_that_outlasts_the_lease_fails_the_pull_and_the_blocks_are_released(
        source_factory, sink_factory, local_kv):
    src = source_factory(lease=2.0)
    sink = sink_factory(local_kv, heartbeat_timeout=0.5)
    warm(sink, src)
    ok, reason, _ = stalled_pull(sink, src, "r1", [2, 3, 4], stall_s=4.0)
    assert not ok and "lease" in reason, reason  # reported failed: vLLM recomputes the prompt
    deadline = time.monotonic() + 10
    released: list[str] = []
    while "r1" not in released and time.monotonic() < deadline:
        released += src.released()
        time.sleep(0.1)
    assert "r1" in released  # the source freed the blocks
    assert sink.stats()["in_flight"] == 0


def test_a_reply_read_late_is_judged_against_when_it_could_first_be_read():
    """The client's owner does not poll for 2.5 s (a blocked engine step) while the replay window is 1 s."""
    server = SideChannelServer("127.0.0.1", 0, secret=SECRET, handler=lambda req: wire.HeartbeatReply(
        id=req.id, instance_id="i", remaining={}, gone=[]))
    server.start()
    client = SideChannelClient(secret=SECRET, replay_window=1.0)
    try:
        req = wire.HeartbeatRequest(id=SideChannelClient.next_id(), request_ids=["r"], agent="a")
        call = client.submit("127.0.0.1", server.port, req, timeout=10.0, attempts=1)
        deadline = time.monotonic() + 5
        while server.served == 0 and time.monotonic() < deadline:  # answered at once...
            threading.Event().wait(0.01)
        assert server.served == 1
        time.sleep(2.5)  # ...and read 2.5 s later
        client.poll()
        assert client.rejected == 0, client.last_reject
        assert call.done() and isinstance(call.result(), wire.HeartbeatReply)
    finally:
        client.close()
        server.close()
