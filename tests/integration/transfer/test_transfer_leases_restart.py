"""Leases (expiry, heartbeat extension), dead peers and restarted prefill processes."""

from __future__ import annotations

import time

import numpy as np
from transfer_harness import free_port, wait_for

HOST = "127.0.0.1"


def pull(sink, src, rid, remote, local, **kw):
    opts = dict(host=HOST, port=src.base_port, remote_engine_id="prefill-0", remote_instance_id=src.instance_id,
                remote_block_ids=remote, local_block_ids=local)
    opts.update(kw)
    sink.pull(rid, **opts)


def test_expired_lease_fails_the_pull_loudly(source_factory, sink_factory, local_kv):
    src = source_factory(lease=1.0)  # long enough for the warm-up pull on a busy machine
    sink = sink_factory(local_kv)
    src.hold("warm", [0])
    pull(sink, src, "warm", [0], [0])  # handshake first, so the next pull could post at once
    assert wait_for(sink, "warm")[0]
    src.hold("late", [5, 6])
    time.sleep(1.6)
    pull(sink, src, "late", [5, 6], [5, 6])
    ok, reason = wait_for(sink, "late")
    assert not ok and "no longer holds the request's blocks" in reason
    assert not local_kv.block(0, 5).any()  # never read into local blocks
    assert sink.stats()["expired_leases"] == 1
    assert sorted(src.released()) == ["late", "warm"]  # warm by notification, late by expiry
    assert src.stats()["leases_expired"] == 1


def test_eager_post_discards_a_read_of_expired_blocks(source_factory, sink_factory, local_kv):
    src = source_factory(lease=1.0)  # long enough for the warm-up pull on a busy machine
    sink = sink_factory(local_kv, eager_post=True)
    src.hold("warm", [0])
    pull(sink, src, "warm", [0], [0])
    assert wait_for(sink, "warm")[0]
    src.hold("late", [5, 6])
    time.sleep(1.6)
    # The engine's next step collects the expired lease (its blocks may then be reused), as an engine
    # does every step; without it a READ's completion could reach the source before the heartbeat and
    # find the lease expired but not yet collected, blocks intact (a CI run saw that order once).
    assert "late" in src.released()
    pull(sink, src, "late", [5, 6], [5, 6])  # posted before the ack: the ack then says expired
    ok, reason = wait_for(sink, "late")
    assert not ok and "no longer holds the request's blocks" in reason
    assert sink.stats()["expired_leases"] == 1 and sink.stats()["transfers"] == 1  # only "warm" counted


def test_pull_may_overtake_the_hold_but_not_forever(source_factory, sink_factory, local_kv):
    src = source_factory(lease=30.0)
    sink = sink_factory(local_kv, unknown_grace=5.0)
    # the prefill response can reach decode before the source processed its hold
    pull(sink, src, "racy", [7], [7])
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        done, failed = sink.poll()
        assert not done and not failed
    src.hold("racy", [7])
    assert wait_for(sink, "racy") == (True, "")
    assert np.array_equal(local_kv.block(0, 7), src.expected(0, 7))
    # never held: fails once the grace period is over
    impatient = sink_factory(local_kv, unknown_grace=0.3)
    pull(impatient, src, "never", [8], [8])
    ok, reason = wait_for(impatient, "never")
    assert not ok and "does not know request 'never'" in reason


def test_heartbeats_extend_the_lease(source_factory, sink_factory, local_kv):
    src = source_factory(lease=1.0)
    sink = sink_factory(local_kv)
    src.hold("kept", [1, 2])
    src.hold("dropped", [3])  # control: same lease, no heartbeat
    released: list[str] = []
    end = time.monotonic() + 2.5  # 2.5 leases
    while time.monotonic() < end:
        sink.keep_alive(["kept"], host=HOST, port=src.base_port)
        time.sleep(0.1)
        released += src.released()
    assert released == ["dropped"]
    pull(sink, src, "kept", [1, 2], [1, 2])
    assert wait_for(sink, "kept") == (True, "")
    assert np.array_equal(local_kv.block(1, 2), src.expected(1, 2))
    assert src.stats()["leases_expired"] == 1 and src.stats()["heartbeats"] >= 5


def test_dead_peer_gives_clear_error(sink_factory, local_kv):
    sink = sink_factory(local_kv, handshake_timeout=0.3, handshake_retries=2, heartbeat_timeout=0.3)
    t0 = time.monotonic()
    sink.pull("d1", host=HOST, port=free_port(), remote_engine_id="prefill-0", remote_instance_id=None,
              remote_block_ids=[1], local_block_ids=[1])
    ok, reason = wait_for(sink, "d1", timeout=10)
    assert not ok
    assert "no reply within" in reason and "attempt" in reason
    assert time.monotonic() - t0 < 5  # bounded retries
    assert sink.stats()["failures"] == 1


def test_unusable_host_fails_cleanly(sink_factory, local_kv):
    sink = sink_factory(local_kv, handshake_timeout=0.3, handshake_retries=1, heartbeat_timeout=0.3)
    sink.pull("h1", host="not a host name", port=5600, remote_engine_id="prefill-0", remote_instance_id=None,
              remote_block_ids=[1], local_block_ids=[1])
    ok, reason = wait_for(sink, "h1", timeout=10)
    assert not ok and "not a host name" in reason
    sink.keep_alive(["h1"], host=HOST, port="5600")  # ignored with a warning, never raises


def test_restarted_prefill_gets_a_new_handshake(source_factory, sink_factory, local_kv):
    port = free_port()
    first = source_factory(port=port, seed=1)
    sink = sink_factory(local_kv)
    first.hold("a", [4])
    pull(sink, first, "a", [4], [0])
    assert wait_for(sink, "a") == (True, "")
    first.kill()

    second = source_factory(port=port, seed=2)  # same address, new process, other data
    assert second.instance_id != first.instance_id
    second.hold("b", [4])
    pull(sink, second, "b", [4], [1])  # kv_transfer_params carry the new instance id
    assert wait_for(sink, "b") == (True, "")
    assert np.array_equal(local_kv.block(0, 1), second.expected(0, 4))
    assert not np.array_equal(local_kv.block(0, 1), first.expected(0, 4))
    stats = sink.stats()
    assert stats["handshakes"] == 2 and stats["stale_agents_dropped"] == 1
    second.kill()

    # Without an instance id the heartbeat ack reveals the restart: the stale agent is
    # dropped and the read goes to the new process.
    third = source_factory(port=port, seed=3)
    third.hold("c", [4])
    pull(sink, third, "c", [4], [2], remote_instance_id=None)
    assert wait_for(sink, "c") == (True, "")
    assert np.array_equal(local_kv.block(0, 2), third.expected(0, 4))
    assert sink.stats()["handshakes"] == 3 and sink.stats()["stale_agents_dropped"] == 2

    # A request held by an instance that is gone fails instead of reading the new one.
    pull(sink, third, "gone", [4], [3], remote_instance_id=second.instance_id)
    ok, reason = wait_for(sink, "gone")
    assert not ok and "restarted" in reason
    assert not local_kv.block(0, 3).any()


def test_read_that_completes_before_the_hold_still_finishes(source_factory, sink_factory, local_kv):
    """The advertised expiry lets the READ run before the first ack; if that ack says
    'not held yet', the sink must keep asking after the READ completed (it once waited forever)."""
    src = source_factory(lease=30.0)
    sink = sink_factory(local_kv, unknown_grace=5.0)
    src.hold("warm", [0])
    pull(sink, src, "warm", [0], [0])  # handshake first, so the next pull posts at once
    assert wait_for(sink, "warm")[0]
    pull(sink, src, "early", [9], [9], remote_lease_expiry=time.time() + 30.0)
    end = time.monotonic() + 0.5  # the one-block READ completes long before this
    while time.monotonic() < end:
        done, failed = sink.poll()
        assert not done and not failed  # not confirmed by the source yet
    src.hold("early", [9])
    assert wait_for(sink, "early", timeout=10.0) == (True, "")
    assert np.array_equal(local_kv.block(0, 9), src.expected(0, 9))


def _poll_for(sink, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sink.poll()
        time.sleep(0.005)


def test_a_release_that_overtakes_the_hold_is_sent_again_until_the_source_holds_it(source_factory, sink_factory,
                                                                                   local_kv):
    """Decode's "nothing to pull" release can reach the prefill before its worker holds the lease (seen
    in the fault suite: the lease then ran its whole course). The source ignores a release for an id it
    does not hold yet, so decode sends it again until the source says the lease is gone."""
    from pdfleet.connector.transfer.release_retry import ReleaseRetry

    src = source_factory(lease=30.0)
    sink = sink_factory(local_kv)
    once = sink_factory(local_kv, release_retry_policy=ReleaseRetry(max_sends=1))  # the old fire-and-forget
    sink.release(["overtaken"], host=HOST, port=src.base_port)
    once.release(["overtaken-once"], host=HOST, port=src.base_port)
    # Both answered "not held yet": the sink sends its release again, the one sent once gives up.
    end = time.monotonic() + 10.0  # a liveness bound (replies come in milliseconds on an idle machine)
    while time.monotonic() < end and not (sink.stats()["release_retries"] >= 1
                                          and once.stats()["releases_unconfirmed"] == 1):
        sink.poll()
        once.poll()
        time.sleep(0.005)
    assert sink.stats()["release_retries"] >= 1
    assert once.stats()["release_retries"] == 0 and once.stats()["releases_unconfirmed"] == 1
    src.hold("overtaken", [3])
    src.hold("overtaken-once", [4])
    released: list[str] = []
    end = time.monotonic() + 5.0
    while "overtaken" not in released and time.monotonic() < end:
        sink.poll()
        once.poll()
        released += src.released()
        time.sleep(0.01)
    assert released == ["overtaken"]  # the one sent once waits for its lease (negative control)
    retries = sink.stats()["release_retries"]
    _poll_for(sink, 2.5)  # confirmed gone: not sent again
    assert sink.stats()["release_retries"] == retries
    assert sink.stats()["releases_unconfirmed"] == 0
    assert src.stats()["leases_released"] == 1 and src.stats()["leases_expired"] == 0


def test_a_release_no_source_answers_is_given_up_within_its_budget(sink_factory, local_kv):
    from pdfleet.connector.transfer.release_retry import ReleaseRetry

    sink = sink_factory(local_kv, heartbeat_timeout=0.1,
                        release_retry_policy=ReleaseRetry(budget_seconds=1.0, first_delay=0.05, max_delay=0.2))
    sink.release(["nobody-home"], host=HOST, port=free_port())
    end = time.monotonic() + 10.0  # a liveness bound: given up about 1.1 s after the first send
    while time.monotonic() < end and sink.stats()["releases_unconfirmed"] == 0:
        sink.poll()
        time.sleep(0.005)
    _poll_for(sink, 0.5)  # and nothing is sent after that
    stats = sink.stats()
    assert 1 <= stats["release_retries"] <= 8 and stats["releases_unconfirmed"] == 1, stats
