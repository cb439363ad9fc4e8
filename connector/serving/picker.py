"""The router's decision core: which pair serves a request and which endpoint takes each leg.

One object, so that every front end asks the same questions of the same state: the router's
HTTP handlers (handlers.py) and the gateway's Endpoint Picker (connector/epp/). It holds

- the fleet's revisions and the one that serves, with its canary beside it (endpoints.py:
  ``select_revision``), and the per-request pairing (canary.py: ``choose``);
- the endpoints' load (requests in flight) and the ones ejected after a failure;
- each role's picking chain (picking/: filters -> scorers -> picker), whose prefix scorer reads
  KV-cache-aware state (kvaware/prefix_routing.py) and its index of the engines' KV events;
- flow control (flow/gate.py), the gate a request passes before either leg.

It does no HTTP of its own. The rules live in the pure modules it calls; this object keeps their
state and the metrics that describe it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pdfleet.connector.serving import canary, disaggregation, timing
from pdfleet.connector.serving.endpoint_labels import EndpointLabels
from pdfleet.connector.serving.endpoints import (
    DECODE,
    PREFILL,
    Outstanding,
    RevisionEndpoints,
    Selection,
    select_revision,
)
from pdfleet.connector.serving.fanout import fan_out_reason
from pdfleet.connector.serving.flow.gate import FlowGate, decode_started
from pdfleet.connector.serving.flow.room import decode_filters
from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.picking import chain, profiles
from pdfleet.connector.serving.picking.chain import PickRequest, PickState
from pdfleet.connector.serving.waiting import WaitingRoom
from pdfleet.connector.serving.waiting_room import endpoints_up
from pdfleet.contract.router_config import RouterConfig

log = logging.getLogger("pdfleet.router")


class Picker:
    """The state and the decisions every front end shares (see the module docstring)."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.outstanding = Outstanding()
        self.labels = EndpointLabels()  # what endpoints are called in metrics (never their URL: a pod IP)
        self._prefix = PrefixRouting(config, metrics, labels=self.labels)
        self.flow = FlowGate(config.flow_control, metrics.registry)  # open when disabled
        self.waiting = WaitingRoom(config, metrics.registry, self.flow)  # holds requests while no pair is ready
        self.selection = Selection(None, "no endpoints known yet")
        self.disaggregation = disaggregation.Policy(
            config.disaggregation_policy, config.min_remote_prefill_tokens, config.prefill_busy_in_flight,
            config.block_size)
        self.profiles = self._profiles()
        self._decisions: dict[tuple[str, str], Any] = {}
        self._groups: dict[str, RevisionEndpoints] = {}
        self._ejected: dict[str, float] = {}
        self._tiebreak = {PREFILL: itertools.count(), DECODE: itertools.count()}
        # prometheus children resolved once: labels() costs more than the update itself
        self._in_flight: dict[tuple[str, str], Any] = {}
        self._legs_started: dict[tuple[str, str], Any] = {}

    @property
    def prefix(self) -> PrefixRouting:
        """KV-cache-aware state: what the prefix scorer reads."""
        return self._prefix

    @prefix.setter
    def prefix(self, routing: PrefixRouting) -> None:  # benchmarks and replays bring their own
        self._prefix = routing
        self.profiles = self._profiles()

    def _profiles(self) -> dict[str, profiles.Profile]:
        c = self.config
        room = decode_filters(c.flow_control)  # flow control's per-decode bound (flow/room.py)
        return {role: profiles.profile(policy, self._prefix, c.prefix_max_imbalance, room if role == DECODE else ())
                for role, policy in ((PREFILL, c.prefill_policy), (DECODE, c.decode_policy))}

    # ---- endpoints -------------------------------------------------------

    def set_endpoints(self, groups: Iterable[RevisionEndpoints]) -> None:
        """Replace every known revision; called by discovery on each change."""
        self._groups = {g.revision: g for g in groups}
        old = self.selection.revision.revision if self.selection.revision else None
        self.selection = select_revision(self._groups.values())
        new = self.selection.revision
        if (new.revision if new else None) != old:
            log.info("serving revision %s (%s)", new.revision if new else None, self.selection.reason)
        known: dict[str, str] = {}
        for g in self._groups.values():
            for role, eps in ((PREFILL, g.prefill), (DECODE, g.decode)):
                for e in eps:
                    known.setdefault(e.url, role)
        # Series of endpoints that left go first, under their old names (which may then be reused).
        self._forget_gone_endpoints(known)
        self.prefix.set_endpoints(self._groups.values())
        self.labels.update(known, keep=self.outstanding.counts.keys())
        self.flow.set_ready_decodes(len(new.ready(DECODE)) if new is not None else 0)
        self.metrics.revision.clear()
        self.metrics.endpoints.clear()
        if new is not None:
            self.metrics.revision.labels(new.revision).set(1)
            for role, eps in ((PREFILL, new.prefill), (DECODE, new.decode)):
                ready = sum(e.ready for e in eps)
                self.metrics.endpoints.labels(role, "true").set(ready)
                self.metrics.endpoints.labels(role, "false").set(len(eps) - ready)
        self.waiting.set_endpoints(pair_ready=new is not None, endpoints_up=endpoints_up(self._groups.values()))

    def _forget_gone_endpoints(self, known: dict[str, str]) -> None:
        """Drop the in-flight series of endpoints that left every revision (pods churn)."""
        for role, url in list(self._in_flight):
            if url not in known and not self.outstanding.counts.get(url):
                del self._in_flight[(role, url)]
                self.metrics.in_flight.remove(role, self.labels(url))
                if self._legs_started.pop((role, url), None) is not None:
                    self.metrics.legs_started.remove(role, self.labels(url))

    @property
    def groups(self) -> dict[str, RevisionEndpoints]:
        return dict(self._groups)

    # ---- decisions -------------------------------------------------------

    def choose_pair(self, body: Mapping[str, Any], *, chat: bool, request_id: str,
                    headers: Mapping[str, str] | None = None) -> RevisionEndpoints | None:
        """The revision pair that serves this request (both legs); None when no pair can. ``headers``
        may name the conversation (canary.py: the session header)."""
        return canary.choose(self.selection, body, chat=chat, request_id=request_id, headers=headers)

    def pick(self, role: str, candidates: Collection[str], tried: Collection[str] = (),
             body: Mapping[str, Any] | None = None, chat: bool = False) -> str | None:
        """The endpoint of ``role`` among ``candidates`` that takes a leg, never one in ``tried``: the
        role's picking chain (picking/: filters, scorers such as the cached prefix when a body is
        given and the role's policy asks for it, the load-bounded picker). Recently failed endpoints
        are taken only when nothing else is left."""
        timed = timing.current()  # a request being served: its decision time (the EPP's histogram)
        started = time.perf_counter() if timed is not None else 0.0
        state = PickState(self.outstanding.counts, tried, self._ejected_now(), next(self._tiebreak[role]))
        request = PickRequest(role, body, chat) if body is not None else None
        p = self.profiles[role]
        url = chain.run(tuple(candidates), state, p.filters, p.scorers, request, max_imbalance=p.max_imbalance).url
        if timed is not None:
            timed.decision_s += time.perf_counter() - started
        return url

    def _ejected_now(self) -> list[str]:
        if not self._ejected:
            return []
        now = time.monotonic()
        ejected = [u for u, until in self._ejected.items() if until > now]
        if len(ejected) != len(self._ejected):
            self._ejected = {u: self._ejected[u] for u in ejected}
        return ejected

    def decide(self, group: RevisionEndpoints, body: Mapping[str, Any], *, chat: bool,
               decodes: Collection[str] | None = None) -> disaggregation.Decision:
        """Remote prefill or decode alone for a request that ``group`` serves (the pair is chosen first, so
        both paths stay inside it); counted. The decode it weighs is the one ``pick`` would choose now among
        ``decodes`` (default: the pair's ready decodes; the gateway's subset for the Endpoint Picker)."""
        policy = self.disaggregation
        counts = self.outstanding.counts
        prefills = tuple(counts.get(u, 0) for u in group.ready(PREFILL))
        fan_out = fan_out_reason(body, chat=chat) is not None  # type: ignore[arg-type]
        tokens = cached = decode_load = 0
        if policy.policy == disaggregation.DISAGGREGATION_CONDITIONAL and not fan_out:
            candidates = tuple(group.ready(DECODE) if decodes is None else decodes)
            # What the decode pick would choose now, without counting or remembering it.
            p = self.profiles[DECODE]
            picked = chain.run(candidates, PickState(counts, (), self._ejected_now(), 0), p.filters, p.scorers,
                               PickRequest(DECODE, body, chat), max_imbalance=p.max_imbalance, notify=False)
            # tokens decode would not compute (a CPU-tier block is loaded, not computed): unweighted
            cached = self.prefix.cached_tokens(DECODE, picked.url, body, chat=chat) if picked.url else 0
            tokens = self.prefix.prompt_tokens(body, chat=chat, want=policy.tokens_wanted(cached))
            decode_load = counts.get(picked.url, 0) if picked.url is not None else 0
        decision = disaggregation.decide(policy, disaggregation.Request(tokens, cached, prefills, decode_load, fan_out))
        key = (decision.decision, decision.reason)
        counter = self._decisions.get(key)
        if counter is None:
            counter = self._decisions[key] = self.metrics.disaggregation_decisions.labels(*key)
        counter.inc()
        return decision

    def eject(self, url: str) -> None:
        """``url`` failed a leg: avoid it for ``eject_s``."""
        if self.config.eject_s > 0:
            self._ejected[url] = time.monotonic() + self.config.eject_s

    # ---- load ------------------------------------------------------------

    def acquire(self, role: str, url: str) -> None:
        """A leg of ``role`` started on ``url`` (release it exactly once). A decode leg moves the
        request's flow-control slot from the pipeline ahead of decode to decode (flow/gate.py)."""
        if role == DECODE:
            decode_started()
        self.outstanding.acquire(url)
        timing.leg_started(role)
        gauge = self._in_flight.get((role, url))
        if gauge is None:
            gauge = self._in_flight[(role, url)] = self.metrics.in_flight.labels(role, self.labels(url))
        gauge.inc()
        started = self._legs_started.get((role, url))
        if started is None:
            started = self._legs_started[(role, url)] = self.metrics.legs_started.labels(role, self.labels(url))
        started.inc()

    def release(self, role: str, url: str) -> None:
        self.outstanding.release(url)
        timing.leg_ended(role)
        self._in_flight[(role, url)].dec()

    # ---- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        await self.prefix.start()

    async def stop(self) -> None:
        await self.prefix.stop()
