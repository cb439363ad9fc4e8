"""One KV pull's life as a state machine (pure): ``step(state, event) -> (state, actions)``.

``KVSink`` (sink.py) is the I/O edge: it turns what happened (a heartbeat answered, a handshake
done, READs posted, NIXL's transfer states, a clock tick) into events, and executes the actions
this module returns (send a heartbeat, post the READs, release them, report the result). Times in
events are the edge's clocks: ``now`` monotonic, ``wall`` unix time; nothing here reads a clock.

Phases (``Phase``):
- HANDSHAKE: no peer yet; a handshake with the source is on its way.
- ATTACHED: the peer is known; the READs wait until they may be posted (the instance verified
  and a lease deadline known, or verified only with ``eager``; a single-use lease, params 1.4,
  only once the source granted it: an ack to a heartbeat naming its lease id).
- READING: READs posted, in flight.
- READ_DONE: every READ finished; the first lease ack is still awaited.
- FAILING: failed; waiting until no READ can still write local blocks.
- DONE, FAILED: reported (terminal).

Beside the phase, the lease (``deadline``, ``acked``, ``verified``) and the heartbeat
(``Heartbeat``: one in flight at most, its retry backoff) are plain fields: every phase before
the result keeps the lease alive the same way.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Optional, Union

from pdfleet.connector.transfer.retry import HeartbeatRetry, heartbeat_retry
from pdfleet.contract.connector_config import DEFAULTS as CONNECTOR_DEFAULTS

__all__ = [
    "Phase", "Config", "Heartbeat", "PullState", "step", "lease_verdict", "read_deadline_seconds",
    "Start", "Tick", "PeerReady", "PeerDropped", "HandshakeFailed", "Posted", "PostFailed", "ReadStates",
    "HeartbeatAnswer", "HeartbeatBad", "HeartbeatFailed", "ReadsReleased", "Failed",
    "Do", "CheckReads", "DropPeer", "ReportFailed", "Count",
]

# How long a failed pull waits for NIXL to cancel or finish its READs before it is
# reported anyway (so that a read can no longer land in blocks vLLM reuses).
RELEASE_GRACE_SECONDS = 10.0
# Advertised lease expiries are trusted only with a clock offset known this well, and
# with this much margin.
EXPIRY_MAX_CLOCK_ERROR = 0.1
EXPIRY_SAFETY_MARGIN = 0.25
# How often to ask again about a request the source does not know yet.
UNKNOWN_RETRY_SECONDS = 0.02


def read_deadline_seconds(nbytes: int, floor_bandwidth: float, floor_seconds: float) -> float:
    """Seconds a READ of ``nbytes`` may take before it is given up: a floor plus its bytes at a floor bandwidth."""
    if not floor_bandwidth > 0 or not floor_seconds >= 0:
        raise ValueError("floor_bandwidth must be > 0 and floor_seconds >= 0")
    return floor_seconds + max(0, nbytes) / floor_bandwidth


def lease_verdict(now: float, deadline: float | None) -> str:
    """'unknown' before any ack, 'ok' while the lease holds, 'expired' once it ran out."""
    if deadline is None:
        return "unknown"
    return "ok" if now < deadline else "expired"


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    ATTACHED = "attached"
    READING = "reading"
    READ_DONE = "read_done"
    FAILING = "failing"
    DONE = "done"
    FAILED = "failed"


TERMINAL = (Phase.DONE, Phase.FAILED)
_READS_POSTED = (Phase.READING, Phase.READ_DONE)


@dataclass(frozen=True)
class Config:
    eager: bool = False                  # post once the instance is verified, before a deadline is known
    unknown_grace: float = 2.0           # how long a request the source does not know is asked about again
    retry: HeartbeatRetry = HeartbeatRetry()
    # A READ's bound: read_timeout_floor + its bytes at read_floor_bandwidth (the extra config's keys).
    read_floor_bandwidth: float = CONNECTOR_DEFAULTS.read_floor_bandwidth
    read_timeout_floor: float = CONNECTOR_DEFAULTS.read_timeout_floor


@dataclass(frozen=True)
class Heartbeat:
    in_flight: bool = False
    sent: float = 0.0                    # monotonic, the last one sent
    interval: float = 1.0                # between heartbeats once a lease is known (a third of it)
    retry: bool = False                  # the source did not know the request yet: ask again soon
    failing_since: Optional[float] = None  # first unanswered heartbeat since the last answer
    retries: int = 0                     # unanswered heartbeats retried since then
    not_before: float = 0.0              # the next one waits until then (retry backoff)


@dataclass(frozen=True)
class PullState:
    request_id: str
    remote_engine_id: str
    started: float                                 # monotonic
    remote_instance_id: Optional[str] = None       # from the request's params
    remote_lease_expiry: Optional[float] = None    # source's unix time, from params <= 1.2
    # An upper bound of the lease (monotonic; params >= 1.3: accepted + remote_lease_seconds). It
    # bounds heartbeat retries and lets a READ start; it is never a reason to complete.
    lease_bound: Optional[float] = None
    config: Config = Config()
    phase: Phase = Phase.HANDSHAKE
    where: str = ""                                # "host:port" of the source, for messages
    peer_instance: Optional[str] = None            # the attached peer's instance (None: no peer)
    peer_agent: str = ""
    clock_offset: float = 0.0                      # source unix time - local unix time (the peer's estimate)
    clock_error: float = float("inf")
    verified: bool = False                         # the peer's instance is the one holding the lease
    ack_instance: Optional[str] = None             # instance that answered a heartbeat
    deadline: Optional[float] = None               # monotonic; from acks or the advertised expiry
    acked: bool = False                            # an ack confirmed the source holds the blocks
    released_by_us: bool = False                   # the source released on our own completion notification
    hb: Heartbeat = field(default_factory=Heartbeat)
    posted_at: Optional[float] = None
    completed_at: Optional[float] = None
    nbytes: int = 0
    failure: Optional[str] = None
    failed_at: Optional[float] = None
    release_remote: bool = False                   # once failed: tell the source to free the blocks
    # params 1.4: the pull names its lease id; READs wait for the source's grant (an ack), and the
    # source's "released by you" is no confirmation (a spent lease confirms nothing).
    single_use: bool = False


# -- events -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Start:
    now: float


@dataclass(frozen=True)
class Tick:
    """One poll of the sink: keep the lease alive, post, check the READs, complete."""
    now: float
    wall: float


@dataclass(frozen=True)
class PeerReady:
    """A peer to attach (cached or just handshaken); ``block_error``: the block ids do not fit it."""
    now: float
    wall: float
    instance_id: str
    engine_id: str
    agent: str
    clock_offset: float = 0.0
    clock_error: float = float("inf")
    block_error: Optional[str] = None


@dataclass(frozen=True)
class PeerDropped:
    """The edge dropped the cached peer this pull was attached to."""


@dataclass(frozen=True)
class HandshakeFailed:
    now: float
    reason: str


@dataclass(frozen=True)
class Posted:
    posted_at: float
    now: float
    nbytes: int


@dataclass(frozen=True)
class PostFailed:
    now: float
    reason: str
    any_posted: bool


@dataclass(frozen=True)
class ReadStates:
    now: float           # the tick's time (the READ's bound is checked against it)
    observed: float      # after the states were read: a completion is no earlier than this
    done: bool
    error: bool


@dataclass(frozen=True)
class HeartbeatAnswer:
    """A HeartbeatReply: ``left`` seconds the source still holds the request, or None (not held)."""
    now: float
    instance_id: str
    left: Optional[float]
    released_by_us: bool = False
    gone: bool = False


@dataclass(frozen=True)
class HeartbeatBad:
    """An answer that is no ack (refused, or not a heartbeat reply)."""
    now: float
    reason: str


@dataclass(frozen=True)
class HeartbeatFailed:
    """No answer (timeout, connection): retried while the lease has time."""
    now: float
    wall: float
    error: str


@dataclass(frozen=True)
class ReadsReleased:
    now: float
    remaining: int       # READs NIXL could neither cancel nor finish yet


@dataclass(frozen=True)
class Failed:
    """Fail from outside (an internal error of the edge)."""
    now: float
    reason: str


Event = Union[Start, Tick, PeerReady, PeerDropped, HandshakeFailed, Posted, PostFailed, ReadStates,
              HeartbeatAnswer, HeartbeatBad, HeartbeatFailed, ReadsReleased, Failed]


# -- actions ----------------------------------------------------------------------------------
class Do(enum.Enum):
    """Actions without data; the edge executes them in the order given."""

    SEND_HEARTBEAT = "send a lease heartbeat (the state already counts it as in flight)"
    HANDSHAKE = "make sure a handshake with the source is on its way"
    POST = "post the READs; answer Posted or PostFailed"
    RELEASE_READS = "release the READs NIXL has finished or can cancel; answer ReadsReleased"
    ORPHAN = "give up on READs not cancelled within the grace (they are released later)"
    SEND_RELEASE = "tell the source to free the blocks (this rank will not read them)"
    COMPLETE = "report the pull done"


@dataclass(frozen=True)
class CheckReads:
    """Read NIXL's transfer states and answer with ReadStates (``now``: this tick's time)."""
    now: float


@dataclass(frozen=True)
class DropPeer:
    why: str


@dataclass(frozen=True)
class ReportFailed:
    reason: str


@dataclass(frozen=True)
class Count:
    stat: str


Action = Union[Do, CheckReads, DropPeer, ReportFailed, Count]
Result = tuple[PullState, list[Action]]


# -- the step function ------------------------------------------------------------------------
def step(s: PullState, e: Event) -> Result:
    """The next state of a pull after ``e``, and what the edge must do, in order."""
    if s.phase in TERMINAL:
        return s, []
    if isinstance(e, Failed):
        return _fail(s, e.reason, e.now)
    if s.phase is Phase.FAILING:
        # Only releasing its READs is left (each tick tries again).
        if isinstance(e, Tick):
            return _fail(s, s.failure or "", e.now)
        if isinstance(e, ReadsReleased):
            return _released(s, e)
        return s, []
    if isinstance(e, Start):
        return _heartbeat(s, e.now), [Do.SEND_HEARTBEAT]
    if isinstance(e, Tick):
        return _tick(s, e)
    if isinstance(e, PeerReady):
        return _peer_ready(s, e)
    if isinstance(e, PeerDropped):
        if s.phase is Phase.ATTACHED:
            return _unattach(s), [Do.HANDSHAKE]
        return s, []
    if isinstance(e, HandshakeFailed):
        return _fail(s, e.reason, e.now) if s.phase is Phase.HANDSHAKE else (s, [])
    if isinstance(e, Posted):
        return _posted(s, e)
    if isinstance(e, PostFailed):
        out: list[Action] = [DropPeer(f"READ failed: {e.reason}")]
        if not e.any_posted:
            s, out = _unattach(s), out + [Do.HANDSHAKE]
        s, more = _fail(s, f"NIXL READ from {s.peer_agent} failed: {e.reason}", e.now)
        return s, out + more
    if isinstance(e, ReadStates):
        return _read_states(s, e)
    if isinstance(e, (HeartbeatAnswer, HeartbeatBad, HeartbeatFailed)):
        return _heartbeat_result(s, e)
    if isinstance(e, ReadsReleased):
        return s, []
    raise TypeError(f"not a pull event: {e!r}")


def _heartbeat(s: PullState, now: float) -> PullState:
    return replace(s, hb=replace(s.hb, in_flight=True, sent=now))


def _unattach(s: PullState) -> PullState:
    return replace(s, phase=Phase.HANDSHAKE, peer_instance=None, verified=False)


def _fail(s: PullState, reason: str, now: float) -> Result:
    if s.failure is None:
        s = replace(s, failure=reason, failed_at=now)
    return replace(s, phase=Phase.FAILING), [Do.RELEASE_READS]


def _released(s: PullState, e: ReadsReleased) -> Result:
    out: list[Action] = []
    if e.remaining and e.now - (s.failed_at if s.failed_at is not None else e.now) > RELEASE_GRACE_SECONDS:
        out.append(Do.ORPHAN)
    elif e.remaining:
        return s, []
    if s.release_remote:
        out.append(Do.SEND_RELEASE)
    return replace(s, phase=Phase.FAILED), out + [ReportFailed(s.failure or "")]


def _deadline_from_expiry(s: PullState, now: float, wall: float) -> Optional[float]:
    """Monotonic deadline for the advertised source-clock expiry, or None if too uncertain or too close."""
    if s.remote_lease_expiry is None or s.clock_error > EXPIRY_MAX_CLOCK_ERROR:
        return None
    left = s.remote_lease_expiry - s.clock_offset - wall - s.clock_error - EXPIRY_SAFETY_MARGIN
    return now + left if left > 0 else None


def _may_post(s: PullState, now: float, wall: float) -> tuple[PullState, bool]:
    # Safe mode needs a deadline (from the lease ack, or a 1.2 expiry corrected for clock offset)
    # or a 1.3 lease bound with time left; eager mode posts as soon as the instance is known.
    # Starting a READ on the bound (an upper bound: the params spent some time in transit) risks
    # only a wasted READ, never wrong bytes: the request completes only once an ack confirmed
    # the source held the blocks for the whole READ.
    if not s.verified:
        return s, False
    if s.single_use:
        # Only a grant: the lease bound and eager posting also hold for params replayed after the
        # lease was spent (their blocks may hold another request's KV by then).
        return s, s.acked and s.deadline is not None
    if s.deadline is None and s.remote_lease_expiry is not None and s.peer_instance is not None:
        s = replace(s, deadline=_deadline_from_expiry(s, now, wall))
    bound_left = s.lease_bound is not None and s.lease_bound - now > EXPIRY_SAFETY_MARGIN
    return s, s.config.eager or s.deadline is not None or bound_left


def _try_post(s: PullState, now: float, wall: float) -> Result:
    s, may = _may_post(s, now, wall)
    if not may:
        return s, []
    if lease_verdict(now, s.deadline) == "expired":
        s, out = _fail(s, "the source's lease on the blocks expired before the read was posted", now)
        return s, [Count("expired_leases"), *out]
    return s, [Do.POST]


def _peer_ready(s: PullState, e: PeerReady) -> Result:
    if s.phase is not Phase.HANDSHAKE:
        return s, []
    if e.engine_id != s.remote_engine_id:
        return _fail(s, f"{s.where} serves engine {e.engine_id!r}, not {s.remote_engine_id!r}", e.now)
    expected = s.remote_instance_id or s.ack_instance
    if expected is not None and expected != e.instance_id:
        return _fail(s, f"the source at {s.where} is instance {e.instance_id}, not {expected}"
                        " (it restarted: the request's blocks are gone)", e.now)
    s = replace(s, phase=Phase.ATTACHED, peer_instance=e.instance_id, peer_agent=e.agent,
                clock_offset=e.clock_offset, clock_error=e.clock_error, verified=expected is not None)
    if e.block_error is not None:
        return _fail(s, f"invalid pull: {e.block_error}", e.now)
    return _try_post(s, e.now, e.wall)


def _posted(s: PullState, e: Posted) -> Result:
    s = replace(s, phase=Phase.READING, posted_at=e.posted_at, nbytes=e.nbytes)
    if not s.acked and not s.hb.in_flight:
        # Overlap the lease confirmation with the READ: ask now, not after a retry delay.
        return _heartbeat(replace(s, hb=replace(s.hb, retry=False)), e.now), [Do.SEND_HEARTBEAT]
    return s, []


def _retry_horizon(s: PullState, now: float, wall: float) -> Optional[float]:
    """How long heartbeats may be retried (monotonic): the lease deadline, or before the first ack
    the lease's upper bound (``lease_bound``, no clock of the source involved) and/or the
    advertised expiry on our clock, its offset's error bound taken off; the earlier of those known.
    Only for retrying: a pull still completes only once an ack confirmed the lease."""
    if s.deadline is not None:
        return s.deadline
    known = [] if s.lease_bound is None else [s.lease_bound]
    if s.remote_lease_expiry is not None and s.peer_instance is not None and math.isfinite(s.clock_error):
        known.append(now + (s.remote_lease_expiry - s.clock_offset - wall - s.clock_error))
    return min(known) if known else None


def _heartbeat_result(s: PullState, e: Union[HeartbeatAnswer, HeartbeatBad, HeartbeatFailed]) -> Result:
    """Fold a finished heartbeat into the pull."""
    hb = replace(s.hb, in_flight=False)
    if isinstance(e, HeartbeatFailed):
        failing_since = hb.failing_since if hb.failing_since is not None else e.now
        decision = heartbeat_retry(s.config.retry, now=e.now, deadline=_retry_horizon(s, e.now, e.wall),
                                   failing_since=failing_since, retries=hb.retries)
        if decision.retry:  # the lease has time: keep the blocks, ask again after a backoff
            hb = replace(hb, failing_since=failing_since, retries=hb.retries + 1, retry=True,
                         not_before=e.now + decision.delay)
            return replace(s, hb=hb), [Count("heartbeat_retries")]
        return _fail(replace(s, hb=replace(hb, failing_since=failing_since)),
                     f"lease heartbeat to {s.where} failed: {e.error}; {decision.why}", e.now)
    s = replace(s, hb=replace(hb, failing_since=None, retries=0))
    if isinstance(e, HeartbeatBad):
        return _fail(s, e.reason, e.now)
    out: list[Action] = []
    s = replace(s, ack_instance=e.instance_id)
    stale = s.peer_instance is not None and e.instance_id != s.peer_instance
    if stale:
        # A new process answers at this address: its agent replaces the cached one.
        out.append(DropPeer("heartbeat answered by another instance"))
        if s.phase is Phase.ATTACHED:
            s, out = _unattach(s), out + [Do.HANDSHAKE]
    if s.remote_instance_id is not None and e.instance_id != s.remote_instance_id:
        s, more = _fail(s, f"the source at {s.where} restarted (instance {e.instance_id},"
                           f" the request was held by {s.remote_instance_id}): its blocks are gone", e.now)
        return s, out + more
    reads = s.phase in _READS_POSTED
    if stale and reads:
        s, more = _fail(s, "the source restarted while the read was in flight", e.now)
        return s, out + more
    if e.left is None:
        if e.released_by_us and reads and not s.single_use:
            # Our own completion notification released it. NIXL sends that notification
            # when the READ is complete, so the READ ran while the blocks were held; only
            # the first ack was late (the pull overtook the hold).
            completed = s.completed_at if s.completed_at is not None else e.now
            return replace(s, phase=Phase.READ_DONE, completed_at=completed, released_by_us=True, acked=True), out
        if e.gone:
            s, more = _fail(s, "the source no longer holds the request's blocks (lease expired or already"
                               " released)", e.now)
            return s, out + [Count("expired_leases"), *more]
        # Unknown: the source may not have processed its hold yet (the prefill response
        # can overtake it); ask again for a short while.
        if e.now - s.started < s.config.unknown_grace:
            return replace(s, hb=replace(s.hb, retry=True)), out
        s, more = _fail(s, f"the source does not know request {s.request_id!r} (never held, or held"
                           f" longer ago than it remembers) after {s.config.unknown_grace:.3g}s", e.now)
        return s, out + more
    s = replace(s, deadline=s.hb.sent + float(e.left), acked=True,
                hb=replace(s.hb, interval=max(0.05, float(e.left) / 3)),
                verified=True if s.peer_instance is not None else s.verified)
    return s, out


def _tick(s: PullState, e: Tick) -> Result:
    now = e.now
    out: list[Action] = []
    if s.completed_at is None or not s.acked:
        # Waiting (handshake, ack or transfer): keep the lease alive, give up once it ran out.
        # A READ may complete before the first ack (posted on the advertised expiry): the
        # heartbeat retries and the expiry bound must go on until the lease is confirmed,
        # or the pull would wait for an ack that nobody asks for any more.
        if lease_verdict(now, s.deadline) == "expired":
            where = "while the read was in flight" if s.phase in _READS_POSTED else "before the read was posted"
            s, more = _fail(s, f"the source's lease on the blocks expired {where}", now)
            return s, [Count("expired_leases"), *more]
        if not s.hb.in_flight and now >= s.hb.not_before:
            if s.hb.retry and now - s.hb.sent > UNKNOWN_RETRY_SECONDS:
                s, out = _heartbeat(replace(s, hb=replace(s.hb, retry=False)), now), [Do.SEND_HEARTBEAT]
            elif s.deadline is not None and now - s.hb.sent > s.hb.interval:
                s, out = _heartbeat(s, now), [Do.SEND_HEARTBEAT]
    if s.phase is Phase.HANDSHAKE:
        return s, out
    if s.phase is Phase.ATTACHED:
        s, more = _try_post(s, now, e.wall)
        return s, out + more
    if s.phase is Phase.READING:
        return s, out + [CheckReads(now)]
    s, more = _try_complete(s, now)  # READ_DONE
    return s, out + more


def _read_states(s: PullState, e: ReadStates) -> Result:
    if s.phase is not Phase.READING:
        return s, []
    if e.error:
        s, more = _fail(s, f"NIXL READ from {s.peer_agent} failed (transfer state ERR)", e.now)
        return s, [DropPeer("a READ failed"), *more]
    cfg = s.config
    bound = read_deadline_seconds(s.nbytes, cfg.read_floor_bandwidth, cfg.read_timeout_floor)
    posted = s.posted_at if s.posted_at is not None else e.now
    if not e.done and e.now - posted > bound:
        s, more = _fail(replace(s, release_remote=True),
                        f"the READ of {s.nbytes} bytes from {s.peer_agent} did not complete within"
                        f" {bound:.3g}s ({cfg.read_timeout_floor:g}s + its bytes at {cfg.read_floor_bandwidth / 1e6:g} MB/s):"
                        f" cancelled after {e.now - posted:.2f}s", e.now)
        return s, [Count("reads_timed_out"), *more]
    if not e.done:
        return s, []
    s = replace(s, phase=Phase.READ_DONE, completed_at=e.observed)  # observed now: no earlier than the real end
    out: list[Action] = []
    if not s.acked and not s.hb.in_flight:
        # The READ is done (its completion notification is on its way to the
        # source): ask for the lease at once instead of after the retry delay.
        s, out = _heartbeat(replace(s, hb=replace(s.hb, retry=False)), e.observed), [Do.SEND_HEARTBEAT]
    s, more = _try_complete(s, e.now)
    return s, out + more


def _try_complete(s: PullState, now: float) -> Result:
    assert s.completed_at is not None
    if not s.released_by_us:
        verdict = lease_verdict(s.completed_at, s.deadline)
        if verdict == "unknown" or not s.acked:
            return replace(s, phase=Phase.READ_DONE), []  # the first lease ack is still on its way
        if verdict == "expired":
            s, more = _fail(s, "the read completed after the source's lease expired: the blocks may"
                               " have been reused, data discarded", now)
            return s, [Count("expired_leases"), *more]
    return replace(s, phase=Phase.DONE), [Do.COMPLETE]
