"""Scheduler side of ``PdfleetConnector``: decides what to pull, what to hold, and validates.

Runs in vLLM's scheduler (engine-core process). Every decode-side request's
kv_transfer_params go through ``parse_remote_prefill`` here, before anything
reaches a worker; a request with bad params is computed locally (counted, and the
reason returned in its output's kv_transfer_params as ``pdfleet_error``).

What travels to the workers each step is a ``PdfleetConnectorMetadata``:
``pulls`` (decode: read these remote blocks into these local blocks), ``holds``
(prefill: keep these blocks under a lease for a remote decode) and the number of
params rejected since the last step (so workers can count it in their stats).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from pdfleet.connector.adapter.config import AdapterConfig, key_ring
from pdfleet.connector.transfer.bounds import DropLog
from pdfleet.connector.adapter.signed_params import reuse_verifier, sign_params, sign_reuse, verifier
from pdfleet.connector.adapter.turn_reuse import hold_budget, holds_to_release, matched_blocks, tokens_to_pull
from pdfleet.contract.kv_params import (
    DO_REMOTE_PREFILL,
    KEEP_ALIVE_KEY,
    KEPT,
    RELEASE_KEY,
    REUSE_KEY,
    REUSE_SIG_KEY,
    SIG_KEY,
    InvalidTransferParams,
    RemotePrefill,
    error_params,
    lease_id_of,
    num_tokens_to_pull,
    has_reuse,
    keep_alive_offers,
    keep_alive_reply,
    own_held_offer,
    own_lease_to_release,
    parse_remote_prefill,
    parse_reuse,
    produce,
    release_reply,
    release_target,
    reuse_release_target,
    wants_hold_for_next_turn,
    wants_keep_alive,
    wants_release,
    wants_remote_decode,
    wants_remote_prefill,
    with_block_hashes,
)

__all__ = ["KeepAlive", "PullSpec", "PdfleetConnectorMetadata", "SchedulerSide"]

log = logging.getLogger(__name__)

# Seconds between lease heartbeats for queued pulls: one small message per prefill endpoint,
# well inside any sensible lease.
KEEP_ALIVE_INTERVAL = 1.0


@dataclass(frozen=True)
class PullSpec:
    """One request a decode worker pulls; ``error`` set means: report it failed at once."""

    request_id: str
    remote: RemotePrefill | None
    local_block_ids: tuple[int, ...] = ()
    remote_block_ids: tuple[int, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class KeepAlive:
    """Prefill requests queued on decode but not pulled yet: their leases must not run out."""

    host: str
    port: int
    tp_size: int
    remote_request_ids: tuple[str, ...]
    hosts: tuple[str, ...] = ()  # one per prefill node (remote_hosts); () = every rank at `host`
    # params 1.4: each request's lease id, same order (None: params older than 1.4); () = none at all
    lease_ids: tuple[bytes | None, ...] = ()


@dataclass
class PdfleetConnectorMetadata(KVConnectorMetadata):
    pulls: dict[str, PullSpec] = field(default_factory=dict)
    holds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    keep_alive: tuple[KeepAlive, ...] = ()
    # Remote prefills this decode will never read (aborted before their pull, or nothing
    # to pull): the prefill frees their blocks at once instead of at lease expiry.
    releases: tuple[KeepAlive, ...] = ()
    # This prefill's own leases that the router says no decode will read: freed unless claimed.
    local_releases: tuple[str, ...] = ()
    # params 1.4: the lease id of each hold (a fresh random one) and of each local release, by request id
    hold_leases: dict[str, bytes] = field(default_factory=dict)
    local_release_leases: dict[str, bytes] = field(default_factory=dict)
    # Own holds for a next turn that the router keeps alive: request id -> lease id (extended by the
    # lease length from when the worker sees this)
    local_keep_alives: dict[str, bytes] = field(default_factory=dict)
    params_rejected: int = 0


@dataclass
class _Waiting:
    remote: RemotePrefill
    local_computed_tokens: int


class SchedulerSide:
    def __init__(
        self,
        *,
        cfg: AdapterConfig,
        engine_id: str,
        block_size: int,
        tp_size: int,
        is_producer: bool,
        is_consumer: bool,
        node_hosts: tuple[str, ...] = (),
        num_blocks: int = 0,
    ) -> None:
        self.cfg = cfg
        self.node_hosts = node_hosts  # a prefill over several pods: each node's side-channel host
        self.engine_id = engine_id
        self.block_size = block_size
        self.tp_size = tp_size
        self.is_producer = is_producer
        self.is_consumer = is_consumer
        self.instance_ids: dict[int, str] = {}
        self._waiting: dict[str, _Waiting] = {}  # valid remote prefills seen, not yet allocated
        self._handled: set[str] = set()  # requests whose pull (or skip) was decided
        self._rejected: dict[str, str] = {}  # request id -> reason
        self._pulls: dict[str, PullSpec] = {}
        self._holds: dict[str, tuple[int, ...]] = {}
        self._hold_leases: dict[str, bytes] = {}  # request id -> the lease id its params carry
        self._local_release_leases: dict[str, bytes] = {}
        self._rejected_since_meta = 0
        self._queued: dict[str, RemotePrefill] = {}  # valid remote prefills not yet pulled
        self._last_keep_alive = 0.0
        self._releases: list[RemotePrefill] = []
        self._refused_releases: list[KeepAlive] = []  # signed params this decode refused: free their blocks
        self._local_releases: list[str] = []  # own leases the router released (no decode will read them)
        self._release_replies: dict[str, dict[str, Any]] = {}  # release request id -> its reply params
        # The fleet key: prefill signs the params it returns, decode accepts only signed ones.
        self._ring = key_ring(cfg)
        self._verify = verifier(self._ring)
        self._verify_reuse = reuse_verifier(self._ring)
        self._drops = DropLog(10.0)
        # Issue 40: a kv_both decode's holds for conversations' next turns, oldest first: request id ->
        # (blocks, lease id); bounded to a share of its KV blocks (turn_reuse.py).
        self._reuse_holds: dict[str, tuple[int, bytes]] = {}
        # ... and until when each is held at least (monotonic; the worker's hold starts later, so its
        # lease ends no earlier), extended by the router's keep-alives.
        self._reuse_until: dict[str, float] = {}
        self._local_keep_alives: dict[str, bytes] = {}
        self.keep_alives_refused = 0  # offers a keep-alive named that this decode did not extend
        self._reuse_budget = hold_budget(num_blocks)
        self._reuse_refused: set[str] = set()  # prefill requests whose reuse offer was refused or unused

    # -- decode ---------------------------------------------------------------
    def _reject(self, request_id: str, exc: Exception, params: Any = None) -> None:
        if request_id not in self._rejected:
            self._rejected[request_id] = str(exc)
            self._rejected_since_meta += 1
            # Clients choose what they send: one line per refused field per interval, with a count.
            held = self._drops.note(getattr(exc, "field", "params"), time.monotonic())
            if held is not None:
                log.warning("request %s: KV pull refused, computing the prompt locally: %s%s", request_id, exc,
                            f" [and {held} more refused for this field in the last {self._drops.interval:g}s]"
                            if held else "")
            target = release_target(params, self._verify)
            if target is not None:  # a fleet prefill holds these blocks for us: free them now
                host, port, tp, remote_id, hosts = target
                lease_id = lease_id_of(params)  # signed: release_target verified it
                self._refused_releases.append(KeepAlive(host, port, tp, (remote_id,), hosts,
                                                        (lease_id,) if lease_id else ()))

    def _parse(self, request: Any) -> RemotePrefill | None:
        """The request's validated remote prefill, or None (not one, or rejected and recorded)."""
        rid = request.request_id
        if rid in self._rejected:
            return None
        if rid in self._queued:
            # Validated on arrival; since then decode heartbeats have extended the lease
            # beyond the one in the params.
            return self._queued[rid]
        params = request.kv_transfer_params
        if wants_release(params):
            self._release(rid, params)
            return None
        if wants_keep_alive(params):
            self._keep_held(rid, params)
            return None
        try:
            if not wants_remote_prefill(params):
                return None
            if not self.is_consumer:
                raise InvalidTransferParams(DO_REMOTE_PREFILL, "this server is a KV producer; it does not pull")
            return parse_remote_prefill(
                params,
                num_prompt_tokens=request.num_prompt_tokens,
                block_size=self.block_size,
                local_tp_size=self.tp_size,
                now=time.time(),  # read only for params <= 1.2 (a wall-clock expiry)
                verify=self._verify,
                # 1.3: the lease's upper bound on CLOCK_MONOTONIC, which this pod's workers share
                accepted_at=time.monotonic(),
            )
        except InvalidTransferParams as exc:
            self._reject(rid, exc, params)
            return None

    def _release(self, rid: str, params: Any) -> None:
        """A release request from the router: free our own lease that no decode will read. The request
        itself is computed like any other (the router sends a one-token prompt)."""
        if rid in self._release_replies:
            return
        try:
            if not self.is_producer:
                raise InvalidTransferParams(RELEASE_KEY, "this server holds no leases (it is not a KV producer)")
            own = own_lease_to_release(params, engine_id=self.engine_id, verify=self._verify)
            self._local_releases.append(own)
            lease_id = lease_id_of(params)
            if lease_id is not None:
                self._local_release_leases[own] = lease_id
            self._release_replies[rid] = release_reply()
        except InvalidTransferParams as exc:
            held = self._drops.note(RELEASE_KEY, time.monotonic())
            if held is not None:
                log.warning("request %s: lease release refused: %s", rid, exc)
            self._release_replies[rid] = error_params(str(exc))

    def _keep_held(self, rid: str, params: Any) -> None:
        """A keep-alive request from the router (issue 40): extend each named hold for a next turn that is
        this decode's own and that it still has, by the lease length from now; one verdict per offer. The
        request itself is computed like any other (a one-token prompt)."""
        if rid in self._release_replies:
            return
        now = time.monotonic()
        try:
            if not self.is_producer:
                raise InvalidTransferParams(KEEP_ALIVE_KEY, "this server holds no leases (it is not a KV producer)")
            offers = keep_alive_offers(params)
        except InvalidTransferParams as exc:
            self._refuse_keep_alive(rid, exc)
            self._release_replies[rid] = error_params(str(exc))
            return
        verdicts = []
        for i, offer in enumerate(offers):
            try:
                hold, lease_id = own_held_offer(offer, engine_id=self.engine_id, verify=self._verify, index=i)
                held = self._reuse_holds.get(hold)
                if held is None or not hmac.compare_digest(held[1], lease_id) or self._reuse_until.get(hold, 0.0) <= now:
                    raise InvalidTransferParams(f"{KEEP_ALIVE_KEY}[{i}]", "names no hold this decode still has"
                                                                          " (read, released or lapsed)")
            except InvalidTransferParams as exc:
                self._refuse_keep_alive(rid, exc)
                verdicts.append(str(exc))
                continue
            self._reuse_until[hold] = now + self.cfg.settings.lease_seconds
            self._local_keep_alives[hold] = lease_id
            verdicts.append(KEPT)
        self._release_replies[rid] = keep_alive_reply(verdicts)

    def _refuse_keep_alive(self, rid: str, exc: InvalidTransferParams) -> None:
        self.keep_alives_refused += 1
        self._rejected_since_meta += 1
        held = self._drops.note(KEEP_ALIVE_KEY, time.monotonic())
        if held is not None:
            log.warning("request %s: keep-alive refused: %s", rid, exc)

    def on_new_request(self, request: Any) -> None:
        """Track a queued remote prefill so its lease is kept alive until its pull starts."""
        remote = self._parse(request)
        if remote is not None:
            self._queued[request.request_id] = remote

    @staticmethod
    def _group(remotes: Iterable[RemotePrefill]) -> tuple[KeepAlive, ...]:
        groups: dict[tuple[tuple[str, ...], int, int], list[RemotePrefill]] = {}
        for r in remotes:
            groups.setdefault((r.hosts, r.remote_port, r.tp_size), []).append(r)
        return tuple(KeepAlive(hs[0], p, tp, tuple(r.remote_request_id for r in rs), hs if len(hs) > 1 else (),
                               tuple(r.remote_lease_id for r in rs) if any(r.remote_lease_id for r in rs) else ())
                     for (hs, p, tp), rs in groups.items())

    def _keep_alive(self) -> tuple[KeepAlive, ...]:
        now = time.monotonic()
        if not self._queued or now - self._last_keep_alive < KEEP_ALIVE_INTERVAL:
            return ()
        self._last_keep_alive = now
        return self._group(self._queued.values())

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        rid = request.request_id
        if rid in self._handled:
            return 0, False
        remote = self._parse(request)
        if remote is None:
            return self._reuse_tokens(request, num_computed_tokens)
        count = num_tokens_to_pull(request.num_prompt_tokens, self.block_size) - num_computed_tokens
        # Remember where the local prefix ends; vLLM hands us block-aligned counts.
        self._waiting[rid] = _Waiting(remote, num_computed_tokens)
        if count <= 0:
            return 0, False
        return count, True

    def _reuse_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """A prefill request carrying a decode's reuse offer (issue 40): the tokens to load from it."""
        rid = request.request_id
        params = request.kv_transfer_params
        if not self.is_consumer or rid in self._reuse_refused or not has_reuse(params):
            return 0, False
        try:
            reuse = parse_reuse(params, local_tp_size=self.tp_size, verify=self._verify,
                                verify_reuse=self._verify_reuse, accepted_at=time.monotonic())
        except InvalidTransferParams as exc:
            self._reuse_refused.add(rid)
            self._rejected_since_meta += 1
            held = self._drops.note(exc.field, time.monotonic())
            if held is not None:
                log.warning("request %s: reuse offer refused, computing the history: %s", rid, exc)
            target = reuse_release_target(params, self._verify)
            if target is not None:  # a fleet decode holds these blocks: free them now
                host, port, tp, remote_id, hosts = target
                lease_id = lease_id_of(params[REUSE_KEY])
                self._refused_releases.append(KeepAlive(host, port, tp, (remote_id,), hosts,
                                                        (lease_id,) if lease_id else ()))
            return 0, False
        matched = matched_blocks(reuse.block_hashes, list(getattr(request, "block_hashes", ()) or ()))
        count = tokens_to_pull(matched, block_size=self.block_size, num_prompt_tokens=request.num_prompt_tokens,
                               num_computed_tokens=num_computed_tokens, min_tokens=reuse.min_tokens)
        # Below the threshold too: update_state_after_alloc then releases the decode's hold at once.
        self._waiting[rid] = _Waiting(reuse.remote, num_computed_tokens)
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        if rid in self._handled:
            return
        waiting = self._waiting.pop(rid, None)
        if waiting is None:
            return
        self._handled.add(rid)
        self._queued.pop(rid, None)  # from here on the pull itself heartbeats
        if num_external_tokens <= 0:
            # Nothing to pull (short prompt, or all of it cached locally): prefill
            # may free the blocks now.
            self._releases.append(waiting.remote)
            return
        local_ids = [b.block_id for b in blocks.blocks[0]] if blocks.blocks else []
        start = waiting.local_computed_tokens // self.block_size
        n = num_external_tokens // self.block_size
        local = tuple(local_ids[start : start + n])
        remote = tuple(waiting.remote.remote_block_ids[start : start + n])
        if len(local) != n or len(remote) != n or num_external_tokens % self.block_size:
            spec = PullSpec(rid, waiting.remote, error=(
                f"cannot map {num_external_tokens} external tokens onto {len(local_ids)} local and"
                f" {len(waiting.remote.remote_block_ids)} remote blocks from block {start}"
            ))
        else:
            spec = PullSpec(rid, waiting.remote, local, remote)
        self._pulls[rid] = spec

    # -- both -----------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: Any) -> PdfleetConnectorMetadata:
        meta = PdfleetConnectorMetadata(
            pulls=self._pulls, holds=self._holds, keep_alive=self._keep_alive(),
            releases=self._group(self._releases) + tuple(self._refused_releases),
            local_releases=tuple(self._local_releases), params_rejected=self._rejected_since_meta,
            hold_leases=self._hold_leases, local_release_leases=self._local_release_leases,
            local_keep_alives=self._local_keep_alives,
        )
        self._pulls, self._holds, self._rejected_since_meta, self._releases = {}, {}, 0, []
        self._refused_releases, self._local_releases = [], []
        self._hold_leases, self._local_release_leases, self._local_keep_alives = {}, {}, {}
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        waiting = self._waiting.pop(rid, None)
        queued = self._queued.pop(rid, None)
        if rid not in self._handled and (queued or (waiting.remote if waiting else None)) is not None:
            # Finished (aborted) before its pull was decided: this decode never reads it.
            self._releases.append(queued or waiting.remote)
        self._handled.discard(rid)
        self._reuse_refused.discard(rid)
        release = self._release_replies.pop(rid, None)
        if release is not None:
            return False, release
        reason = self._rejected.pop(rid, None)
        if reason is not None:
            return False, error_params(reason)
        try:
            remote_decode = wants_remote_decode(request.kv_transfer_params)
        except InvalidTransferParams as exc:
            return False, error_params(str(exc))
        if not self.is_producer:
            return False, None
        if not remote_decode:
            if wants_hold_for_next_turn(request.kv_transfer_params):
                return self._hold_for_next_turn(request, block_ids)
            return False, None
        from vllm.v1.request import RequestStatus

        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted or failed: nothing for a decode to read
        computed_blocks = -(-request.num_computed_tokens // self.block_size)
        ids = tuple(int(b) for b in block_ids[:computed_blocks])
        if not ids:
            return False, None
        return True, self._hold(rid, ids, request.num_computed_tokens)

    def _hold_for_next_turn(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Decode (kv_both), asked by the router: hold the turn's full computed blocks, prompt and generated
        tokens, for the conversation's next prefill; the params carry each block's hash (issue 40)."""
        from vllm.v1.request import RequestStatus

        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None
        hashes = list(getattr(request, "block_hashes", ()) or ())
        n = min(request.num_computed_tokens // self.block_size, len(hashes), len(block_ids))
        if n <= 0 or n > self._reuse_budget:
            return False, None
        rid = request.request_id
        params = self._hold(rid, tuple(int(b) for b in block_ids[:n]), n * self.block_size, hashes[:n])
        self._reuse_holds[rid] = (n, self._hold_leases[rid])
        self._reuse_until[rid] = time.monotonic() + self.cfg.settings.lease_seconds
        # Over the share: the oldest holds go first (their blocks return to the cache), kept alive or not.
        for old in holds_to_release([(r, b) for r, (b, _) in self._reuse_holds.items()], self._reuse_budget):
            _, lease_id = self._reuse_holds.pop(old)
            self._reuse_until.pop(old, None)
            self._local_keep_alives.pop(old, None)
            self._local_releases.append(old)
            self._local_release_leases[old] = lease_id
        return True, params

    def sent(self, request_ids: Iterable[str]) -> None:
        """Holds that ended (read, released or expired; vLLM's finished_sending): no longer counted."""
        for rid in request_ids:
            self._reuse_holds.pop(rid, None)
            self._reuse_until.pop(rid, None)

    @property
    def reuse_holds(self) -> int:
        return len(self._reuse_holds)

    def _hold(self, rid: str, ids: tuple[int, ...], num_tokens: int,
              block_hashes: list[bytes] | None = None) -> dict[str, Any]:
        self._holds[rid] = ids
        instance = None
        if self.instance_ids and set(self.instance_ids) == set(range(self.tp_size)):
            instance = ",".join(self.instance_ids[r] for r in range(self.tp_size))
        params = produce(
            block_ids=list(ids),
            engine_id=self.engine_id,
            request_id=rid,
            host=self.cfg.side_channel_host,
            port=self.cfg.side_channel_port,
            tp_size=self.tp_size,
            instance_id=instance,
            lease_seconds=self.cfg.settings.lease_seconds,
            num_tokens=num_tokens,
            hosts=self.node_hosts,
        )
        if block_hashes is not None:
            params = with_block_hashes(params, block_hashes)
        # A fresh random lease id (params 1.4): the same goes to every worker's hold.
        lease_id = lease_id_of(params)
        assert lease_id is not None
        self._hold_leases[rid] = lease_id
        if self._ring is not None:
            params[SIG_KEY] = sign_params(params, self._ring.current)
            if block_hashes is not None:
                params[REUSE_SIG_KEY] = sign_reuse(params, self._ring.current)
        return params
