"""The kopf entry: registers thin handlers that feed the reconciler (crate-operator style).

- the CR: `on.event` keeps the latest body and queues the fleet (create, update and
  resume are the same level-based reconcile: kopf's listing at start-up is the resume);
- every owned kind, pods and the router's ReplicaSets: a label-selected watch (`pdfleet.io/fleet`) feeds a kopf
  index (what the reconciler diffs and reports status from) and queues the owning fleet.
  kopf starts event handlers only after every index is filled once, so after a restart
  the reconciler sees all existing children before its first run and writes nothing;
- login: KUBECONFIG (read at login time) or the in-cluster service account;
- start-up/clean-up: the work queue and the metrics server.

No kopf change handlers are used, so kopf writes nothing to the CR (no progress
annotations, no finalizer): children are removed by the garbage collector through
their ownerReferences.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Optional

import kopf

from pdfleet.operator import api
from pdfleet.operator.autoscale.scalers import SCALER_KIND, observe_scaler
from pdfleet.operator.reconcile_plan import children as ch
from pdfleet.operator.kube.client import KubeClient, RetryPolicy
from pdfleet.operator.kube.observed import observe_replicaset
from pdfleet.operator.plan.kinds import REPLICASET
from pdfleet.operator.reconcile.metrics import OperatorMetrics
from pdfleet.operator.reconcile.reconciler import Reconciler, ReconcileOptions

logger = logging.getLogger("pdfleet.operator")


@dataclasses.dataclass
class OperatorOptions:
    reconcile: ReconcileOptions = dataclasses.field(default_factory=ReconcileOptions)
    metrics_port: Optional[int] = None          # None: no metrics server; 0: any free port
    metrics_host: str = "0.0.0.0"
    connection: Optional[kopf.ConnectionInfo] = None   # tests: talk to this server, skip login
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    watch_server_timeout: Optional[float] = 300.0
    watch_client_timeout: Optional[float] = 330.0
    watch_reconnect_backoff: float = 0.5
    request_timeout: float = 30.0
    # Filled in when the operator runs (tests and the bench read them).
    runtime: dict[str, Any] = dataclasses.field(default_factory=dict)


def login(**kwargs: Any) -> Optional[kopf.ConnectionInfo]:
    """KUBECONFIG when set (read now, not at import time), else the in-cluster service account."""
    if os.environ.get("KUBECONFIG"):
        info = kopf.login_with_kubeconfig(**kwargs)
        if info is not None:
            return info
    return kopf.login_via_client(**kwargs)


def _child_key(body: Any) -> Optional[tuple[str, str]]:
    meta = body.get("metadata") or {}
    fleet = (meta.get("labels") or {}).get(ch.FLEET_LABEL)
    return (meta.get("namespace") or "", fleet) if fleet else None


def _scaler_target(body: Any) -> Optional[tuple[str, str]]:
    """(namespace, scaler name) an HPA scales, when it is a DisaggregatedInferenceScaler."""
    ref = (body.get("spec") or {}).get("scaleTargetRef") or {}
    if ref.get("kind") == SCALER_KIND.kind and str(ref.get("apiVersion", "")).startswith(f"{api.GROUP}/"):
        return ((body.get("metadata") or {}).get("namespace") or "", ref.get("name") or "")
    return None
def _index_id(kind: ch.Kind) -> str:
    # kind.plural alone is ambiguous (two podgroups kinds); the first one keeps its old id.
    if kind in ch.GANG_KINDS.values():
        return f"pdfleet_children_{kind.plural}_{kind.group.split('.')[-2]}"
    return f"pdfleet_children_{kind.plural}"


def build_registry(options: OperatorOptions) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    runtime = options.runtime
    # LeaderWorkerSets always (kopf skips a kind whose CRD is not installed); PodGroups of
    # the gang providers the operator was told about only (their RBAC comes with them).
    watched = (*ch.OWNED_KINDS, *(ch.GANG_KINDS[p] for p in options.reconcile.gang_providers))
    fleet_selector = {ch.FLEET_LABEL: kopf.PRESENT}

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> Optional[kopf.ConnectionInfo]:
        if options.connection is not None:
            return options.connection
        return login(**kwargs)

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        settings.posting.enabled = False  # the reconciler posts its own events, nothing from kopf
        settings.watching.server_timeout = options.watch_server_timeout
        settings.watching.client_timeout = options.watch_client_timeout
        settings.watching.reconnect_backoff = options.watch_reconnect_backoff
        settings.networking.request_timeout = options.request_timeout
        for kind in (*watched, ch.POD, REPLICASET, SCALER_KIND):
            settings.watching.label_selectors[kind.group, kind.plural] = ch.FLEET_LABEL
        indices = {name: idx for name, idx in kwargs.items() if isinstance(idx, kopf.Index)}
        child_indices = [indices[_index_id(k)] for k in watched]
        pod_index = indices["pdfleet_pods"]
        scaler_index = indices["pdfleet_scalers"]
        replicaset_index = indices["pdfleet_replicasets"]
        hpa_index = indices["pdfleet_hpas"]

        def snapshot(key: tuple[str, str]) -> tuple[list[ch.ObservedChild], list[ch.ObservedPod]]:
            children = [v for idx in child_indices for v in idx.get(key, ())]
            return children, list(pod_index.get(key, ()))

        metrics = OperatorMetrics()
        client = KubeClient(lambda: options.connection or login(settings=settings, logger=logger),
                            timeout=options.request_timeout, policy=options.retry,
                            on_request=metrics.record_request)
        reconciler = Reconciler(client, metrics, options.reconcile, snapshot,
                                scalers=lambda key: list(scaler_index.get(key, ())),
                                autoscalers=lambda key: list(hpa_index.get(key, ())),
                                replicasets=lambda key: list(replicaset_index.get(key, ())))
        reconciler.queue.start()
        runtime.update(reconciler=reconciler, metrics=metrics, settings=settings, client=client)
        if options.metrics_port is not None:
            runtime["metrics_port"] = await metrics.serve(options.metrics_port, options.metrics_host)

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        reconciler: Optional[Reconciler] = runtime.get("reconciler")
        if reconciler is not None:
            await reconciler.queue.stop()
        metrics: Optional[OperatorMetrics] = runtime.get("metrics")
        if metrics is not None:
            await metrics.close()
        client: Optional[KubeClient] = runtime.get("client")
        if client is not None:
            await client.close()

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
    async def _fleet_event(event: dict[str, Any], **_: Any) -> None:
        runtime["reconciler"].on_cr_event(event.get("type"), event["object"])

    def _register_child(kind: ch.Kind, index_id: str, observe: Callable[[Any], Any]) -> None:
        @kopf.index(kind.group, kind.version, kind.plural, id=index_id, labels=fleet_selector, registry=registry)
        def _index(body: Any, **_: Any) -> Optional[dict[tuple[str, str], Any]]:
            key = _child_key(body)
            return {key: observe(body)} if key else None

        @kopf.on.event(kind.group, kind.version, kind.plural, id=f"{index_id}_event", labels=fleet_selector,
                       registry=registry)
        async def _event(event: dict[str, Any], **_: Any) -> None:
            reconciler: Optional[Reconciler] = runtime.get("reconciler")
            if reconciler is not None:
                reconciler.on_child_event(event.get("type"), event["object"])

    for kind in watched:
        _register_child(kind, _index_id(kind), ch.observe_child)
    _register_child(ch.POD, "pdfleet_pods", ch.observe_pod)
    # The router Deployment's ReplicaSets: the link from a router pod to the fleet (kube/owned.py).
    _register_child(REPLICASET, "pdfleet_replicasets", observe_replicaset)
    _register_child(SCALER_KIND, "pdfleet_scalers", observe_scaler)

    # HPAs (KEDA's included) that target a scaler: the planner must not drive those fleets.
    @kopf.index("autoscaling", "v2", "horizontalpodautoscalers", id="pdfleet_hpas", registry=registry)
    def _hpa_index(body: Any, **_: Any) -> Optional[dict[tuple[str, str], str]]:
        target = _scaler_target(body)
        return {target: body["metadata"]["name"]} if target else None

    @kopf.on.event("autoscaling", "v2", "horizontalpodautoscalers", id="pdfleet_hpas_event", registry=registry)
    async def _hpa_event(event: dict[str, Any], **_: Any) -> None:
        reconciler: Optional[Reconciler] = runtime.get("reconciler")
        target = _scaler_target(event["object"])
        if reconciler is not None and target:
            fleet = (target[0], target[1].rpartition("-")[0])
            if fleet in reconciler.crs:
                reconciler.queue.add(fleet)
    return registry
