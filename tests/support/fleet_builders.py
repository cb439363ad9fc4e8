"""Builders of a fleet and of what the operator observes of it (jobset-style test builders).

``Fleet`` builds the DisaggregatedInference body a watch delivers; ``applied`` renders its children as
the operator would and observes them as a cluster would report them once applied (hash, uid, the
fleet as controller, ready replicas) with one ready pod per engine replica, run by its StatefulSet;
``observed`` puts it together for the pure reconcile plan (operator/reconcile_plan/plan.py).
"""

from __future__ import annotations

import copy
import datetime
from typing import Any, Optional, Sequence

from pdfleet.contract import labels
from pdfleet.operator import api
from pdfleet.operator.kube.observed import ObservedChild, ObservedPod, observe_child
from pdfleet.operator.plan import kinds
from pdfleet.operator.reconcile_plan import children as ch
from pdfleet.operator.reconcile_plan.planning import desired_children, target_revision
from pdfleet.operator.reconcile_plan.plan import Observed, Settings

NAMESPACE, NAME, UID = "ns", "llama", "uid-llama"
IMAGE = "registry.example/pdfleet-runtime:test"
NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
SETTINGS = Settings(default_image=IMAGE, drain_seconds=30.0)


class Fleet:
    """``Fleet().replicas(prefill=2).canary(20, 50).serving("r0").body()``; each step returns a new builder,
    so that one fleet can be the start of several."""

    def __init__(self, name: str = NAME, namespace: str = NAMESPACE, uid: str = UID) -> None:
        self._body: dict[str, Any] = {
            "apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}},
        }

    def _copy(self) -> "Fleet":
        out = Fleet.__new__(Fleet)
        out._body = copy.deepcopy(self._body)
        return out

    def spec(self, **fields: Any) -> "Fleet":
        out = self._copy()
        out._body["spec"].update(copy.deepcopy(fields))
        return out

    def replicas(self, **roles: int) -> "Fleet":
        out = self._copy()
        for role, n in roles.items():
            out._body["spec"].setdefault(role, {})["replicas"] = n
        return out

    def engine_arg(self, block_size: int) -> "Fleet":
        """A spec change that makes a new revision."""
        return self.spec(engine={"blockSize": block_size})

    def canary(self, *weights: int, pause_seconds: int = 60, on_abort: str = "Keep") -> "Fleet":
        steps = [{"weight": w, "pauseSeconds": pause_seconds} for w in weights]
        return self.spec(rollout={"strategy": "Canary", "canary": {"steps": steps, "onAbort": on_abort}})

    def status(self, **fields: Any) -> "Fleet":
        out = self._copy()
        out._body.setdefault("status", {}).update(copy.deepcopy(fields))
        return out

    def serving(self, revision: str, **rollout: Any) -> "Fleet":
        """The status a previous reconcile left: this revision serves."""
        return self.status(revision=revision, rollout={"targetRevision": revision, **rollout})

    def generation(self, n: int) -> "Fleet":
        out = self._copy()
        out._body["metadata"]["generation"] = n
        return out

    def body(self) -> dict[str, Any]:
        return copy.deepcopy(self._body)


def revision(body: dict[str, Any]) -> str:
    return target_revision(api.parse({k: v for k, v in body.items() if k != "status"}), IMAGE)


def applied(body: dict[str, Any], *, serving: Optional[str] = None, ready: bool = True,
            canary_weight: Optional[int] = None) -> tuple[list[ObservedChild], list[ObservedPod]]:
    """The children ``body``'s plan renders (router on ``serving``, default: its own revision), observed
    as applied and, with ``ready``, every replica ready; and the engines' pods."""
    cr = api.parse({k: v for k, v in body.items() if k != "status"})
    owner = ch.owner_reference(body)
    namespace = body["metadata"]["namespace"]
    objs = [ch.stamp(o, owner, namespace) for o in desired_children(
        cr, owner=owner, image=IMAGE, router_revision=serving or revision(body), canary_weight=canary_weight)]
    children, pods = [], []
    for obj in objs:
        live = copy.deepcopy(obj)
        meta = live["metadata"]
        meta["uid"] = f"uid-{obj['kind']}-{meta['name']}"
        meta["generation"] = 1
        if obj["kind"] in kinds.WORKLOAD_KINDS:
            n = int((obj.get("spec") or {}).get("replicas", 1))
            live["status"] = {"observedGeneration": 1, "replicas": n, "updatedReplicas": n,
                              "readyReplicas": n if ready else 0}
        child = observe_child(live)
        children.append(child)
        if obj["kind"] == kinds.STATEFULSET.kind and child.role in (labels.ROLE_PREFILL, labels.ROLE_DECODE):
            pods += [ObservedPod(namespace, f"{meta['name']}-{i}", child.role, child.revision,
                                 f"10.0.{i}.{len(pods) + 2}", ready, False, child.ports,
                                 controller=("StatefulSet", meta["name"], meta["uid"]), uid=f"pod-{meta['name']}-{i}")
                     for i in range(child.replicas)]
    return children, pods


def observed(body: dict[str, Any], children: Sequence[ObservedChild] = (), pods: Sequence[ObservedPod] = (),
             **fields: Any) -> Observed:
    return Observed(body=body, now=fields.pop("now", NOW), settings=fields.pop("settings", SETTINGS),
                    children=tuple(children), pods=tuple(pods), **fields)
