"""Endpoints from the fleet's EndpointSlices, watched through the Kubernetes API server.

The operator labels each role's headless Service with ``pdfleet.io/fleet``,
``pdfleet.io/role`` (prefill|decode) and ``pdfleet.io/revision``, and those of the
serving revision with ``pdfleet.io/serving=true`` (keys in pdfleet.contract.labels); Kubernetes
copies a Service's labels onto its EndpointSlices (plus
``kubernetes.io/service-name``). The router lists and watches the slices of
its fleet, turns them into one RevisionEndpoints per revision (pure:
``groups_from_slices``) and hands them to the router, which picks the revision
that serves (endpoints.py: ``select_revision``).

Only slices the fleet owns are used (ownership.py: the EndpointSlice
controller's slices of Services the fleet's resource controls); the others are
counted and logged once each.

Readiness is ``conditions.serving`` (the pod's Ready condition, true to it even
under ``publishNotReadyAddresses``), else ``conditions.ready``; terminating
endpoints take no new requests (see ``endpoint_usable``).

API access: the in-cluster service account (token re-read on every list, so
rotated tokens work) or a kubeconfig file (KUBECONFIG), both through the
``kubernetes`` package's loaders; ``api_server`` overrides the URL (tests).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from pdfleet.contract import labels as label_keys
from pdfleet.contract import ports as ports_contract
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.canary import parse_weight
from pdfleet.connector.serving.endpoints import DECODE, PREFILL, Endpoint, RevisionEndpoints
from pdfleet.connector.serving.ownership import needs_service_refresh, owned_services, owned_slices

log = logging.getLogger("pdfleet.router.discovery")

FLEET_LABEL = label_keys.FLEET
ROLE_LABEL = label_keys.ROLE
REVISION_LABEL = label_keys.REVISION
SERVING_LABEL, SERVING_TRUE = label_keys.SERVING, label_keys.SERVING_TRUE
CANARY_WEIGHT_LABEL = label_keys.CANARY_WEIGHT
SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
SERVICES_PATH = "/api/v1/namespaces/{namespace}/services"
SERVICE_REFRESH_S = 1.0  # Services are listed again at most this often (a new revision's, or one made again)
MAX_EVENT_BYTES = 8 * 1024 * 1024  # one watch event (a slice holds at most 1000 endpoints)
WATCH_TIMEOUT_S = 300  # the server ends each watch after this; the router then lists again

_decode_json = msgspec.json.Decoder().decode


# ---- pure: slices -> revisions ---------------------------------------------------


@dataclass(frozen=True)
class SliceView:
    """What the router needs from one EndpointSlice."""

    role: str
    revision: str
    endpoints: tuple[Endpoint, ...]
    created: float
    serving: bool = False
    canary_weight: int | None = None


def _timestamp(value: Any) -> float:
    if not isinstance(value, str):
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def endpoint_usable(conditions: Mapping[str, Any]) -> bool:
    """Whether new requests may go to this endpoint.

    ``serving`` is the pod's own readiness even when the Service sets
    ``publishNotReadyAddresses`` (which forces ``ready`` to true, as pdfleet's
    headless engine Services do so that handshake DNS works early); nil defers
    to ``ready``, nil ready counts as true (API docs). Terminating endpoints
    get no new requests, so they can drain.
    """
    if conditions.get("terminating") is True:
        return False
    serving = conditions.get("serving")
    if serving is not None:
        return serving is True
    return conditions.get("ready") is not False


def parse_slice(obj: Mapping[str, Any], fleet: str, port_name: str) -> SliceView | str:
    """One EndpointSlice as a SliceView, or the reason it is not used."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(FLEET_LABEL) != fleet:
        return f"label {FLEET_LABEL} is not {fleet!r}"
    role = labels.get(ROLE_LABEL)
    if role not in (PREFILL, DECODE):
        return f"label {ROLE_LABEL} must be prefill or decode, got {role!r}"
    revision = labels.get(REVISION_LABEL)
    if not revision:
        return f"label {REVISION_LABEL} is missing"
    ports = [p for p in obj.get("ports") or () if isinstance(p, dict) and isinstance(p.get("port"), int)]
    named = [p for p in ports if p.get("name") == port_name]
    if named:
        port = named[0]["port"]
    elif len(ports) == 1:
        port = ports[0]["port"]
    else:
        return f"no port named {port_name!r} among {[p.get('name') for p in ports]}"
    ipv6 = obj.get("addressType") == "IPv6"
    by_name = {p.get("name"): p["port"] for p in ports}
    events_port, replay_port = by_name.get(ports_contract.KV_EVENTS_NAME), by_name.get(ports_contract.KV_EVENTS_REPLAY_NAME)
    endpoints = []
    for ep in obj.get("endpoints") or ():
        addresses = ep.get("addresses") or ()
        if not addresses or not isinstance(addresses[0], str):
            continue
        ready = endpoint_usable(ep.get("conditions") or {})
        host = f"[{addresses[0]}]" if ipv6 else addresses[0]
        endpoints.append(Endpoint(
            f"http://{host}:{port}", ready,
            kv_events=f"tcp://{host}:{events_port}" if events_port else None,
            kv_events_replay=f"tcp://{host}:{replay_port}" if events_port and replay_port else None,
        ))
    return SliceView(role, revision, tuple(endpoints), _timestamp(meta.get("creationTimestamp")),
                     labels.get(SERVING_LABEL) == SERVING_TRUE, parse_weight(labels.get(CANARY_WEIGHT_LABEL)))


def groups_from_slices(slices: Iterable[Mapping[str, Any]], fleet: str, port_name: str) -> list[RevisionEndpoints]:
    """Group the fleet's slices by revision. An address listed by several slices is
    ready if any says so; a revision's age is its oldest slice's."""
    roles: dict[str, dict[str, dict[str, bool]]] = {}
    events: dict[str, tuple[str | None, str | None]] = {}
    created: dict[str, float] = {}
    serving: set[str] = set()
    weights: dict[str, list[int | None]] = {}
    for obj in slices:
        view = parse_slice(obj, fleet, port_name)
        if isinstance(view, str):
            continue
        by_role = roles.setdefault(view.revision, {PREFILL: {}, DECODE: {}})
        for ep in view.endpoints:
            by_role[view.role][ep.url] = by_role[view.role].get(ep.url, False) or ep.ready
            if ep.kv_events:
                events[ep.url] = (ep.kv_events, ep.kv_events_replay)
        if view.serving:  # one labelled slice is enough: the operator labels both roles' Services
            serving.add(view.revision)
        weights.setdefault(view.revision, []).append(view.canary_weight)
        seen = created.get(view.revision)
        created[view.revision] = view.created if seen is None else min(seen, view.created)
    return [
        RevisionEndpoints(
            revision=rev,
            prefill=tuple(Endpoint(u, r, *events.get(u, (None, None))) for u, r in sorted(by_role[PREFILL].items())),
            decode=tuple(Endpoint(u, r, *events.get(u, (None, None))) for u, r in sorted(by_role[DECODE].items())),
            created=created[rev],
            serving=rev in serving,
            canary_weight=_canary_weight(weights.get(rev, [])),
        )
        for rev, by_role in sorted(roles.items())
    ]


def _canary_weight(weights: list[int | None]) -> int | None:
    """A revision's canary weight from its slices' labels: the smallest (the operator relabels the
    prefill and decode Services one after the other; while they differ, the lower share holds),
    and none unless every slice carries one."""
    if not weights or any(w is None for w in weights):
        return None
    return min(w for w in weights if w is not None)


# ---- I/O: API access, list and watch ------------------------------------------------


@dataclass
class ApiAccess:
    server: str
    headers: dict[str, str]
    ssl: ssl.SSLContext | bool


def load_access(config: RouterConfig) -> ApiAccess:
    """Server URL, auth header and TLS settings, read afresh (tokens rotate)."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    if config.kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_kube_config(config_file=config.kubeconfig, client_configuration=cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    headers = {"Accept": "application/json"}
    token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token:
        headers["Authorization"] = token
    server = (config.api_server or cfg.host).rstrip("/")
    if not server.startswith("https://"):
        return ApiAccess(server, headers, False)
    if not cfg.verify_ssl:
        return ApiAccess(server, headers, False)
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ApiAccess(server, headers, ctx)


async def _watch_events(resp: aiohttp.ClientResponse):
    """Newline-delimited JSON events; oversized or malformed ones are dropped."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1:]
            if line.strip():
                try:
                    yield _decode_json(line)
                except msgspec.DecodeError:
                    log.warning("dropped a malformed watch event (%d bytes)", len(line))
        if len(buf) > MAX_EVENT_BYTES:
            log.warning("dropped an oversized watch event (%d bytes)", len(buf))
            buf = b""


def kubernetes_discovery(config: RouterConfig, *, access=load_access, max_backoff_s: float = 30.0):
    """A Discovery (see app.build_app) that keeps the router's endpoints in line with the slices."""
    assert config.kubernetes_fleet
    if access is load_access:  # fail at start, not in the retry loop, when the client library is missing
        try:
            import kubernetes  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("EndpointSlice discovery needs the `kubernetes` package "
                               "(pip install 'pdfleet[operator]')") from exc
    fleet = config.kubernetes_fleet
    namespace = quote(config.kubernetes_namespace, safe="")
    path = SLICES_PATH.format(namespace=namespace)
    services_path = SERVICES_PATH.format(namespace=namespace)
    selector = quote(f"{FLEET_LABEL}={fleet}", safe="")

    async def run(router) -> None:
        slices: dict[str, Any] = {}
        services: dict[str, str] = {}
        refused_seen: set[tuple[str, str]] = set()
        services_listed = -SERVICE_REFRESH_S

        def publish() -> None:
            kept, refused = owned_slices(slices.values(), services)
            for name, reason in refused:
                if (name, reason) not in refused_seen:
                    refused_seen.add((name, reason))
                    router.metrics.endpointslices_refused.inc()
                    log.warning("EndpointSlice %s is not used: %s (only the EndpointSlice controller's slices "
                                "of the fleet's own Services are)", name, reason)
            router.set_endpoints(groups_from_slices(kept, fleet, config.port_name))

        async def list_services(session, api) -> None:
            nonlocal services, services_listed
            services_listed = asyncio.get_running_loop().time()
            async with session.get(f"{api.server}{services_path}?labelSelector={selector}", headers=api.headers,
                                   ssl=api.ssl) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"listing Services gave HTTP {resp.status}: {(await resp.text())[:200]}")
                listing = _decode_json(await resp.read())
            services = owned_services(listing.get("items") or (), fleet, config.kubernetes_fleet_uid)

        backoff = 0.5
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s,
                                        sock_read=WATCH_TIMEOUT_S + 30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                cycle_started = asyncio.get_running_loop().time()
                try:
                    api = access(config)
                    url = api.server + path
                    await list_services(session, api)
                    async with session.get(f"{url}?labelSelector={selector}", headers=api.headers,
                                           ssl=api.ssl) as resp:
                        if resp.status != 200:
                            raise RuntimeError(f"listing EndpointSlices gave HTTP {resp.status}: "
                                               f"{(await resp.text())[:200]}")
                        listing = _decode_json(await resp.read())
                    slices = {(o.get("metadata") or {}).get("name"): o for o in listing.get("items") or ()}
                    publish()
                    backoff = 0.5
                    rv = (listing.get("metadata") or {}).get("resourceVersion") or ""
                    watch_url = (f"{url}?labelSelector={selector}&watch=true&allowWatchBookmarks=true"
                                 f"&timeoutSeconds={WATCH_TIMEOUT_S}&resourceVersion={quote(rv, safe='')}")
                    async with session.get(watch_url, headers=api.headers, ssl=api.ssl) as resp:
                        if resp.status != 200:
                            raise RuntimeError(f"watching EndpointSlices gave HTTP {resp.status}")
                        async for event in _watch_events(resp):
                            if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
                                continue
                            kind, obj = event.get("type"), event["object"]
                            if kind == "ERROR":  # e.g. 410 Gone: resourceVersion too old; list again
                                log.info("watch ended by the server: %s", obj.get("message"))
                                break
                            name = (obj.get("metadata") or {}).get("name")
                            if kind in ("ADDED", "MODIFIED"):
                                slices[name] = obj
                                if needs_service_refresh(obj, services):  # at most one list per SERVICE_REFRESH_S
                                    since = asyncio.get_running_loop().time() - services_listed
                                    await asyncio.sleep(max(0.0, SERVICE_REFRESH_S - since))
                                    await list_services(session, api)
                            elif kind == "DELETED":
                                slices.pop(name, None)
                            else:  # BOOKMARK
                                continue
                            publish()
                    # a server that ends watches at once must not make us spin
                    if asyncio.get_running_loop().time() - cycle_started < 1.0:
                        await asyncio.sleep(1.0)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # keep the last known endpoints and try again
                    log.warning("EndpointSlice discovery: %s; again in %.1f s", exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, max_backoff_s)

    return run
