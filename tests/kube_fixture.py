"""A kmock 0.8 Kubernetes API server made close enough to a real one for kopf operators.

kmock's `KubernetesEmulator` stores objects and serves list/watch/create/patch/delete, but it
does not set the fields a real API server owns and treats every PATCH as a merge. `FakeKube`
keeps kmock's HTTP server, discovery and rendering and replaces the state changes with what a
real API server does:

- metadata.uid / resourceVersion / generation / creationTimestamp set by the server;
  generation bumps only when something outside metadata/status changes;
- a write that changes nothing bumps nothing and emits no watch event (as on a real server);
- `/status` changes only `.status`; the main resource ignores `.status` (status subresource);
- 409 on a stale `metadata.resourceVersion`, 409 AlreadyExists on create, 404 on missing;
- server-side apply (`application/apply-patch+yaml`) creates a missing object, requires a
  fieldManager, and removes fields the same manager applied before and no longer sends;
- JSON patch with a failing `test` op gives 422, an unknown patch type 415;
- a merge patch of `/scale` changes only `.spec.replicas` (the response is the object, not a Scale);
- list/watch honour `labelSelector`; watch honours `resourceVersion` and `timeoutSeconds`;
- owner-reference garbage collection (background) and finalizers on delete;
- every request is recorded as an RBAC tuple (verb, group, resource, namespaced) and counted;
- faults can be injected (e.g. 409/429/500 on the next N writes).

It reaches into kmock internals (`_objects`, `_buses`, `_lock`, fallbacks), so kmock is pinned
exactly (kmock==0.8). The server runs in the test's event loop; the operator runs in its own
thread and loop and talks to it over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import datetime
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import references, rendering

from pdfleet.operator.kube.client import USER_AGENT
from waits import until as eventually  # noqa: F401  (the operator tests import it from here)

assert kmock.__version__ == "0.8", f"FakeKube reaches into kmock internals; pinned to 0.8, got {kmock.__version__}"

STATUS_SUBRESOURCE_RESOURCES = {
    ("apps", "statefulsets"), ("apps", "deployments"), ("", "pods"), ("", "services"),
    ("policy", "poddisruptionbudgets"),
}
WRITE_VERBS = {"create", "patch", "update", "delete", "deletecollection"}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class ApiCall:
    verb: str          # RBAC verb: get list watch create patch update delete deletecollection
    group: str
    resource: str      # plural, or plural/subresource
    namespaced: bool
    namespace: str | None
    name: str | None
    status: int = 0
    label_selector: str | None = None
    agent: str = ""
    field_manager: str | None = None   # the fieldManager parameter of a write, if any

    @property
    def rbac(self) -> tuple[str, str, str, bool]:
        return (self.verb, self.group, self.resource, self.namespaced)


@dataclasses.dataclass
class Fault:
    """Answer the next `count` matching requests with `status` instead of serving them;
    with `hold`, first wait until the event is set (status None: then serve normally)."""
    status: int | None
    count: int
    verbs: frozenset[str] = frozenset(WRITE_VERBS)
    resource: str | None = None
    hold: asyncio.Event | None = None
    hits: int = 0


def parse_label_selector(selector: str) -> list[Callable[[dict[str, str]], bool]]:
    """Parse the label selector grammar the API server accepts into predicates."""
    preds: list[Callable[[dict[str, str]], bool]] = []
    for term in re.findall(r"(?:[^,(]|\([^)]*\))+", selector or ""):
        term = term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                preds.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                preds.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m := re.fullmatch(r"(\S+?)\s*(==|!=|=)\s*(\S*)", term):
            key, op, value = m.groups()
            if op == "!=":
                preds.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                preds.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif term.startswith("!"):
            preds.append(lambda lb, k=term[1:].strip(): k not in lb)
        else:
            preds.append(lambda lb, k=term: k in lb)
    return preds


def _labels_match(obj: dict[str, Any], preds: list[Callable[[dict[str, str]], bool]]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(p(labels) for p in preds)


def _removed_paths(previous: Any, current: Any) -> Any:
    """Merge-patch that deletes what `previous` had and `current` no longer has (dicts only)."""
    if not isinstance(previous, dict) or not isinstance(current, dict):
        return None
    out: dict[str, Any] = {}
    for key, old in previous.items():
        if key not in current:
            out[key] = None
        elif isinstance(old, dict) and isinstance(current[key], dict):
            sub = _removed_paths(old, current[key])
            if sub:
                out[key] = sub
    return out


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


class ApiError(kmock.KubernetesError):
    pass


def _error(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details={})


@attrs.define(kw_only=True)
class FakeKube(kmock.KubernetesEmulator):
    calls: list[ApiCall] = attrs.field(factory=list, init=False)
    namespaces: set[str] = attrs.field(factory=lambda: {"default"})
    faults: list[Fault] = attrs.field(factory=list, init=False)
    _rv_counter: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    _last_rv: int = attrs.field(default=999, init=False)
    _applied: dict[Any, Any] = attrs.field(factory=dict, init=False)
    _builtin_payloads: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._builtin_payloads = len(self._payloads)

    # ---------------------------------------------------------------- bookkeeping
    def _next_rv(self) -> str:
        self._last_rv = next(self._rv_counter)
        return str(self._last_rv)

    def _namespaced(self, resource: references.resource) -> bool:
        info = self.resources[resource] if resource in self.resources else None
        return bool(info.namespaced) if info is not None and info.namespaced is not None else True

    def _has_status_subresource(self, resource: references.resource) -> bool:
        if resource in self.resources and "status" in self.resources[resource].subresources:
            return True
        return (resource.group, resource.plural) in STATUS_SUBRESOURCE_RESOURCES

    @staticmethod
    def _verb(request: rendering.Request) -> str:
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        if method == "GET":
            if request.params.get("watch") in ("true", "1"):
                return "watch"
            return "get" if request.name else "list"
        return {
            "POST": "create", "PATCH": "patch", "PUT": "update",
            "DELETE": "delete" if request.name else "deletecollection",
        }.get(method, method.lower())

    def operator_calls(self, since: int = 0) -> list[ApiCall]:
        """Requests sent by the operator (kopf's watches, the KubeClient's writes), not by the test's own client."""
        return [c for c in self.calls[since:] if c.agent.startswith(("kopf/", USER_AGENT))]

    def writes(self, since: int = 0) -> list[ApiCall]:
        return [c for c in self.operator_calls(since) if c.verb in WRITE_VERBS]

    def rbac_calls(self) -> set[tuple[str, str, str, bool]]:
        return {c.rbac for c in self.operator_calls()}

    async def _emit(self, resource: references.resource, kind: str, raw: dict[str, Any]) -> None:
        await self._buses[resource].put({"type": kind, "object": copy.deepcopy(raw)})

    def _alive(self, key: Any) -> bool:
        return key in self._objects and not self._objects[key].deleted

    # ---------------------------------------------------------------- request entry
    async def __call__(self, raw_request: Any) -> Any:
        # kmock 0.8 cannot parse the path of the namespace collection (/api/v1/namespaces):
        # serve it here. Namespaces exist implicitly: those of stored objects plus `self.namespaces`.
        if re.fullmatch(r"/api/v1/namespaces/?", raw_request.path) and raw_request.method == "POST":
            body = await raw_request.json()
            self.namespaces.add(body["metadata"]["name"])
            return aiohttp.web.json_response({**body, "status": {"phase": "Active"}}, status=201)
        if (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/?", raw_request.path)) and raw_request.method == "DELETE":
            await raw_request.read()
            self.namespaces.discard(m.group(1))
            async with self._lock:
                for key, obj in list(self._objects.items()):
                    if key[1] == m.group(1) and not obj.deleted:
                        await self._finalize(key)
            return aiohttp.web.json_response({"kind": "Namespace", "metadata": {"name": m.group(1)}})
        if re.fullmatch(r"/api/v1/namespaces/?", raw_request.path) and raw_request.method == "GET":
            await raw_request.read()
            watching = raw_request.query.get("watch") in ("true", "1")
            self.calls.append(ApiCall("watch" if watching else "list", "", "namespaces", False, None, None, 200,
                                      agent=raw_request.headers.get("User-Agent", "")))
            names = sorted({ns for (_, ns, _), obj in self._objects.items() if ns and not obj.deleted} | self.namespaces)
            items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "uid": f"ns-{n}",
                      "resourceVersion": "1"}, "status": {"phase": "Active"}} for n in names]
            if not watching:
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList",
                                                  "metadata": {"resourceVersion": str(self._last_rv)}, "items": items})
            response = aiohttp.web.StreamResponse()
            await response.prepare(raw_request)
            timeout = float(raw_request.query.get("timeoutSeconds") or 60)
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await asyncio.sleep(timeout)
            return response
        return await super().__call__(raw_request)

    async def _handle(self, request: rendering.Request):  # type: ignore[override]
        res = request.resource
        if res is None or not res.plural:  # discovery and non-API paths: kmock's scaffold
            return await kmock.KubernetesScaffold._handle(self, request)

        verb = self._verb(request)
        resource_name = res.plural + (f"/{request.subresource}" if request.subresource else "")
        call = ApiCall(verb, res.group or "", resource_name, self._namespaced(res),
                       request.namespace, request.name, label_selector=request.params.get("labelSelector"),
                       agent=request.headers.get("User-Agent", ""), field_manager=request.params.get("fieldManager"))
        index = len(self.calls)
        self.calls.append(call)  # recorded first: watches answer only when they end
        try:
            await self._inject_fault(verb, resource_name)
            async with self._lock:
                if verb == "create":
                    await self._create(request)
                elif verb == "patch":
                    await self._patch(request)
                elif verb == "delete":
                    await self._delete(request)
                elif verb == "update":
                    raise _error(405, "MethodNotAllowed", "PUT is not served by FakeKube; use PATCH")
            if verb != "watch":
                response = await self._dispatch(request, verb)
                self.calls[index] = dataclasses.replace(call, status=response.status)
                return response
        except kmock.KubernetesError as e:
            self.calls[index] = dataclasses.replace(call, status=e.status)
            raise
        self.calls[index] = dataclasses.replace(call, status=200)
        return await self._dispatch(request, verb)

    async def _dispatch(self, request: rendering.Request, verb: str):  # type: ignore[no-untyped-def]
        # kmock's DSL matching costs ~25 ms per request here; while a test has registered no
        # reactions of its own, call the same fallbacks directly (same payloads, same rendering).
        if len(self._payloads) == self._builtin_payloads:
            serve = {"list": self._serve_list, "watch": self._serve_watch, "get": self._serve_fetch,
                     "create": self._serve_create, "patch": self._serve_update, "delete": self._serve_delete}.get(verb)
            if serve is not None:
                payload = serve(request)
                if asyncio.iscoroutine(payload):
                    payload = await payload
                return await kmock.Response(payload=payload)(request)
        return await kmock.KubernetesScaffold._handle(self, request)

    async def _inject_fault(self, verb: str, resource: str) -> None:
        for fault in self.faults:
            if fault.hits < fault.count and verb in fault.verbs and fault.resource in (None, resource):
                fault.hits += 1
                if fault.hold is not None:
                    await fault.hold.wait()
                if fault.status is None:
                    return
                reason = {409: "Conflict", 422: "Invalid", 429: "TooManyRequests"}.get(fault.status, "InternalError")
                raise _error(fault.status, reason, f"injected fault {fault.status}")

    # ---------------------------------------------------------------- writes
    def _stamp_new(self, resource: references.resource, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if self._namespaced(resource):
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for server_owned in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(server_owned, None)
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_rv()
        meta["generation"] = 1
        meta["creationTimestamp"] = _now()
        if self._has_status_subresource(resource):
            obj.pop("status", None)
        if resource.plural == "customresourcedefinitions":  # the apiextensions controller's part
            obj["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
        return obj

    async def _store_new(self, key: Any, obj: dict[str, Any]) -> None:
        if key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
        await self._emit(key[0], "ADDED", obj)

    async def _create(self, request: rendering.Request) -> None:
        data = request.data if isinstance(request.data, dict) else None
        if data is None:
            raise _error(400, "BadRequest", "the body of a create must be a JSON object")
        meta = data.get("metadata") or {}
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
            data = _merge(data, {"metadata": {"name": name}})
        if not name:
            raise _error(422, "Invalid", "metadata.name: Required value")
        ns = request.namespace or meta.get("namespace")
        key = (request.resource, ns if self._namespaced(request.resource) else None, name)
        if self._alive(key):
            raise _error(409, "AlreadyExists", f"{request.resource.plural} \"{name}\" already exists")
        await self._store_new(key, self._stamp_new(request.resource, ns, data))
        # kmock's fallback finds the created object by the name in the body.
        object.__setattr__(request, "data", _merge(request.data, {"metadata": {"name": name}}))

    async def _patch(self, request: rendering.Request) -> None:
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        key = (request.resource, request.namespace, request.name)
        exists = self._alive(key)
        current = copy.deepcopy(self._objects[key].raw) if exists else None

        if ctype == "application/apply-patch+yaml":
            manager = request.params.get("fieldManager")
            if not manager:
                raise _error(400, "BadRequest", "fieldManager is required for apply patch")
            applied = request.data if isinstance(request.data, dict) else yaml.safe_load(request.text or "{}")
            if not isinstance(applied, dict):
                raise _error(400, "BadRequest", "apply patch body must be an object")
            if (applied.get("metadata") or {}).get("name") not in (None, request.name):
                raise _error(400, "BadRequest", "the name in the body does not match the URL")
            if current is None:
                if request.subresource:
                    raise _error(404, "NotFound", f"{request.resource.plural} \"{request.name}\" not found")
                obj = self._stamp_new(request.resource, request.namespace, _merge(applied, {"metadata": {"name": request.name}}))
                self._applied[(key, manager)] = copy.deepcopy(applied)
                await self._store_new(key, obj)
                return
            # Fields this manager applied before and no longer sends are removed, as SSA does.
            removals = _removed_paths(self._applied.get((key, manager)), applied) or {}
            patched = _merge(_merge(current, removals), applied)
            self._applied[(key, manager)] = copy.deepcopy(applied)
            precondition = (applied.get("metadata") or {}).get("resourceVersion")
        elif ctype == "application/json-patch+json":
            if current is None:
                raise _error(404, "NotFound", f"{request.resource.plural} \"{request.name}\" not found")
            try:
                patched = jsonpatch.apply_patch(current, request.data, in_place=False)
            except jsonpatch.JsonPatchTestFailed as e:
                raise _error(422, "Invalid", f"the server rejected our request due to an error in our request: {e}") from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise _error(422, "Invalid", str(e)) from None
            precondition = None
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json", "application/json", ""):
            if current is None:
                raise _error(404, "NotFound", f"{request.resource.plural} \"{request.name}\" not found")
            if not isinstance(request.data, dict):
                raise _error(400, "BadRequest", "merge patch body must be an object")
            patched = _merge(current, request.data)
            precondition = (request.data.get("metadata") or {}).get("resourceVersion")
        else:
            raise _error(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")

        assert current is not None
        cur_meta = current["metadata"]
        if precondition is not None and str(precondition) != str(cur_meta.get("resourceVersion")):
            raise _error(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")

        if request.subresource == "scale":
            # The body is an autoscaling/v1 Scale: only its spec.replicas reaches the resource
            # (specReplicasPath .spec.replicas, the path pdfleet's scaler and the built-ins use).
            replicas = ((request.data or {}).get("spec") or {}).get("replicas") if isinstance(request.data, dict) else None
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise _error(422, "Invalid", "Scale.spec.replicas: must be a non-negative integer")
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["replicas"] = replicas
        elif request.subresource == "status":
            new = copy.deepcopy(current)
            if "status" in patched:
                new["status"] = patched["status"]
            else:
                new.pop("status", None)
        else:
            new = patched
            if self._has_status_subresource(request.resource):
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for server_owned in ("uid", "creationTimestamp", "generation", "resourceVersion", "namespace", "name",
                             "deletionTimestamp"):
            if server_owned in cur_meta:
                meta[server_owned] = cur_meta[server_owned]
            else:
                meta.pop(server_owned, None)
        if new == current:
            return  # a no-op write: no new resourceVersion, no watch event
        spec_like = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        old_spec_like = {k: v for k, v in current.items() if k not in ("metadata", "status")}
        if spec_like != old_spec_like:
            meta["generation"] = int(cur_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_rv()
        self._objects[key].history.append(new)
        await self._emit(request.resource, "MODIFIED", new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._finalize(key)

    async def _delete(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if not self._alive(key):
            raise _error(404, "NotFound", f"{request.resource.plural} \"{request.name}\" not found")
        body = request.data if isinstance(request.data, dict) else {}
        policy = request.params.get("propagationPolicy") or body.get("propagationPolicy") or "Background"
        await self._mark_deleted(key, orphan=(policy == "Orphan"))

    async def _mark_deleted(self, key: Any, *, orphan: bool = False) -> None:
        obj = self._objects[key]
        meta = obj.raw.get("metadata", {})
        if meta.get("deletionTimestamp"):
            return
        if meta.get("finalizers"):
            new = _merge(obj.raw, {"metadata": {"deletionTimestamp": _now(), "resourceVersion": self._next_rv()}})
            obj.history.append(new)
            await self._emit(key[0], "MODIFIED", new)
        else:
            await self._finalize(key, orphan=orphan)

    async def _finalize(self, key: Any, *, orphan: bool = False) -> None:
        """Remove the object for good and garbage-collect its dependents (background policy)."""
        obj = self._objects[key]
        raw = copy.deepcopy(obj.raw)
        raw["metadata"]["resourceVersion"] = self._next_rv()
        obj.delete()
        for applied_key in [k for k in self._applied if k[0] == key]:
            del self._applied[applied_key]
        await self._emit(key[0], "DELETED", raw)
        if orphan:
            return
        uid = raw["metadata"].get("uid")
        for dep_key, dep in list(self._objects.items()):
            if dep.deleted:
                continue
            refs = (dep.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                await self._mark_deleted(dep_key)

    # ---------------------------------------------------------------- reads
    def _select(self, request: rendering.Request) -> list[dict[str, Any]]:
        preds = parse_label_selector(request.params.get("labelSelector", ""))
        out = []
        for (resource, namespace, _name), obj in self._objects.items():
            if obj.deleted or resource != request.resource:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if _labels_match(obj.raw, preds):
                out.append(copy.deepcopy(obj.raw))
        return out

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            items = self._select(request)
            rv = str(self._last_rv)
        kind = self.resources[request.resource].kind if request.resource in self.resources else None
        return {"apiVersion": "v1", "kind": f"{kind or 'Object'}List", "metadata": {"resourceVersion": rv}, "items": items}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now
        preds = parse_label_selector(request.params.get("labelSelector", ""))
        since = request.params.get("resourceVersion")
        timeout = float(request.params["timeoutSeconds"]) if request.params.get("timeoutSeconds") else None
        bus = self._buses[request.resource]
        async with self._lock:
            marker = await bus.mark()  # subscribe under the lock: no event is lost between replay and stream
            replay = []
            for obj in self._select(request):
                rv = int(obj["metadata"].get("resourceVersion", "0"))
                if since in (None, "", "0") or rv > int(since):
                    replay.append({"type": "ADDED", "object": obj})
        try:
            for event in replay:
                yield event
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    async for event in bus.stream(since=marker):
                        obj = event.get("object", {})
                        ns = (obj.get("metadata") or {}).get("namespace")
                        if request.namespace is not None and ns != request.namespace:
                            continue
                        if not _labels_match(obj, preds):
                            continue
                        yield event
        finally:
            await bus.unmark(marker)

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        raw = await super()._serve_create(request)
        return kmock.Response(status=201, payload=raw)

    # ---------------------------------------------------------------- test helpers (server loop)
    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        return copy.deepcopy(self._objects[key].raw) if self._alive(key) else None

    def list(self, resource: str, namespace: str | None = None, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        res = kmock.resource(resource)
        out = []
        for (r, ns, _), obj in self._objects.items():
            if r != res or obj.deleted or (namespace is not None and ns != namespace):
                continue
            have = (obj.raw.get("metadata") or {}).get("labels") or {}
            if labels and any(have.get(k) != v for k, v in labels.items()):
                continue
            out.append(copy.deepcopy(obj.raw))
        return out

    async def put(self, resource: str, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would (server-set fields are filled in)."""
        res = kmock.resource(resource)
        key = (res, namespace, obj["metadata"]["name"])
        async with self._lock:
            if self._alive(key):
                cur = self._objects[key].raw
                new = copy.deepcopy(obj)
                new["metadata"] = {**new.get("metadata", {}), **{k: cur["metadata"][k] for k in ("uid", "creationTimestamp", "generation") if k in cur["metadata"]}}
                new["metadata"]["namespace"] = namespace
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._objects[key].history.append(new)
                await self._emit(res, "MODIFIED", new)
                return copy.deepcopy(new)
            new = self._stamp_new(res, namespace, obj)
            if "status" in obj:
                new["status"] = copy.deepcopy(obj["status"])
            await self._store_new(key, new)
            return copy.deepcopy(new)

    async def set_status(self, resource: str, namespace: str | None, name: str, status: dict[str, Any]) -> None:
        """What a controller (kubelet, StatefulSet controller) does: replace .status."""
        res = kmock.resource(resource)
        key = (res, namespace, name)
        async with self._lock:
            cur = copy.deepcopy(self._objects[key].raw)
            if cur.get("status") == status:
                return
            cur["status"] = copy.deepcopy(status)
            cur["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[key].history.append(cur)
            await self._emit(res, "MODIFIED", cur)

    async def remove(self, resource: str, namespace: str | None, name: str) -> None:
        key = (kmock.resource(resource), namespace, name)
        async with self._lock:
            if self._alive(key):
                await self._mark_deleted(key)

    async def simulate_deployment(self, namespace: str, name: str, *, ready: int | None = None,
                                  pods: bool = False, ip: str = "127.0.0.1") -> list[dict[str, Any]]:
        """Play the Deployment controller: the status; with `pods`, also its ReplicaSet (labels and
        pod-template-hash as Kubernetes sets them) and that ReplicaSet's pods, all at `ip`."""
        dep = self.get("apps/v1/deployments", namespace, name)
        assert dep is not None, f"no Deployment {namespace}/{name}"
        replicas = int(dep["spec"].get("replicas", 1))
        ready = replicas if ready is None else min(ready, replicas)
        made = []
        if pods:
            template = dep["spec"]["template"]
            pth = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
            labels = {**(template.get("metadata", {}).get("labels") or {}), "pod-template-hash": pth}
            rs = await self.put("apps/v1/replicasets", namespace, {
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": f"{name}-{pth}", "namespace": namespace, "labels": labels,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                                  "uid": dep["metadata"]["uid"], "controller": True}]},
                "spec": {"replicas": replicas, "template": copy.deepcopy(template)}})
            for i in range(replicas):
                made.append(await self.put("v1/pods", namespace, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{name}-{pth}-{i}", "namespace": namespace, "labels": labels,
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                      "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"],
                                                      "controller": True}]},
                    "spec": copy.deepcopy(template.get("spec", {})),
                    "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                               "conditions": [{"type": "Ready", "status": "True" if i < ready else "False"}]}}))
        await self.set_status("apps/v1/deployments", namespace, name, {
            "observedGeneration": dep["metadata"]["generation"], "replicas": replicas,
            "readyReplicas": ready, "availableReplicas": ready, "updatedReplicas": replicas,
        })
        return made

    async def simulate_statefulset(self, namespace: str, name: str, *, ready: int | None = None,
                                   ip_prefix: str = "10.1") -> list[dict[str, Any]]:
        """Play the StatefulSet controller and kubelet: pods name-0..N-1, `ready` of them Ready."""
        sts = self.get("apps/v1/statefulsets", namespace, name)
        assert sts is not None, f"no StatefulSet {namespace}/{name}"
        replicas = int(sts["spec"].get("replicas", 1))
        ready = replicas if ready is None else min(ready, replicas)
        template = sts["spec"]["template"]
        # the StatefulSet controller's revision name: <statefulset>-<hash of the pod template>
        revision = f"{name}-{hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]}"
        pods = []
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            ip = f"{ip_prefix}.{abs(hash(name)) % 250}.{i + 2}"
            is_ready = i < ready
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": pod_name, "namespace": namespace,
                    "labels": {**(template.get("metadata", {}).get("labels") or {}),
                               "statefulset.kubernetes.io/pod-name": pod_name,
                               "controller-revision-hash": revision},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                                         "uid": sts["metadata"]["uid"], "controller": True}],
                },
                "spec": copy.deepcopy(template.get("spec", {})),
                "status": {
                    "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}],
                },
            }
            existing = self.get("v1/pods", namespace, pod_name)
            if existing is None or existing["metadata"].get("labels") != pod["metadata"]["labels"]:
                pods.append(await self.put("v1/pods", namespace, pod))  # new, or replaced by a rolling update
            else:
                await self.set_status("v1/pods", namespace, pod_name, pod["status"])
                pods.append(self.get("v1/pods", namespace, pod_name))
        for pod in self.list("v1/pods", namespace):
            owners = pod["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == sts["metadata"]["uid"] for o in owners):
                index = int(pod["metadata"]["name"].rsplit("-", 1)[-1])
                if index >= replicas:
                    await self.remove("v1/pods", namespace, pod["metadata"]["name"])
        await self.set_status("apps/v1/statefulsets", namespace, name, {
            "observedGeneration": sts["metadata"]["generation"],
            "replicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
            "currentReplicas": replicas, "updatedReplicas": replicas,
            "currentRevision": revision, "updateRevision": revision,
        })
        return pods

    async def _lws_statefulset(self, namespace: str, lws_name: str, name: str, replicas: int,
                               controller: dict[str, Any]) -> dict[str, Any]:
        existing = self.get("apps/v1/statefulsets", namespace, name)
        if existing is not None:
            return existing
        return await self.put("apps/v1/statefulsets", namespace, {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "labels": {"leaderworkerset.sigs.k8s.io/name": lws_name},
                         "ownerReferences": [controller]},
            "spec": {"replicas": replicas, "template": {}}})

    async def simulate_leaderworkerset(self, namespace: str, name: str, *, ready: int | None = None,
                                       ip_prefix: str = "10.2",
                                       init_message: str | None = None) -> list[dict[str, Any]]:
        """Play the LeaderWorkerSet controller and kubelet: per group g a leader `name-g` and workers
        `name-g-w` (labels as LWS sets them), the first `ready` groups Ready. `init_message`: the
        termination message of every pod's first init container (e.g. a fabric preflight verdict)."""
        resource = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
        lws = self.get(resource, namespace, name)
        assert lws is not None, f"no LeaderWorkerSet {namespace}/{name}"
        replicas = int(lws["spec"].get("replicas", 1))
        ready = replicas if ready is None else min(ready, replicas)
        lwt = lws["spec"]["leaderWorkerTemplate"]
        size = int(lwt.get("size", 1))
        # As the LWS controller makes them: the leaders' StatefulSet is the LWS's, each group's
        # workers' StatefulSet is its leader pod's; neither carries the fleet's labels.
        owner_sts = {name: await self._lws_statefulset(namespace, name, name, replicas, {
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": name,
            "uid": lws["metadata"]["uid"], "controller": True})}
        pods = []
        for g in range(replicas):
            for w in range(size):
                template = lwt["leaderTemplate"] if w == 0 else lwt["workerTemplate"]
                pod_name = f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}"
                sts_name = name if w == 0 else f"{name}-{g}"
                if sts_name not in owner_sts:
                    leader = pods[-w]
                    owner_sts[sts_name] = await self._lws_statefulset(namespace, name, sts_name, size - 1, {
                        "apiVersion": "v1", "kind": "Pod", "name": leader["metadata"]["name"],
                        "uid": leader["metadata"]["uid"], "controller": True})
                ip = f"{ip_prefix}.{abs(hash(name)) % 250}.{g * size + w + 2}"
                status: dict[str, Any] = {
                    "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True" if g < ready else "False"}],
                }
                inits = (template.get("spec") or {}).get("initContainers") or []
                if init_message is not None and inits:
                    status["initContainerStatuses"] = [{
                        "name": inits[0]["name"], "ready": False, "restartCount": 0, "image": inits[0]["image"],
                        "imageID": "", "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                "message": init_message}},
                    }]
                pod = {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {
                        "name": pod_name, "namespace": namespace,
                        "labels": {**(template.get("metadata", {}).get("labels") or {}),
                                   "leaderworkerset.sigs.k8s.io/name": name,
                                   "leaderworkerset.sigs.k8s.io/group-index": str(g),
                                   "leaderworkerset.sigs.k8s.io/worker-index": str(w)},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts_name,
                                             "uid": owner_sts[sts_name]["metadata"]["uid"], "controller": True}],
                    },
                    "spec": copy.deepcopy(template.get("spec", {})),
                    "status": status,
                }
                if self.get("v1/pods", namespace, pod_name) is None:
                    pods.append(await self.put("v1/pods", namespace, pod))
                else:
                    await self.set_status("v1/pods", namespace, pod_name, status)
                    pods.append(self.get("v1/pods", namespace, pod_name))
        await self.set_status(resource, namespace, name, {
            "observedGeneration": lws["metadata"]["generation"],
            "replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas,
        })
        return pods


def register_resources(server: FakeKube, crd_resources: Iterable[tuple[str, str, str, str]] = ()) -> None:
    """Built-in discovery (kmock's bundled K3s list) plus custom resources:
    (group, version, plural, kind) — namespaced, with a status subresource."""
    server.resources.load_bundled()
    for group, version, plural, kind in crd_resources:
        server.resources[f"{group}/{version}/{plural}"] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=True,
            verbs={"get", "list", "watch", "create", "patch", "update", "delete", "deletecollection"},
            subresources={"status"},
        )


def write_kubeconfig(path: str, server_url: str, namespace: str = "default") -> str:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server_url}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return path


@contextlib.asynccontextmanager
async def fake_kube(crd_resources: Iterable[tuple[str, str, str, str]] = ()) -> AsyncIterator[FakeKube]:
    """Start a FakeKube on 127.0.0.1 with a free port in the running event loop."""
    async with FakeKube() as server, kmock.Server(server):
        register_resources(server, crd_resources)
        yield server

