"""Decode side: ``KVSink`` pulls a request's KV blocks from a ``KVSource`` with NIXL READs.

One per worker rank, single-threaded: NIXL calls and side-channel messages
(handshakes, lease heartbeats: non-blocking ZMQ) all happen on the caller's thread in
``pull``/``poll``, so ``pull`` never blocks the engine and nothing waits for the GIL.

Life of a pull:
1. ``pull`` validates its inputs (a bad one fails the request, reported by ``poll``).
2. The endpoint is ``host:port + remote_rank`` (``port`` is the source's base port).
   A cached peer whose instance id differs from ``remote_instance_id`` is dropped.
3. A heartbeat is sent at once: its ack extends the source's lease and tells how
   long the blocks stay held (the sink's deadline, on its own monotonic clock).
4. Without a cached peer, a handshake is run (timeouts, bounded retries).
5. The READs are posted (reads.py) once the peer is known, its instance verified and the lease
   ack has given a deadline that has not passed; with ``eager_post=True`` as soon as the instance
   is verified (the request still only completes if the ack then confirms the lease). A pull
   with a lease id (params 1.4) posts only after the source's grant of it, whatever the mode.
6. ``poll`` reports the request done when every READ is DONE, the ack arrived, and the
   completion was seen before the deadline; otherwise failed with a reason. While it
   waits, heartbeats extend the lease. A transfer or handshake error drops the peer so
   the next pull handshakes again (a restarted prefill gets a fresh agent).

Every decision of a pull (its phase, the lease, heartbeat retries, when to post, complete or
fail) is ``pull_state.step`` (pure, table-tested); this module is its I/O edge. Beside it: the
peer cache and handshakes (peers.py), the READs (reads.py), keep-alives and releases of requests
not pulled (lease_notices.py), a pull's arguments checked (pull_args.py).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from pdfleet.connector.transfer import pull_state as ps
from pdfleet.connector.transfer import wire
from pdfleet.contract.connector_config import DEFAULTS as CONNECTOR_DEFAULTS, ConnectorExtraConfig
from pdfleet.contract.connector_counters import SinkCounters
from pdfleet.connector.transfer.bounds import DropLog
from pdfleet.connector.transfer.descriptors import validate_block_ids
from pdfleet.connector.transfer.heartbeats import heartbeat_event
from pdfleet.connector.transfer.layout import (
    IncompatibleLayout,
    InvalidBlockIds,
    KVLayout,
    Region,
    Span,
    registration_spans,
)
from pdfleet.connector.transfer.nixl_agent import NixlAgent, NixlError
from pdfleet.connector.transfer.peers import Endpoint, Peer, Peers
from pdfleet.connector.transfer.pull_args import check_pull_args, check_sink_args, readers_per_rank
from pdfleet.connector.transfer.pull_state import read_deadline_seconds
from pdfleet.connector.transfer.reads import ReadPoster
from pdfleet.connector.transfer.lease_notices import LeaseNotices
from pdfleet.connector.transfer.release_retry import ReleaseRetry
from pdfleet.connector.transfer.retry import HeartbeatRetry
from pdfleet.connector.transfer.sidechannel import Call, SideChannelClient

__all__ = ["KVSink"]

log = logging.getLogger(__name__)


@dataclass
class _Pull:
    """A pull's I/O handles; its decisions live in ``state`` (pull_state.step)."""

    state: ps.PullState
    endpoint: Endpoint
    remote_ids: list[int]
    local_ids: list[int]
    readers: int = 1  # decode ranks reading this request from its source rank (decode TP / prefill TP)
    lease_id: bytes | None = None  # params 1.4: named in every message about this lease
    peer: Peer | None = None
    hb: Call | None = None  # the heartbeat in flight
    handles: list[Any] = field(default_factory=list)
    states: list[str] = field(default_factory=list)  # NIXL state per handle
    descriptors: int = 0

    @property
    def request_id(self) -> str:
        return self.state.request_id


class KVSink:
    """Decode-side transfer endpoint of one worker rank: ``pull`` (non-blocking, see the module doc),
    ``keep_alive`` and ``release`` (requests not pulled yet), ``poll() -> (done ids, {id: failure reason})``,
    ``stats()`` (counters since start), ``close``."""

    def __init__(
        self,
        *,
        engine_id: str,
        regions: Sequence[Region],
        layout: KVLayout,
        compat_hash: str,
        secret: bytes | None,
        settings: ConnectorExtraConfig = CONNECTOR_DEFAULTS,
        heartbeat_timeout: float = 2.0,
        eager_post: bool = False,
        unknown_grace: float = 2.0,
        nixl_progress_thread: bool = False,
        backing: Sequence[Span] | None = None,
        heartbeat_retry_policy: HeartbeatRetry = HeartbeatRetry(),
        release_retry_policy: ReleaseRetry = ReleaseRetry(),
        prepped_descriptors: bool = True,
        max_sockets: int | None = None,
        nixl_agent: Callable[..., NixlAgent] = NixlAgent,
    ) -> None:
        """``settings``: the connector's kv_connector_extra_config (backends, handshake_timeout,
        handshake_retries, read_floor_bandwidth, read_timeout_floor, nixl_threads, nixl_split_batch);
        the other arguments are the transfer core's own, for tests and benches (``nixl_agent``: what
        makes the agent, NixlAgent's signature; the adapter passes a fault hook's in the fault suite)."""
        check_sink_args(engine_id, regions, settings, heartbeat_retry_policy, release_retry_policy, unknown_grace)
        spans = registration_spans(regions, backing)
        backends = list(settings.backends)
        self.engine_id = engine_id
        self.regions = list(regions)
        self.layout = layout
        self.compat_hash = compat_hash
        self._min_local_blocks = min(r.num_blocks for r in self.regions)
        self._hb_timeout = float(heartbeat_timeout)
        read_deadline_seconds(0, settings.read_floor_bandwidth, settings.read_timeout_floor)  # validates both
        self._config = ps.Config(eager=bool(eager_post), unknown_grace=float(unknown_grace),
                                 retry=heartbeat_retry_policy,
                                 read_floor_bandwidth=float(settings.read_floor_bandwidth),
                                 read_timeout_floor=float(settings.read_timeout_floor))
        self.agent_name = f"pdfleet-sink-{engine_id}-r{layout.tp_rank}-{uuid.uuid4().hex[:12]}"
        # The sink polls its transfers itself; NIXL's progress thread would spin a core.
        self._agent = nixl_agent(self.agent_name, backends, progress_thread=nixl_progress_thread,
                                 nixl_threads=settings.nixl_threads, nixl_split_batch=settings.nixl_split_batch)
        # as NIXL instantiated it (0: one thread posts every descriptor)
        self.nixl_threads = int(self._agent.backend_options(backends[0]).get("num_threads", 0))
        self._agent.register(spans)
        self.registrations = len(spans)
        self._client = SideChannelClient(secret=secret, **({} if max_sockets is None else {"max_sockets": max_sockets}))
        self._counts = SinkCounters()  # shared with the peer cache, the READs and the lease notices
        self._peers = Peers(agent=self._agent, client=self._client, engine_id=engine_id, regions=self.regions,
                            layout=layout, compat_hash=compat_hash, handshake_timeout=float(settings.handshake_timeout),
                            handshake_retries=max(1, settings.handshake_retries),  # attempts: one at least
                            prepped_descriptors=prepped_descriptors, counts=self._counts)
        self._pulls: dict[str, _Pull] = {}
        self._done: list[str] = []
        self._failed: dict[str, str] = {}
        self._orphans: list[Any] = []  # handles of failed reads that could not be released yet
        self._reads = ReadPoster(self._agent, self.regions, self._peers.local_lists, self._counts)
        self._notices = LeaseNotices(client=self._client, agent_name=self.agent_name, layout=layout,
                                     policy=release_retry_policy, timeout=self._hb_timeout, counts=self._counts)
        self._drops = DropLog(10.0)

    # -- public API ------------------------------------------------------------
    def pull(
        self,
        request_id: str,
        *,
        host: str,
        port: int,
        remote_engine_id: str,
        remote_instance_id: str | None,
        remote_block_ids: list[int],
        local_block_ids: list[int],
        remote_tp_size: int | None = None,
        remote_lease_expiry: float | None = None,
        remote_lease_deadline: float | None = None,
        lease_id: bytes | None = None,
    ) -> None:
        """Start pulling; never raises for bad input (the request is reported failed by ``poll``).

        ``remote_lease_expiry`` (optional): the lease expiry the source advertised with the
        request (its ``hold`` return value or a lower bound of it, on the source's clock).
        With it, the READs can be posted before the first lease ack arrives, against a
        deadline corrected by the clock offset measured in the handshake.

        ``remote_lease_deadline`` (optional): an upper bound of the source's lease on this host's
        monotonic clock (params 1.3: when decode accepted them + ``remote_lease_seconds``). With time
        left it lets the READs start before the first ack, and it limits how long unanswered
        heartbeats are retried; being an upper bound it never completes a pull: only an ack does.

        ``lease_id`` (optional, params 1.4): the lease's random id. Every heartbeat, release and
        completion notification names it, and the READs wait for the source's grant of it (an ack
        naming this lease), whatever ``eager_post`` or the lease bound say: params replayed after
        the lease was spent get no grant, so nothing is read. Without it the pull runs as for 1.3.
        """
        rid = request_id if isinstance(request_id, str) else repr(request_id)
        try:
            if isinstance(request_id, str) and request_id in self._pulls:
                raise ValueError(f"request {request_id!r} is already being pulled")
            endpoint, remote_ids, local_ids = check_pull_args(
                self.layout, self._min_local_blocks, request_id=request_id, host=host, port=port,
                remote_engine_id=remote_engine_id, remote_instance_id=remote_instance_id,
                remote_block_ids=remote_block_ids, local_block_ids=local_block_ids, remote_tp_size=remote_tp_size,
                remote_lease_expiry=remote_lease_expiry, remote_lease_deadline=remote_lease_deadline,
                lease_id=lease_id)
        except (ValueError, InvalidBlockIds, IncompatibleLayout) as exc:
            self._fail_now(rid, f"invalid pull: {exc}")
            return
        now = time.monotonic()
        state = ps.PullState(rid, remote_engine_id, now, remote_instance_id or None,
                             None if remote_lease_expiry is None else float(remote_lease_expiry),
                             lease_bound=None if remote_lease_deadline is None else float(remote_lease_deadline),
                             config=self._config, where=f"{endpoint[0]}:{endpoint[1]}",
                             single_use=lease_id is not None)
        p = _Pull(state, endpoint, remote_ids, local_ids, readers=readers_per_rank(self.layout, remote_tp_size), lease_id=lease_id)
        self._pulls[rid] = p
        try:
            peer = self._peers.get(endpoint)
            if peer is not None and (
                peer.engine_id != remote_engine_id
                or (state.remote_instance_id is not None and peer.instance_id != state.remote_instance_id)
            ):
                self._drop_peer(endpoint, "the remote instance changed")
                peer = None
            self._step(p, ps.Start(now))
            if peer is None:
                self._peers.handshake(endpoint)
            else:
                self._attach(p, peer)
        except Exception as exc:  # never leave a pull behind that nobody will finish (its id would be refused)
            log.exception("KV pull %s: could not start", rid)
            if self._pulls.get(rid) is p and not p.handles:
                del self._pulls[rid]
                self._fail_now(rid, f"could not start the pull: {exc!r}")

    def keep_alive(self, request_ids: list[str], *, host: str, port: int, remote_tp_size: int | None = None,
                   lease_ids: list[bytes | None] | None = None) -> None:
        """Extend the source's leases of requests this rank will pull later (fire and forget);
        ``lease_ids``: each request's lease id (params 1.4; None for none)."""
        self._notices.keep_alive(request_ids, host=host, port=port, remote_tp_size=remote_tp_size, lease_ids=lease_ids)

    def release(self, request_ids: list[str], *, host: str, port: int, remote_tp_size: int | None = None,
                lease_ids: list[bytes | None] | None = None) -> None:
        """Tell the source this rank will not read these requests (aborted, nothing to pull): it frees them now.
        ``lease_ids``: each request's lease id (params 1.4; a lease held under an id is freed only by it).

        Never blocks: ``poll`` sends it again while the source has not acted on it yet (its hold can
        come after the notice; release_retry.py); one given up on leaves the blocks to their lease."""
        self._notices.release(request_ids, host=host, port=port, remote_tp_size=remote_tp_size, lease_ids=lease_ids)

    def poll(self) -> tuple[list[str], dict[str, str]]:
        self._client.poll()
        now = time.monotonic()
        self._notices.advance(now)
        self._collect_handshakes()
        for p in list(self._pulls.values()):
            try:
                self._advance(p, now)
            except Exception as exc:  # a bug here must fail one request, not the engine
                log.exception("KV pull %s: internal error", p.request_id)
                if self._pulls.get(p.request_id) is p:
                    self._orphans.extend(p.handles)
                    p.handles = []
                    del self._pulls[p.request_id]
                    self._fail_now(p.request_id, f"internal error in the transfer core: {exc!r}")
        self._orphans = [h for h in self._orphans if not self._agent.release(h)]
        done, self._done = self._done, []
        failed, self._failed = self._failed, {}
        return done, failed

    def stats(self) -> dict[str, float]:
        c = self._counts
        c.messages_rejected = float(self._client.rejected)
        c.in_flight = float(len(self._pulls))
        c.peers = float(len(self._peers))
        return asdict(c)

    def close(self) -> None:
        for p in self._pulls.values():
            for h in p.handles:
                self._agent.release(h)
        self._pulls.clear()
        self._peers.close()
        self._client.close()
        self._agent.close()

    # -- the edge of pull_state.step ------------------------------------------------
    def _step(self, p: _Pull, event: ps.Event) -> None:
        """Feed one event to a pull's state machine and execute its actions, in order."""
        p.state, actions = ps.step(p.state, event)
        if p.state.peer_instance is None:
            p.peer = None
        for action in actions:
            if self._pulls.get(p.request_id) is not p:
                return  # reported (or failed by an action before this one)
            self._execute(p, action)

    def _execute(self, p: _Pull, action: ps.Action) -> None:
        if action is ps.Do.SEND_HEARTBEAT:
            self._heartbeat(p)
        elif action is ps.Do.HANDSHAKE:
            self._peers.handshake(p.endpoint)
        elif action is ps.Do.POST:
            self._post(p)
        elif isinstance(action, ps.CheckReads):
            self._check_reads(p, action.now)
        elif isinstance(action, ps.DropPeer):
            self._drop_peer(p.endpoint, action.why)
        elif action is ps.Do.RELEASE_READS:
            p.handles = [h for h in p.handles if not self._agent.release(h)]
            self._step(p, ps.ReadsReleased(time.monotonic(), len(p.handles)))
        elif action is ps.Do.ORPHAN:
            log.error("KV pull %s: %d READ(s) could not be cancelled; reporting the failure anyway",
                      p.request_id, len(p.handles))
            self._orphans.extend(p.handles)
            p.handles = []
        elif action is ps.Do.SEND_RELEASE:
            self._notices.send(*p.endpoint, [p.request_id], p.readers, {p.request_id: p.lease_id})
        elif isinstance(action, ps.ReportFailed):
            del self._pulls[p.request_id]
            self._fail_now(p.request_id, action.reason)
        elif action is ps.Do.COMPLETE:
            self._complete(p)
        elif isinstance(action, ps.Count):
            setattr(self._counts, action.stat, getattr(self._counts, action.stat) + 1)
        else:
            raise TypeError(f"not a pull action: {action!r}")

    def _advance(self, p: _Pull, now: float) -> None:
        if p.state.phase is not ps.Phase.FAILING and p.hb is not None and p.hb.done():
            call, p.hb = p.hb, None
            self._step(p, heartbeat_event(call, p.request_id))
            if p.state.phase is ps.Phase.FAILING or self._pulls.get(p.request_id) is not p:
                return  # failed by the answer (READs not released at once are retried each poll)
        self._step(p, ps.Tick(now, time.time()))

    # -- internals -------------------------------------------------------------
    def _fail_now(self, rid: str, reason: str) -> None:
        # A flood of failing pulls (bad endpoints, a dead prefill) logs one line per kind per interval.
        held = self._drops.note(re.split(r"[\d'\"]", reason, maxsplit=1)[0][:60], time.monotonic())
        if held is not None:
            log.warning("KV pull %s failed: %s%s", rid, reason,
                        f" [and {held} more like it in the last {self._drops.interval:g}s]" if held else "")
        self._failed[rid] = reason
        self._counts.failures += 1

    def _drop_peer(self, endpoint: Endpoint, why: str) -> None:
        peer = self._peers.drop(endpoint, why)
        if peer is None:
            return
        for p in list(self._pulls.values()):
            if p.peer is peer:
                self._step(p, ps.PeerDropped())  # one not posted yet handshakes again

    def _heartbeat(self, p: _Pull) -> None:
        req = wire.HeartbeatRequest(id=SideChannelClient.next_id(), request_ids=[p.request_id], agent=self.agent_name,
                                    readers=p.readers, lease_ids=[p.lease_id] if p.lease_id else [])
        p.hb = self._client.submit(*p.endpoint, req, timeout=self._hb_timeout, attempts=2)
        self._counts.heartbeats += 1

    def _collect_handshakes(self) -> None:
        for done in self._peers.collect():
            for p in list(self._pulls.values()):
                if p.endpoint != done.endpoint or p.peer is not None:
                    continue
                if done.peer is None:
                    self._step(p, ps.HandshakeFailed(time.monotonic(), done.error))
                else:
                    self._attach(p, done.peer)

    def _attach(self, p: _Pull, peer: Peer) -> None:
        try:
            validate_block_ids(p.remote_ids, p.local_ids, local_num_blocks=self._min_local_blocks,
                               remote_num_blocks=peer.min_blocks)
            block_error = None
        except InvalidBlockIds as exc:
            block_error = str(exc)
        if p.state.phase is ps.Phase.HANDSHAKE:
            p.peer = peer  # kept only if the state machine attaches it
        self._step(p, ps.PeerReady(time.monotonic(), time.time(), peer.instance_id, peer.engine_id, peer.agent_name,
                                   peer.clock_offset, peer.clock_error, block_error))

    def _post(self, p: _Pull) -> None:
        """Post the pull's READs (contiguous block runs coalesced), each with its completion notification."""
        peer = p.peer
        assert peer is not None and not p.handles
        posted_at = time.monotonic()  # UCX may copy inside the post call (cma): count it as transfer too
        try:
            nbytes, p.descriptors = self._reads.post(peer, p.request_id, p.lease_id, p.local_ids, p.remote_ids,
                                                     p.handles)
        except NixlError as exc:
            self._step(p, ps.PostFailed(time.monotonic(), str(exc), any_posted=bool(p.handles)))
            return
        self._step(p, ps.Posted(posted_at, time.monotonic(), nbytes))

    def _check_reads(self, p: _Pull, now: float) -> None:
        self._reads.states(p.handles, p.states)
        self._step(p, ps.ReadStates(now, time.monotonic(), done=all(s == "DONE" for s in p.states),
                                    error="ERR" in p.states))

    def _complete(self, p: _Pull) -> None:
        for h in p.handles:
            self._agent.release(h)
        p.handles = []
        del self._pulls[p.request_id]
        self._reads.count_done(self.engine_id, p.peer, p.state, p.descriptors)
        self._done.append(p.request_id)
