"""Decode side: lease notices for requests this rank is not pulling: keep-alives and the release outbox.

``keep_alive`` extends the source's leases of requests to be pulled later (fire and forget).
``release`` tells the source this rank will not read them; the outbox is the sink's edge of
``release_retry.py`` (which decides when to resend and when to give up): each notice is one
side-channel heartbeat with ``release=True``; ``advance`` (on every sink poll) reads the answers
and resends the ids a source does not hold yet. Never blocks; past ``MAX_PENDING_RELEASES``
notices the oldest is given up (its lease runs its course). Both split many ids into
message-sized chunks (heartbeats.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from pdfleet.connector.transfer import wire
from pdfleet.contract.connector_counters import SinkCounters
from pdfleet.connector.transfer.heartbeats import LEASE_ID_COST, check_lease_ids, chunk_request_ids, lease_ids_field
from pdfleet.connector.transfer.layout import IncompatibleLayout, KVLayout
from pdfleet.connector.transfer.pull_args import readers_per_rank, source_port
from pdfleet.connector.transfer.release_retry import ReleaseRetry, release_retry, unconfirmed
from pdfleet.connector.transfer.sidechannel import Call, SideChannelClient, SideChannelError

__all__ = ["MAX_PENDING_RELEASES", "LeaseNotices"]

log = logging.getLogger("pdfleet.connector.transfer.sink.lease_notices")  # under the sink's logger: its level applies

Endpoint = tuple[str, int]

# Release notices awaiting the source's word; past this the oldest is given up (its lease runs its course).
MAX_PENDING_RELEASES = 1024


@dataclass
class _Release:
    """A release notice on its way: the ids the source has not confirmed yet (release_retry.py)."""

    endpoint: Endpoint
    ids: tuple[str, ...]
    readers: int
    first_sent: float  # monotonic
    lease_ids: dict[str, bytes | None] = field(default_factory=dict)  # params 1.4: each id's lease id
    sends: int = 0
    call: Call | None = None  # the send in flight
    next_at: float = 0.0  # monotonic: the next send, when none is in flight


class LeaseNotices:
    def __init__(self, *, client: SideChannelClient, agent_name: str, layout: KVLayout, policy: ReleaseRetry,
                 timeout: float, counts: SinkCounters) -> None:
        self._layout = layout
        self._client = client
        self._agent_name = agent_name
        self._policy = policy
        self._timeout = timeout
        self._counts = counts
        self._calls: deque[_Release] = deque()  # releases sent, not yet confirmed by the source

    def __len__(self) -> int:
        return len(self._calls)

    def _chunks(self, what: str, request_ids: list[str], port: int, remote_tp_size: int | None,
                lease_ids: list[bytes | None] | None) -> tuple[int, dict[str, bytes | None], list[list[str]]] | None:
        try:
            port = source_port(self._layout, port, remote_tp_size)
            by_id = check_lease_ids(request_ids, lease_ids)
            chunks = chunk_request_ids([str(r) for r in request_ids], extra_per_id=LEASE_ID_COST if by_id else 0)
        except (IncompatibleLayout, ValueError, TypeError) as exc:
            log.warning("%s ignored: %s", what, exc)
            return None
        return port, by_id, chunks

    def keep_alive(self, request_ids: list[str], *, host: str, port: int, remote_tp_size: int | None = None,
                   lease_ids: list[bytes | None] | None = None) -> None:
        """See ``KVSink.keep_alive``."""
        planned = self._chunks("keep_alive", request_ids, port, remote_tp_size, lease_ids)
        if planned is None:
            return
        port, by_id, chunks = planned
        for ids in chunks:  # every queued request keeps its lease, however many there are
            req = wire.HeartbeatRequest(id=SideChannelClient.next_id(), request_ids=ids, agent=self._agent_name,
                                        readers=readers_per_rank(self._layout, remote_tp_size),
                                        lease_ids=lease_ids_field(ids, by_id))
            try:
                self._client.submit(host, port, req, timeout=self._timeout, attempts=1)
            except ValueError as exc:  # an id too long for one request: that chunk is skipped
                log.warning("keep_alive chunk of %d id(s) ignored: %s", len(ids), exc)
                continue
            self._counts.heartbeats += 1

    def release(self, request_ids: list[str], *, host: str, port: int, remote_tp_size: int | None = None,
                lease_ids: list[bytes | None] | None = None) -> None:
        """See ``KVSink.release``."""
        planned = self._chunks("release", request_ids, port, remote_tp_size, lease_ids)
        if planned is None:
            return
        port, by_id, chunks = planned
        for ids in chunks:
            self.send(host, port, ids, readers_per_rank(self._layout, remote_tp_size), by_id)

    def send(self, host: str, port: int, ids: list[str], readers: int,
             lease_ids: dict[str, bytes | None] | None = None) -> None:
        r = _Release((host, port), tuple(ids), readers, first_sent=time.monotonic(),
                     lease_ids={rid: lease_ids[rid] for rid in ids if lease_ids and lease_ids.get(rid)})
        if self._submit(r):
            if len(self._calls) >= MAX_PENDING_RELEASES:  # a flood: the oldest runs its lease
                self._calls.popleft()
                self._counts.releases_unconfirmed += 1
            self._calls.append(r)

    def _submit(self, r: _Release) -> bool:
        req = wire.HeartbeatRequest(id=SideChannelClient.next_id(), request_ids=list(r.ids), agent=self._agent_name,
                                    release=True, readers=r.readers, lease_ids=lease_ids_field(r.ids, r.lease_ids))
        try:
            r.call = self._client.submit(*r.endpoint, req, timeout=self._timeout, attempts=1)
        except ValueError as exc:
            log.warning("release of %d id(s) ignored: %s", len(r.ids), exc)
            return False
        r.sends += 1
        if r.sends == 1:
            self._counts.releases += 1
        else:
            self._counts.release_retries += 1
        return True

    def advance(self, now: float) -> None:
        """Resend releases the source did not act on yet (release_retry: its hold may come after them)."""
        for _ in range(len(self._calls)):
            r = self._calls.popleft()
            if r.call is not None:
                if not r.call.done():
                    self._calls.append(r)
                    continue
                fut, r.call = r.call, None
                try:
                    reply = fut.result()
                except SideChannelError:
                    reply = None
                if reply is not None and not isinstance(reply, wire.HeartbeatReply):
                    self._counts.releases_unconfirmed += 1  # refused outright: sending it again changes nothing
                    continue
                ids = unconfirmed(r.ids, answered=reply is not None,
                                  remaining=() if reply is None else reply.remaining,
                                  gone=() if reply is None else reply.gone)
                decision = release_retry(self._policy, ids, now=now, first_sent=r.first_sent, sends=r.sends)
                if not decision.ids:
                    if ids:
                        self._counts.releases_unconfirmed += 1
                        log.debug("release of %d id(s) at %s:%d: %s", len(ids), *r.endpoint, decision.why)
                    continue
                r.ids, r.next_at = decision.ids, now + decision.delay
            if now < r.next_at or self._submit(r):
                self._calls.append(r)
