"""Issue 30's data-plane rows: single-use leases (params 1.4) between a real source process and real
sinks, over signed ZMQ and NIXL/UCX on DRAM.

Each row runs twice: with a lease id (1.4) it must hold; held without one (what every lease was before
1.4, and what a 1.3 prefill still does) the same steps show the defect the row is about, so the test
is seen to fail where the defence is missing (the negative control, in the same run)."""

from __future__ import annotations

import secrets
import time

import numpy as np
import pytest
from transfer_harness import LocalKV, wait_for
from waits import wait_until

from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.release_retry import ReleaseRetry

HOST = "127.0.0.1"
SECRET = b"fleet-secret-of-the-lease-suite!"
MODES = [pytest.param(True, id="1.4 lease id"), pytest.param(False, id="negative control: no lease id (1.3)")]


def pull(sink, src, rid, remote, local, lease_id, **kw):
    sink.pull(rid, host=HOST, port=src.base_port, remote_engine_id="prefill-0", remote_instance_id=src.instance_id,
              remote_block_ids=remote, local_block_ids=local, lease_id=lease_id,
              # what decode derives from fresh-looking params: accepted now + remote_lease_seconds
              remote_lease_deadline=time.monotonic() + 30.0, **kw)


def released_soon(src, rid: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        seen += src.released()
        if rid in seen:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("single_use", MODES)
def test_a_replayed_params_set_recomputes_and_never_reads_a_byte_of_the_victims_blocks(
        source_factory, sink_factory, single_use):
    """A client that once got signed params replays them after prefill gave their blocks to another
    request. The same decode (whose earlier pull the source credits as "released by you") and another
    decode both take the replay: each fails (decode recomputes), no READ is posted, the local blocks
    stay untouched. Without a lease id the same replay posts a READ of the victim's blocks, and the
    decode that read the lease before reports it done."""
    src = source_factory(secret=SECRET.hex(), lease=30.0)
    local, other_local = LocalKV(), LocalKV()
    sink = sink_factory(local, secret=SECRET, eager_post=False)
    other = sink_factory(other_local, secret=SECRET)
    lease = secrets.token_bytes(16) if single_use else None
    src.hold("req", [5, 6], lease_id=lease)
    pull(sink, src, "req", [5, 6], [5, 6], lease)
    assert wait_for(sink, "req") == (True, "")
    assert np.array_equal(local.block(0, 5), src.expected(0, 5))  # the legitimate pull read its own KV
    assert released_soon(src, "req")  # its completion freed the blocks ...
    src.cmd("overwrite", blocks=[5, 6])  # ... which vLLM gives to another request: the victim's KV
    src.hold("victim", [5, 6], lease_id=secrets.token_bytes(16) if single_use else None)
    reads_before = sink.stats()["descriptors"]

    pull(sink, src, "req", [5, 6], [9, 10], lease)  # the replay, to the decode that read them
    same_ok, same_reason = wait_for(sink, "req")
    pull(other, src, "req", [5, 6], [9, 10], lease)  # and to another decode
    other_ok, other_reason = wait_for(other, "req")
    stats = src.stats()
    print(f"replay ({'1.4' if single_use else '1.3'}): same decode ok={same_ok} ({same_reason}), other decode"
          f" ok={other_ok} ({other_reason}); READs posted by the replays: same"
          f" {sink.stats()['descriptors'] - reads_before:.0f}, other {other.stats()['descriptors']:.0f};"
          f" spent_lease_refused {stats['spent_lease_refused']:.0f}")
    victims = [buf.block(r, b) for buf in (local, other_local) for r in (0, 1) for b in (9, 10)]
    if single_use:
        assert not same_ok and not other_ok
        assert "no longer holds the request's blocks" in same_reason
        assert sink.stats()["descriptors"] == reads_before and other.stats()["descriptors"] == 0  # no READ posted
        assert not any(block.any() for block in victims)  # not a byte of the victim's blocks
        assert stats["spent_lease_refused"] >= 2
        assert "victim" not in src.released()  # the victim's lease goes on
    else:  # the defect: a READ of the victim's blocks is posted on the lease bound, and the decode that
        # read the lease before takes its own old completion as this pull's ack: "done" (its bytes are
        # the victim's 0xEE, or whatever part of them had landed when done was reported)
        assert same_ok
        assert sink.stats()["descriptors"] > reads_before


@pytest.mark.parametrize("single_use", MODES)
def test_another_key_holders_release_of_a_lease_it_did_not_read_is_refused_and_counted(
        source_factory, sink_factory, single_use):
    """Before the reader's first heartbeat claims the lease, another key holder (it knows the request id,
    not the lease id) sends releases: without the id, and with a guessed one. The lease stays; the
    reader then pulls its KV. Without a lease id the first release frees the blocks."""
    src = source_factory(secret=SECRET.hex(), lease=30.0)
    decode = sink_factory(LocalKV(), secret=SECRET)
    thief = sink_factory(LocalKV(), secret=SECRET, release_retry_policy=ReleaseRetry(max_sends=1))
    lease = secrets.token_bytes(16) if single_use else None
    src.hold("mine", [1], lease_id=lease)
    thief.release(["mine"], host=HOST, port=src.base_port)
    thief.release(["mine"], host=HOST, port=src.base_port, lease_ids=[secrets.token_bytes(16)])
    assert wait_until(lambda: (thief.poll(), not len(thief._notices))[1]), "the thief's releases were not answered"
    freed = released_soon(src, "mine", timeout=0.5)
    stats = src.stats()
    print(f"release by another key holder ({'1.4' if single_use else '1.3'}): freed={freed},"
          f" lease_proof_refused={stats['lease_proof_refused']:.0f}")
    if not single_use:
        assert freed  # the defect (issue 30 root cause 3)
        return
    assert not freed and stats["lease_proof_refused"] == 2 and stats["leases_released"] == 0
    pull(decode, src, "mine", [1], [1], lease)
    assert wait_for(decode, "mine") == (True, "")


@pytest.mark.parametrize("single_use", MODES)
def test_a_forged_completion_notification_without_the_lease_id_is_refused(source_factory, sink_factory, single_use):
    """A key holder handshakes (so NIXL knows its agent) and sends the completion notification a reader
    would attach to its last READ: naming the request, without the lease id and with a wrong one. The
    lease stays held and the reader pulls. Without a lease id the forged notification ends the lease."""
    src = source_factory(secret=SECRET.hex(), lease=30.0)
    decode_kv = LocalKV()
    decode = sink_factory(decode_kv, secret=SECRET)
    forger = sink_factory(LocalKV(), secret=SECRET)
    lease = secrets.token_bytes(16) if single_use else None
    src.hold("mine", [3], lease_id=lease)
    endpoint = (HOST, src.base_port)
    forger._peers.handshake(endpoint)
    assert wait_until(lambda: (forger.poll(), forger._peers.get(endpoint) is not None)[1]), "the forger's handshake did not finish"
    peer = forger._peers.get(endpoint).agent_name
    forger._agent._agent.make_connection(peer)  # NIXL wires up lazily; a READ would do it too
    forged = [wire.Notif("mine", 1, 0, 1, 0), wire.Notif("mine", 1, 0, 1, 0, secrets.token_bytes(16))]

    def refused_or_freed() -> bool:
        for n in forged if single_use else forged[:1]:
            forger._agent.send_notif(peer, wire.encode_notif(n))
        for _ in range(20):  # the sink has no NIXL progress thread: drive the sends
            forger._agent.notifs()
            time.sleep(0.01)
        st = src.stats()
        return st["lease_proof_refused"] >= 2 if single_use else st["leases_completed"] >= 1

    assert wait_until(refused_or_freed, timeout=10), "the forged notifications never reached the source"
    freed = released_soon(src, "mine", timeout=1.0)
    stats = src.stats()
    print(f"forged notification ({'1.4' if single_use else '1.3'}): freed={freed},"
          f" lease_proof_refused={stats['lease_proof_refused']:.0f}, leases_completed={stats['leases_completed']:.0f}")
    if not single_use:
        assert freed and stats["leases_completed"] == 1  # the defect: a forger ended a lease it never read
        return
    assert not freed and stats["leases_completed"] == 0 and stats["lease_proof_refused"] >= 2
    pull(decode, src, "mine", [3], [3], lease)
    assert wait_for(decode, "mine") == (True, "")
    assert np.array_equal(decode_kv.block(0, 3), src.expected(0, 3))
    assert released_soon(src, "mine")  # the reader's own notification (with the id) ends it
