"""Paired rollouts (pure): which revision the router serves, which revisions stay.

Prefill and decode of one revision agree on everything the KV exchange needs (the
plan's revision hash), so the router must never pair a prefill of one revision with a
decode of another. When the spec's revision changes:

1. the new prefill and decode StatefulSets (revision-suffixed names) come up beside
   the old pair; the router keeps serving the old pair;
2. once the new revision has at least one ready prefill pod and one ready decode pod,
   the router is switched to the new pair (status.revision changes);
3. the old pair is kept for `drain_seconds` after the switch so in-flight requests
   finish, then deleted.

A revision that was never served (the spec changed again mid-rollout) is dropped at
once. If the serving revision has no pods at all, there is nothing to protect: switch.

A canary (spec.rollout.strategy Canary) holds step 2: with ``hold`` the ready new pair does
not take over (phase ``Canary``); the canary core (operator/rollout/canary.py) decides the
weight each reconcile, and only its promotion lets the switch happen. ``CanaryRecord`` is the
canary's state as status.rollout keeps it, so an operator restart continues the step it was in.

The operator alone says which revision serves: the plan labels the serving revision's
engine Services ``pdfleet.io/serving=true`` and the router reads the label from their
EndpointSlices (connector/serving/endpoints.py has its rule for a serving revision without
ready endpoints). After a switch the old revision's Services, which the plan no longer
renders, lose the label through ``unmark_serving`` (a merge patch).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from pdfleet.contract.labels import FRONT_END_ROLES
from pdfleet.operator.kube.observed import HASH_ANNOTATION, SERVING_LABEL, ObservedChild, ObservedPod
from pdfleet.operator.plan.kinds import DEPLOYMENT
from pdfleet.operator.rollout import canary

PAIRED_ROLES = ("prefill", "decode")
# A paired rollout's phases (Decision.phase; status.rollout and the Progressing condition show them)
STABLE, ROLLING_OUT, CANARY, DRAINING = "Stable", "RollingOut", "Canary", "Draining"


@dataclass(frozen=True)
class RolloutState:
    """What the CR status remembers between reconciles (status.rollout + status.revision)."""

    serving: Optional[str] = None          # revision the router points at
    previous: Optional[str] = None         # revision being drained after a switch
    switched_at: Optional[str] = None      # RFC 3339 time of the switch


@dataclass(frozen=True)
class Decision:
    serving: str                  # render the router for this revision
    target: str                   # the spec's revision
    keep: frozenset[str]          # revisions whose objects must not be pruned
    state: RolloutState           # to persist
    phase: str                    # STABLE | ROLLING_OUT | CANARY | DRAINING
    requeue_after: Optional[float] = None   # wake up when the drain period ends

    @property
    def in_progress(self) -> bool:
        return self.phase != STABLE


def parse_time(value: Optional[str]) -> Optional[datetime.datetime]:
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def format_time(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_pairs(pods: Iterable[ObservedPod]) -> dict[str, set[str]]:
    """revision -> roles with at least one ready, not terminating pod."""
    out: dict[str, set[str]] = {}
    for pod in pods:
        if pod.revision and pod.role in PAIRED_ROLES and pod.ready and not pod.deleting and pod.ip:
            out.setdefault(pod.revision, set()).add(pod.role)
    return out


def decide(
    target: str,
    state: RolloutState,
    pods: Iterable[ObservedPod],
    present_revisions: Iterable[str],
    *,
    now: datetime.datetime,
    drain_seconds: float,
    hold: bool = False,
    front_ends_rolled: bool = True,
) -> Decision:
    """The rollout step for this reconcile; ``hold``: a canary runs, the ready new pair does not
    take over (phase Canary) unless the serving revision has no pods left; ``front_ends_rolled``
    False: a router or Endpoint Picker pod still runs an older template (``front_ends_rolled``),
    and the switch waits in RollingOut (same exception)."""
    pods = list(pods)
    ready = ready_pairs(pods)
    present = set(present_revisions)
    serving = state.serving

    # Draining after an earlier switch: keep the previous pair until the deadline.
    def draining(new_state: RolloutState) -> Decision:
        switched = parse_time(new_state.switched_at) or now
        left = drain_seconds - (now - switched).total_seconds()
        if new_state.previous and new_state.previous != target and left > 0 and new_state.previous in present:
            return Decision(target, target, frozenset({target, new_state.previous}), new_state, DRAINING, left)
        return Decision(target, target, frozenset({target}), RolloutState(serving=target), STABLE)

    if serving is None or serving == target:
        return draining(RolloutState(serving=target, previous=state.previous, switched_at=state.switched_at))

    new_pair_ready = set(PAIRED_ROLES) <= ready.get(target, set())
    old_has_pods = serving in present or any(p.revision == serving and not p.deleting for p in pods)
    if (new_pair_ready and not hold and front_ends_rolled) or not old_has_pods:
        switched = RolloutState(serving=target, previous=serving, switched_at=format_time(now))
        return draining(switched)
    return Decision(serving, target, frozenset({serving, target}),
                    RolloutState(serving=serving, previous=state.previous, switched_at=state.switched_at),
                    CANARY if new_pair_ready and hold else ROLLING_OUT)


def front_ends_rolled(children: Iterable[ObservedChild]) -> bool:
    """Every router and Endpoint Picker pod runs its Deployment's current template: what the new
    pair's engines ask of their callers (the engine API token, since issue 30) every caller has,
    so an upgrade never switches to engines that an older router pod cannot call (401)."""
    for c in children:
        if c.ref.kind != DEPLOYMENT.kind or c.role not in FRONT_END_ROLES or c.deleting:
            continue
        if c.observed_generation < c.generation or c.updated_replicas < c.status_replicas:
            return False
    return True


@dataclass(frozen=True)
class CanaryRecord:
    """A canary's state between reconciles (status.rollout's canary fields); times are unix seconds
    (wall clock: a pause must survive an operator restart)."""

    revision: str
    state: canary.State
    weight: int
    last_analysis: str = ""
    stale_override: Optional[str] = None  # the annotation's value when the canary started (ignored)

    @classmethod
    def from_status(cls, roll: Mapping[str, Any]) -> Optional["CanaryRecord"]:
        revision, phase = roll.get("canaryRevision"), roll.get("phase")
        if not isinstance(revision, str) or phase not in (canary.PROGRESSING, canary.PROMOTED, canary.ABORTED):
            return None
        started = parse_time(roll.get("stepStartedAt"))
        step = roll.get("step")
        weight = roll.get("weight")
        return cls(revision, canary.State(phase, max(0, step - 1) if isinstance(step, int) else 0,
                                          started.timestamp() if started else 0.0),
                   weight if isinstance(weight, int) else 0, str(roll.get("lastAnalysis") or ""),
                   roll.get("staleOverride") if isinstance(roll.get("staleOverride"), str) else None)

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": "Canary", "canaryRevision": self.revision, "phase": self.state.phase,
            "step": self.state.step + 1, "weight": self.weight, "lastAnalysis": self.last_analysis,
            "stepStartedAt": format_time(datetime.datetime.fromtimestamp(self.state.step_started,
                                                                         tz=datetime.timezone.utc)),
        }
        if self.stale_override:
            out["staleOverride"] = self.stale_override
        return out


@dataclass(frozen=True)
class CanaryOutcome:
    """What the canary edge (reconcile/canary.py) answered this reconcile."""

    record: Optional[CanaryRecord] = None  # None: no canary to report
    weight: Optional[int] = None           # the canary-weight label on the target's Services (None: none)
    requeue_after: Optional[float] = None


def after_canary(decision: Decision, record: Optional[CanaryRecord], *, delete_on_abort: bool) -> Decision:
    """The rollout decision once the canary core spoke. Aborted: the serving pair is the fleet (the new
    pair kept for inspection, or not kept so that it is deleted); anything else: as decided."""
    if (decision.phase not in (CANARY, ROLLING_OUT) or record is None or record.revision != decision.target
            or record.state.phase != canary.ABORTED):
        return decision
    keep = {decision.serving} if delete_on_abort else {decision.serving, decision.target}
    return Decision(decision.serving, decision.serving, frozenset(keep), decision.state, STABLE)


def stale_serving_marks(children: Iterable[ObservedChild], serving: str) -> list[ObservedChild]:
    """Services still labelled serving that belong to another revision than ``serving``."""
    return [c for c in children
            if c.ref.kind == "Service" and c.serving and c.revision != serving and not c.deleting]


def unmark_serving() -> dict[str, object]:
    """Merge patch that takes the serving label off a Service. The applied hash goes too, so
    that the plan applies the Service again (label included) if its revision serves again."""
    return {"metadata": {"labels": {SERVING_LABEL: None}, "annotations": {HASH_ANNOTATION: None}}}


@dataclass(frozen=True)
class Endpoint:
    pod: str
    ip: str
    side_channel_port: int
    http_port: int
    revision: str
    kv_events_port: int | None = None

    def as_status(self) -> dict[str, object]:
        out: dict[str, object] = {"pod": self.pod, "ip": self.ip, "sideChannelPort": self.side_channel_port,
                                  "httpPort": self.http_port, "revision": self.revision}
        if self.kv_events_port is not None:
            out["kvEventsPort"] = self.kv_events_port
        return out


def router_endpoints(
    pods: Iterable[ObservedPod],
    serving: str,
    ports: Mapping[str, tuple[int, int]],
    role: str = "prefill",
    kv_events_ports: Mapping[str, int] | None = None,
) -> list[Endpoint]:
    """Ready pods of one role at the serving revision only: the set handed to the router.

    `ports` maps revision -> (sideChannelPort, httpPort). The result never mixes revisions,
    whatever the input holds (pods of other revisions, not ready, terminating, no IP).
    """
    if serving not in ports:
        return []
    side, http = ports[serving]
    events = (kv_events_ports or {}).get(serving)
    chosen = [
        Endpoint(p.name, p.ip, side, http, serving, events)
        for p in pods
        if p.role == role and p.revision == serving and p.ready and not p.deleting and p.ip
        and not getattr(p, "worker", False)  # a multi-node replica is reached through its leader
    ]
    return sorted(chosen, key=lambda e: _ordinal_key(e.pod))


def _ordinal_key(name: str) -> tuple[str, int]:
    base, _, ordinal = name.rpartition("-")
    return (base, int(ordinal)) if ordinal.isdigit() else (name, -1)
