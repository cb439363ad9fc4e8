"""A KV pull's state machine (connector/transfer/pull_state.py) as tables: (state, event) -> (state, actions).

The sink that executes these actions over real NIXL/UCX and ZMQ is tested in tests/integration/transfer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pdfleet.connector.transfer import pull_state as ps
from pdfleet.connector.transfer.pull_state import Phase
from pdfleet.connector.transfer.retry import HeartbeatRetry

T0 = 100.0     # monotonic start of every pull here
WALL = 1e9     # unix time at T0
SENT = T0      # the first heartbeat went out at T0


def pull(**kw: Any) -> ps.PullState:
    """A pull whose first heartbeat is in flight, waiting for its handshake."""
    base = ps.PullState("r1", "prefill-0", T0, where="10.0.0.1:5600", hb=ps.Heartbeat(in_flight=True, sent=SENT))
    hb = kw.pop("hb", {})
    cfg = kw.pop("config", {})
    return replace(base, hb=replace(base.hb, **hb), config=replace(base.config, **cfg), **kw)


def attached(**kw: Any) -> ps.PullState:
    kw.setdefault("verified", True)
    kw.setdefault("phase", Phase.ATTACHED)
    return pull(peer_instance="i1", peer_agent="agent-p", **kw)


def reading(**kw: Any) -> ps.PullState:
    kw.setdefault("posted_at", T0 + 0.1)
    kw.setdefault("nbytes", 1_000_000)
    kw.setdefault("phase", Phase.READING)
    return attached(**kw)


def ready(**kw: Any) -> ps.PeerReady:
    base = dict(now=T0 + 0.01, wall=WALL + 0.01, instance_id="i1", engine_id="prefill-0", agent="agent-p")
    return ps.PeerReady(**{**base, **kw})


def answer(left: float | None = 30.0, **kw: Any) -> ps.HeartbeatAnswer:
    base = dict(now=T0 + 0.02, instance_id="i1", left=left)
    return ps.HeartbeatAnswer(**{**base, **kw})


FAIL = [ps.Do.RELEASE_READS]
EXPIRED = ps.Count("expired_leases")

# name, state, event, phase after, actions, fields expected after (name -> value)
ROWS: list[tuple[str, ps.PullState, Any, Phase, list[Any], dict[str, Any]]] = [
    ("start sends the first heartbeat", pull(hb={"in_flight": False, "sent": 0.0}), ps.Start(T0),
     Phase.HANDSHAKE, [ps.Do.SEND_HEARTBEAT], {"hb.in_flight": True, "hb.sent": T0}),
    # handshake answered
    ("peer of another engine", pull(), ready(engine_id="decode-9"), Phase.FAILING, FAIL,
     {"failure": "10.0.0.1:5600 serves engine 'decode-9', not 'prefill-0'"}),
    ("peer is another instance than the request's", pull(remote_instance_id="i0"), ready(), Phase.FAILING, FAIL,
     {"failure": "the source at 10.0.0.1:5600 is instance i1, not i0 (it restarted: the request's blocks are gone)",
      "peer_instance": None}),
    ("peer is another instance than the ack's", pull(ack_instance="i0"), ready(), Phase.FAILING, FAIL, {}),
    ("unverified peer waits for an ack", pull(), ready(), Phase.ATTACHED, [], {"verified": False,
                                                                               "peer_instance": "i1"}),
    ("verified, no deadline yet: safe mode waits", pull(remote_instance_id="i1"), ready(), Phase.ATTACHED, [],
     {"verified": True, "deadline": None}),
    ("verified, eager: posts at once", pull(remote_instance_id="i1", config={"eager": True}), ready(),
     Phase.ATTACHED, [ps.Do.POST], {"deadline": None}),
    ("verified, advertised expiry, clock known well: posts", pull(remote_instance_id="i1", remote_lease_expiry=WALL + 30),
     ready(clock_offset=0.0, clock_error=0.01), Phase.ATTACHED, [ps.Do.POST],
     {"deadline": T0 + 0.01 + (30 - 0.01 - 0.01 - ps.EXPIRY_SAFETY_MARGIN)}),
    ("advertised expiry but clock too uncertain: waits", pull(remote_instance_id="i1", remote_lease_expiry=WALL + 30),
     ready(clock_error=0.5), Phase.ATTACHED, [], {"deadline": None}),
    ("advertised expiry already past: waits for an ack", pull(remote_instance_id="i1", remote_lease_expiry=WALL),
     ready(clock_error=0.01), Phase.ATTACHED, [], {"deadline": None}),
    ("block ids do not fit the peer", pull(remote_instance_id="i1"), ready(block_error="id 9 >= 8 blocks"),
     Phase.FAILING, FAIL, {"failure": "invalid pull: id 9 >= 8 blocks"}),
    ("a peer for a pull that has one is ignored", attached(), ready(), Phase.ATTACHED, [], {}),
    ("handshake failed", pull(), ps.HandshakeFailed(T0 + 1, "timeout"), Phase.FAILING, FAIL, {"failure": "timeout"}),
    ("handshake failure of an attached pull is not its own", attached(), ps.HandshakeFailed(T0 + 1, "x"),
     Phase.ATTACHED, [], {}),
    # lease acks
    ("ack gives the deadline, verifies, sets the interval", attached(verified=False), answer(30.0), Phase.ATTACHED,
     [], {"deadline": SENT + 30, "acked": True, "verified": True, "hb.interval": 10.0, "hb.in_flight": False,
          "ack_instance": "i1"}),
    ("ack during the handshake: no peer to verify", pull(), answer(3.0), Phase.HANDSHAKE, [],
     {"deadline": SENT + 3, "verified": False, "hb.interval": 1.0}),
    ("short lease: interval floored", attached(), answer(0.06), Phase.ATTACHED, [], {"hb.interval": 0.05}),
    ("ack from a new instance while attached: drop the peer, handshake again", attached(), answer(instance_id="i2"),
     Phase.HANDSHAKE, [ps.DropPeer("heartbeat answered by another instance"), ps.Do.HANDSHAKE],
     {"peer_instance": None, "verified": False, "deadline": SENT + 30}),
    ("ack from a new instance while reading", reading(), answer(instance_id="i2"), Phase.FAILING,
     [ps.DropPeer("heartbeat answered by another instance"), *FAIL],
     {"failure": "the source restarted while the read was in flight"}),
    ("ack from another instance than the request's", pull(remote_instance_id="i0"), answer(instance_id="i2"),
     Phase.FAILING, FAIL, {"failure": "the source at 10.0.0.1:5600 restarted (instance i2, the request was held by"
                                      " i0): its blocks are gone"}),
    ("released by our own completion notification while reading", reading(), answer(None, released_by_us=True),
     Phase.READ_DONE, [], {"acked": True, "released_by_us": True, "completed_at": T0 + 0.02}),
    ("released by us but nothing posted: the request is unknown", attached(), answer(None, released_by_us=True),
     Phase.ATTACHED, [], {"hb.retry": True, "acked": False}),
    ("gone: lease expired at the source", attached(), answer(None, gone=True), Phase.FAILING, [EXPIRED, *FAIL],
     {"failure": "the source no longer holds the request's blocks (lease expired or already released)"}),
    ("unknown within the grace: ask again", attached(), answer(None), Phase.ATTACHED, [], {"hb.retry": True}),
    ("unknown past the grace", attached(), answer(None, now=T0 + 2.5), Phase.FAILING, FAIL,
     {"failure": "the source does not know request 'r1' (never held, or held longer ago than it remembers) after 2s"}),
    ("refused", attached(), ps.HeartbeatBad(T0 + 0.02, "lease heartbeat refused: bad agent"), Phase.FAILING, FAIL,
     {"failure": "lease heartbeat refused: bad agent", "hb.in_flight": False}),
    ("an answer resets the retry budget", attached(hb={"failing_since": T0, "retries": 3}), answer(),
     Phase.ATTACHED, [], {"hb.failing_since": None, "hb.retries": 0}),
    # unanswered heartbeats
    ("unanswered with a lease far away: retry after a backoff", attached(deadline=T0 + 30, acked=True),
     ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.ATTACHED, [ps.Count("heartbeat_retries")],
     {"hb.retry": True, "hb.retries": 1, "hb.failing_since": T0 + 1, "hb.not_before": T0 + 1 + 0.05}),
    ("unanswered again: the backoff doubles", attached(deadline=T0 + 30, hb={"failing_since": T0, "retries": 1}),
     ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.ATTACHED, [ps.Count("heartbeat_retries")],
     {"hb.retries": 2, "hb.not_before": T0 + 1 + 0.1, "hb.failing_since": T0}),
    ("unanswered past the retry budget", attached(deadline=T0 + 30, hb={"failing_since": T0}),
     ps.HeartbeatFailed(T0 + 9, WALL + 9, "timeout"), Phase.FAILING, FAIL,
     {"failure": "lease heartbeat to 10.0.0.1:5600 failed: timeout; unanswered for 9.0s (retry budget 8s)"}),
    ("unanswered with no lease known", attached(), ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.FAILING,
     FAIL, {"failure": "lease heartbeat to 10.0.0.1:5600 failed: timeout; no lease deadline known (the source never"
                       " confirmed the lease)"}),
    ("unanswered before the first ack: the advertised expiry bounds the retries",
     attached(remote_lease_expiry=WALL + 30, clock_error=0.01), ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"),
     Phase.ATTACHED, [ps.Count("heartbeat_retries")], {"hb.retry": True}),
    # params 1.3: an upper bound of the lease on this host's monotonic clock (no clock of the source read)
    ("1.3 bound: unanswered before the first ack, the bound far away: retried",
     attached(lease_bound=T0 + 30), ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.ATTACHED,
     [ps.Count("heartbeat_retries")], {"hb.retry": True, "hb.retries": 1}),
    ("1.3 bound: retried during the handshake too (no peer, no clock offset needed)",
     pull(lease_bound=T0 + 30), ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.HANDSHAKE,
     [ps.Count("heartbeat_retries")], {"hb.retry": True}),
    ("1.3 bound: whatever the wall clock says (stepped an hour back)",
     attached(lease_bound=T0 + 30), ps.HeartbeatFailed(T0 + 1, WALL - 3600, "timeout"), Phase.ATTACHED,
     [ps.Count("heartbeat_retries")], {"hb.retry": True}),
    ("1.3 bound: no retry once the bound is near", attached(lease_bound=T0 + 1.1),
     ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.FAILING, FAIL,
     {"failure": "lease heartbeat to 10.0.0.1:5600 failed: timeout; the lease ends in 0.10s"}),
    ("1.3 bound: the 1.2 expiry of the same pull, nearer, wins", attached(lease_bound=T0 + 30, clock_error=0.01,
                                                                          remote_lease_expiry=WALL + 1.1),
     ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.FAILING, FAIL, {}),
    ("1.3 bound: an ack's deadline replaces it", attached(lease_bound=T0 + 1.1, deadline=T0 + 30, acked=True),
     ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.ATTACHED, [ps.Count("heartbeat_retries")], {}),
    ("1.3 bound with time left: safe mode starts the READ (only an ack completes it)",
     pull(remote_instance_id="i1", lease_bound=T0 + 30), ready(clock_offset=0.0, clock_error=0.01), Phase.ATTACHED,
     [ps.Do.POST], {"deadline": None}),
    ("1.3 bound within the safety margin: safe mode waits for the ack", pull(remote_instance_id="i1",
                                                                            lease_bound=T0 + 0.2),
     ready(clock_offset=0.0, clock_error=0.01), Phase.ATTACHED, [], {"deadline": None}),
    ("1.3 bound passed: a tick does not post on it", attached(lease_bound=T0 + 0.3), ps.Tick(T0 + 0.1, WALL),
     Phase.ATTACHED, [], {"deadline": None}),
    ("1.3 bound unverified instance: no post on it", pull(lease_bound=T0 + 30), ready(), Phase.ATTACHED, [],
     {"verified": False}),
    ("1.3 bound: eager posts as before", pull(remote_instance_id="i1", lease_bound=T0 + 30, config={"eager": True}),
     ready(), Phase.ATTACHED, [ps.Do.POST], {"deadline": None}),
    ("1.3 bound: a READ done before the ack does not complete", reading(lease_bound=T0 + 30),
     ps.ReadStates(T0 + 1, T0 + 1.001, True, False), Phase.READ_DONE, [], {"acked": False}),
    ("1.3 bound: read done, no ack yet, a tick waits", reading(phase=Phase.READ_DONE, completed_at=T0 + 0.5,
                                                              lease_bound=T0 + 30, hb={"in_flight": False}),
     ps.Tick(T0 + 0.6, WALL), Phase.READ_DONE, [], {}),
    ("1.3 bound: passed, but the ack's deadline holds: completes", reading(phase=Phase.READ_DONE, completed_at=T0 + 2,
                                                                         lease_bound=T0 + 1, deadline=T0 + 30,
                                                                         acked=True),
     ps.Tick(T0 + 2.1, WALL), Phase.DONE, [ps.Do.COMPLETE], {}),
    # params 1.4 (single_use): the READ waits for the source's grant of this lease id, nothing else
    ("1.4: the lease bound posts nothing before the grant", pull(remote_instance_id="i1", lease_bound=T0 + 30,
                                                                  single_use=True),
     ready(clock_offset=0.0, clock_error=0.01), Phase.ATTACHED, [], {"deadline": None}),
    ("1.4: eager posts nothing before the grant", pull(remote_instance_id="i1", lease_bound=T0 + 30, single_use=True,
                                                        config={"eager": True}),
     ready(), Phase.ATTACHED, [], {}),
    ("1.4: a 1.2-style expiry posts nothing before the grant", pull(remote_instance_id="i1", remote_lease_expiry=WALL + 30,
                                                                     single_use=True),
     ready(clock_offset=0.0, clock_error=0.01), Phase.ATTACHED, [], {}),
    ("1.4: a tick with the bound but no grant waits", attached(lease_bound=T0 + 30, single_use=True),
     ps.Tick(T0 + 0.1, WALL), Phase.ATTACHED, [], {}),
    ("1.4: the grant arrived first: posts on attach", pull(remote_instance_id="i1", single_use=True, acked=True,
                                                           deadline=T0 + 30),
     ready(), Phase.ATTACHED, [ps.Do.POST], {}),
    ("1.4: granted: the next tick posts", attached(single_use=True, acked=True, deadline=T0 + 30,
                                                   hb={"in_flight": False}),
     ps.Tick(T0 + 0.1, WALL), Phase.ATTACHED, [ps.Do.POST], {}),
    ("1.4: 'released by you' is no confirmation: a replay fails", reading(single_use=True),
     answer(None, released_by_us=True, gone=True), Phase.FAILING, [EXPIRED, *FAIL],
     {"acked": False, "released_by_us": False,
      "failure": "the source no longer holds the request's blocks (lease expired or already released)"}),
    ("1.4: a spent lease id is gone: fails before any READ", attached(single_use=True, lease_bound=T0 + 30),
     answer(None, gone=True), Phase.FAILING, [EXPIRED, *FAIL], {"posted_at": None}),
    ("1.3 (negative control): the same answer completes the pull", reading(),
     answer(None, released_by_us=True, gone=True), Phase.READ_DONE, [], {"acked": True, "released_by_us": True}),
    ("a custom retry policy is followed", attached(deadline=T0 + 30, config={"retry": HeartbeatRetry(budget_seconds=0)}),
     ps.HeartbeatFailed(T0 + 1, WALL + 1, "timeout"), Phase.FAILING, FAIL, {}),
    # ticks
    ("tick, nothing due", attached(verified=False, hb={"in_flight": False}), ps.Tick(T0 + 0.01, WALL),
     Phase.ATTACHED, [], {}),
    ("tick: unknown request asked again after 20 ms", attached(verified=False, hb={"in_flight": False, "retry": True}),
     ps.Tick(T0 + 0.03, WALL), Phase.ATTACHED, [ps.Do.SEND_HEARTBEAT], {"hb.retry": False, "hb.sent": T0 + 0.03}),
    ("tick: retry waits for its backoff", attached(verified=False, hb={"in_flight": False, "retry": True,
                                                                       "not_before": T0 + 1}),
     ps.Tick(T0 + 0.5, WALL), Phase.ATTACHED, [], {"hb.retry": True}),
    ("tick: the interval's heartbeat", reading(deadline=T0 + 30, acked=True, hb={"in_flight": False, "interval": 1.0}),
     ps.Tick(T0 + 1.5, WALL), Phase.READING, [ps.Do.SEND_HEARTBEAT, ps.CheckReads(T0 + 1.5)], {"hb.sent": T0 + 1.5}),
    ("tick: one heartbeat in flight at most", reading(deadline=T0 + 30, acked=True, hb={"interval": 1.0}),
     ps.Tick(T0 + 1.5, WALL), Phase.READING, [ps.CheckReads(T0 + 1.5)], {}),
    ("tick: a verified pull with a deadline posts", attached(deadline=T0 + 30, acked=True), ps.Tick(T0 + 0.1, WALL),
     Phase.ATTACHED, [ps.Do.POST], {}),
    ("tick: the lease ran out before posting", attached(deadline=T0 + 1, acked=True), ps.Tick(T0 + 1, WALL),
     Phase.FAILING, [EXPIRED, *FAIL], {"failure": "the source's lease on the blocks expired before the read was posted"}),
    ("tick: the lease ran out during the handshake", pull(deadline=T0 + 1), ps.Tick(T0 + 2, WALL), Phase.FAILING,
     [EXPIRED, *FAIL], {}),
    ("tick: the lease ran out while reading", reading(deadline=T0 + 1, acked=True), ps.Tick(T0 + 2, WALL),
     Phase.FAILING, [EXPIRED, *FAIL], {"failure": "the source's lease on the blocks expired while the read was in flight"}),
    ("tick: read done, ack still awaited, lease ran out", reading(phase=Phase.READ_DONE, completed_at=T0 + 0.5,
                                                                  deadline=T0 + 1), ps.Tick(T0 + 2, WALL),
     Phase.FAILING, [EXPIRED, *FAIL], {}),
    ("tick: read done and acked in time", reading(phase=Phase.READ_DONE, completed_at=T0 + 0.5, deadline=T0 + 30,
                                                  acked=True), ps.Tick(T0 + 0.6, WALL), Phase.DONE, [ps.Do.COMPLETE], {}),
    ("tick: released by us completes without a deadline", reading(phase=Phase.READ_DONE, completed_at=T0 + 0.5,
                                                                  acked=True, released_by_us=True),
     ps.Tick(T0 + 0.6, WALL), Phase.DONE, [ps.Do.COMPLETE], {}),
    ("tick: read done after the lease: data discarded", reading(phase=Phase.READ_DONE, completed_at=T0 + 2,
                                                                deadline=T0 + 1.5, acked=True),
     ps.Tick(T0 + 1.0, WALL), Phase.FAILING, [EXPIRED, *FAIL],
     {"failure": "the read completed after the source's lease expired: the blocks may have been reused, data discarded"}),
    # posting
    ("posted before the first ack: ask for it now", attached(hb={"in_flight": False, "retry": True}),
     ps.Posted(T0 + 0.1, T0 + 0.2, 4096), Phase.READING, [ps.Do.SEND_HEARTBEAT],
     {"posted_at": T0 + 0.1, "nbytes": 4096, "hb.sent": T0 + 0.2, "hb.retry": False}),
    ("posted after the ack", attached(acked=True, hb={"in_flight": False}), ps.Posted(T0 + 0.1, T0 + 0.2, 4096),
     Phase.READING, [], {}),
    ("post failed before any READ went out", attached(), ps.PostFailed(T0 + 0.1, "no route", any_posted=False),
     Phase.FAILING, [ps.DropPeer("READ failed: no route"), ps.Do.HANDSHAKE, *FAIL],
     {"failure": "NIXL READ from agent-p failed: no route"}),
    ("post failed after some READs", attached(), ps.PostFailed(T0 + 0.1, "no route", any_posted=True),
     Phase.FAILING, [ps.DropPeer("READ failed: no route"), *FAIL], {}),
    # READs
    ("reads in flight", reading(), ps.ReadStates(T0 + 1, T0 + 1, done=False, error=False), Phase.READING, [], {}),
    ("a READ failed", reading(), ps.ReadStates(T0 + 1, T0 + 1, done=False, error=True), Phase.FAILING,
     [ps.DropPeer("a READ failed"), *FAIL], {"failure": "NIXL READ from agent-p failed (transfer state ERR)"}),
    ("a READ past its bound is cancelled", reading(nbytes=50_000_000), ps.ReadStates(T0 + 6.2, T0 + 6.2, False, False),
     Phase.FAILING, [ps.Count("reads_timed_out"), *FAIL],
     {"release_remote": True, "failure": "the READ of 50000000 bytes from agent-p did not complete within 6s"
                                         " (5s + its bytes at 50 MB/s): cancelled after 6.10s"}),
    ("a READ within its bound", reading(nbytes=50_000_000), ps.ReadStates(T0 + 6.0, T0 + 6.0, False, False),
     Phase.READING, [], {}),
    ("reads done, acked: complete", reading(deadline=T0 + 30, acked=True), ps.ReadStates(T0 + 1, T0 + 1.001, True, False),
     Phase.DONE, [ps.Do.COMPLETE], {"completed_at": T0 + 1.001}),
    ("reads done before the first ack: ask for it now", reading(hb={"in_flight": False}),
     ps.ReadStates(T0 + 1, T0 + 1.001, True, False), Phase.READ_DONE, [ps.Do.SEND_HEARTBEAT], {"hb.sent": T0 + 1.001}),
    ("reads done, ack in flight", reading(), ps.ReadStates(T0 + 1, T0 + 1.001, True, False), Phase.READ_DONE, [], {}),
    ("reads done at the deadline: discarded", reading(deadline=T0 + 1, acked=True),
     ps.ReadStates(T0 + 0.9, T0 + 1.0, True, False), Phase.FAILING, [EXPIRED, *FAIL], {}),
    # peer dropped by the edge
    ("peer dropped before posting: handshake again", attached(), ps.PeerDropped(), Phase.HANDSHAKE, [ps.Do.HANDSHAKE],
     {"peer_instance": None, "verified": False}),
    ("peer dropped while reading: the READs decide", reading(), ps.PeerDropped(), Phase.READING, [], {}),
    # failing
    ("failing: retries releasing each tick", reading(phase=Phase.FAILING, failure="x", failed_at=T0),
     ps.Tick(T0 + 1, WALL), Phase.FAILING, FAIL, {"failure": "x"}),
    ("failing: all released", reading(phase=Phase.FAILING, failure="x", failed_at=T0), ps.ReadsReleased(T0 + 1, 0),
     Phase.FAILED, [ps.ReportFailed("x")], {}),
    ("failing: all released, the source is told", reading(phase=Phase.FAILING, failure="x", failed_at=T0,
                                                          release_remote=True), ps.ReadsReleased(T0 + 1, 0),
     Phase.FAILED, [ps.Do.SEND_RELEASE, ps.ReportFailed("x")], {}),
    ("failing: a READ still pending within the grace", reading(phase=Phase.FAILING, failure="x", failed_at=T0),
     ps.ReadsReleased(T0 + 5, 1), Phase.FAILING, [], {}),
    ("failing: past the grace, given up on", reading(phase=Phase.FAILING, failure="x", failed_at=T0),
     ps.ReadsReleased(T0 + 10.5, 1), Phase.FAILED, [ps.Do.ORPHAN, ps.ReportFailed("x")], {}),
    ("failing: heartbeats are no longer read", reading(phase=Phase.FAILING, failure="x", failed_at=T0), answer(),
     Phase.FAILING, [], {"acked": False}),
    ("the first failure's reason stays", reading(phase=Phase.FAILING, failure="first", failed_at=T0),
     ps.Failed(T0 + 1, "second"), Phase.FAILING, FAIL, {"failure": "first", "failed_at": T0}),
    ("an internal error fails the pull", reading(), ps.Failed(T0 + 1, "bug"), Phase.FAILING, FAIL, {"failure": "bug"}),
    # terminal
    ("done ignores events", reading(phase=Phase.DONE), ps.Tick(T0 + 100, WALL), Phase.DONE, [], {}),
    ("failed ignores events", reading(phase=Phase.FAILED, failure="x"), ps.Failed(T0, "y"), Phase.FAILED, [],
     {"failure": "x"}),
]


def field_of(state: ps.PullState, path: str) -> Any:
    value: Any = state
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("name, state, event, phase, actions, fields", ROWS, ids=[r[0] for r in ROWS])
def test_step(name: str, state: ps.PullState, event: Any, phase: Phase, actions: list[Any],
              fields: dict[str, Any]) -> None:
    after, got = ps.step(state, event)
    assert after.phase is phase
    assert got == actions
    for path, want in fields.items():
        value = field_of(after, path)
        assert value == pytest.approx(want) if isinstance(want, float) else value == want, path


def test_step_is_pure() -> None:
    """The same (state, event) gives the same result, and the input state is left as it was."""
    state = reading(deadline=T0 + 30, acked=True)
    before = replace(state)
    first = ps.step(state, ps.ReadStates(T0 + 1, T0 + 1, True, False))
    assert ps.step(state, ps.ReadStates(T0 + 1, T0 + 1, True, False)) == first
    assert state == before


def test_the_table_can_fail() -> None:
    """Negative control: a row with the wrong expectation is caught by the same assertions."""
    _, state, event, phase, actions, _ = next(r for r in ROWS if r[0] == "reads done, acked: complete")
    after, got = ps.step(state, event)
    assert (after.phase, got) == (phase, actions)
    assert (after.phase, got) != (Phase.READ_DONE, [])
    late = replace(state, deadline=T0 + 0.5)  # the same READs, finished after the lease
    assert ps.step(late, event)[1] != actions


def test_a_whole_pull_walks_the_phases() -> None:
    """Start to done, eager off: handshake, ack, post, READs, complete."""
    s, out = ps.step(ps.PullState("r", "prefill-0", T0, where="h:1"), ps.Start(T0))
    assert out == [ps.Do.SEND_HEARTBEAT]
    s, out = ps.step(s, ready())
    assert (s.phase, out) == (Phase.ATTACHED, [])          # not verified yet
    s, out = ps.step(s, answer(30.0))
    assert s.verified and s.acked and out == []
    s, out = ps.step(s, ps.Tick(T0 + 0.05, WALL))
    assert out == [ps.Do.POST]
    s, out = ps.step(s, ps.Posted(T0 + 0.05, T0 + 0.06, 10))
    assert (s.phase, out) == (Phase.READING, [])
    s, out = ps.step(s, ps.Tick(T0 + 0.07, WALL))
    assert out == [ps.CheckReads(T0 + 0.07)]
    s, out = ps.step(s, ps.ReadStates(T0 + 0.07, T0 + 0.08, True, False))
    assert (s.phase, out) == (Phase.DONE, [ps.Do.COMPLETE])


def test_a_1_4_pull_walks_the_phases_only_after_the_grant() -> None:
    """Start to done with a lease id: handshake and bound first, nothing posted until the ack."""
    s, out = ps.step(ps.PullState("r", "prefill-0", T0, "i1", lease_bound=T0 + 30, where="h:1", single_use=True,
                                  config=ps.Config(eager=True)), ps.Start(T0))
    assert out == [ps.Do.SEND_HEARTBEAT]
    s, out = ps.step(s, ready())
    assert (s.phase, out) == (Phase.ATTACHED, [])          # verified, bound left, eager: still no READ
    s, out = ps.step(s, ps.Tick(T0 + 0.015, WALL))
    assert out == []
    s, out = ps.step(s, answer(30.0))
    assert s.acked and out == []
    s, out = ps.step(s, ps.Tick(T0 + 0.03, WALL))
    assert out == [ps.Do.POST]
    s, out = ps.step(s, ps.Posted(T0 + 0.03, T0 + 0.04, 10))
    s, out = ps.step(s, ps.ReadStates(T0 + 0.05, T0 + 0.06, True, False))
    assert (s.phase, out) == (Phase.DONE, [ps.Do.COMPLETE])
