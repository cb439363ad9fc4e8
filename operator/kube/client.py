"""The operator's writes to the Kubernetes API, and the one place they are retried.

Requests go through one aiohttp session of this client, built from the `kopf.ConnectionInfo`
that kopf's public login functions return (kubeconfig or the in-cluster service account; the
same `login` the operator's `@kopf.on.login` handler uses). A 401 logs in again once (a rotated
service-account token) and repeats the request. No kopf internals are used.

Retried with exponential backoff (bounded): 409 Conflict, 422 (a webhook or the server
refused a version it may accept shortly), 429 (Retry-After honoured), 5xx, connection
errors and timeouts. Not retried: 400/403/404 and others, which need a change of input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from typing import Any, Awaitable, Callable, Mapping, Optional
from urllib.parse import urlencode

import aiohttp
import kopf

from pdfleet.operator.kube.observed import ChildRef, kind_of
from pdfleet.operator.plan.kinds import EVENT, SECRET, Kind

logger = logging.getLogger("pdfleet.operator")

RETRIABLE_STATUSES = (409, 422, 429)
FIELD_MANAGER = "pdfleet"
USER_AGENT = "pdfleet-operator"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0

    def delay(self, attempt: int, retry_after: Optional[float] = None) -> float:
        backoff = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        backoff *= 0.5 + random.random() / 2  # jitter: many fleets must not retry in lockstep
        return max(backoff, retry_after or 0.0)


class ApiFailure(Exception):
    """A request that failed for good: after the retries, or at once for a non-retriable status."""

    def __init__(self, what: str, status: Optional[int], message: str):
        self.what, self.status, self.message = what, status, message
        super().__init__(f"{what}: {status or 'connection error'} {message}".strip())


class _StatusError(Exception):
    """An answer of 400 or more: its status, headers and the Status object's message and details."""

    def __init__(self, status: int, headers: Mapping[str, str], body: str):
        self.status, self.headers = status, dict(headers)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        payload = payload if isinstance(payload, dict) else {}
        details = payload.get("details")
        self.details: dict[str, Any] = details if isinstance(details, dict) else {}
        self.message = str(payload.get("message") or body[:256] or "")  # a non-JSON body: its head only
        super().__init__(self.message)


def _retry_after(exc: BaseException) -> Optional[float]:
    if isinstance(exc, _StatusError):
        value = exc.headers.get("Retry-After") or exc.details.get("retryAfterSeconds")
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None
    return None


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, _StatusError):
        return exc.status in RETRIABLE_STATUSES or exc.status >= 500
    return isinstance(exc, (aiohttp.ClientConnectionError, asyncio.TimeoutError, TimeoutError))


Login = Callable[[], Optional[kopf.ConnectionInfo]]


class KubeClient:
    """Server-side apply, delete and status patches for the reconciler.

    `login` returns the credentials (a kopf login function with its arguments bound); it is
    called at the first request and again after a 401."""

    def __init__(self, login: Login, *, timeout: float = 30.0, policy: RetryPolicy = RetryPolicy(),
                 on_request: Callable[[str, str, int], None] = lambda verb, kind, status: None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._login = login
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._policy = policy
        self._on_request = on_request
        self._sleep = sleep
        self._session: Optional[aiohttp.ClientSession] = None
        self._server = ""

    async def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            info = await asyncio.to_thread(self._login)  # reads files; the kubernetes client may refresh a token
            if info is None:
                raise ApiFailure("login", None, "no credentials: neither a kubeconfig nor a service account")
            self._server = info.server.rstrip("/")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
                headers={"User-Agent": USER_AGENT, **info.as_http_headers()},  # basic auth too
                proxy=info.proxy_url, trust_env=info.trust_env,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, method: str, url: str, payload: Any, headers: Optional[dict[str, str]]) -> Any:
        relogged = False
        while True:
            session = await self._open()
            async with session.request(method, self._server + url, json=payload, headers=headers,
                                       timeout=self._timeout) as response:
                text = await response.text()
                if response.status == 401 and not relogged:
                    relogged = True  # the token may have rotated: log in again, once
                    await self.close()
                    continue
                if response.status >= 400:
                    raise _StatusError(response.status, response.headers, text)
                return response.status, (json.loads(text) if text else None)

    async def _call(self, verb: str, kind: str, method: str, url: str, *, payload: Any = None,
                    headers: Optional[dict[str, str]] = None, final_statuses: tuple[int, ...] = ()) -> Any:
        """THE retry loop: every write of the operator passes here."""
        what = f"{method.upper()} {url}"
        for attempt in range(1, self._policy.attempts + 1):
            try:
                status, body = await self._send(method, url, payload, headers)
                self._on_request(verb, kind, status)
                return body
            except (_StatusError, aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
                status = exc.status if isinstance(exc, _StatusError) else None
                self._on_request(verb, kind, status or 0)
                message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                if not _retriable(exc) or status in final_statuses or attempt == self._policy.attempts:
                    raise ApiFailure(what, status, message) from exc
                delay = self._policy.delay(attempt, _retry_after(exc))
                logger.info("retrying %s after %s (attempt %d/%d, %.2fs)", what, status or type(exc).__name__,
                            attempt, self._policy.attempts, delay)
                await self._sleep(delay)
        raise AssertionError("unreachable")

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with field manager `pdfleet`, forcing ownership of the fields it sends."""
        kind = kind_of(obj)
        meta = obj["metadata"]
        url = kind.path(meta.get("namespace"), meta["name"]) + f"?fieldManager={FIELD_MANAGER}&force=true"
        return await self._call("patch", kind.plural, "patch", url, payload=dict(obj),
                                headers={"Content-Type": "application/apply-patch+yaml"})

    async def create(self, kind: Kind, obj: Mapping[str, Any]) -> Any:
        """Create only (POST): an existing object answers 409 and is left untouched."""
        return await self._call("create", kind.plural, "post", kind.path(obj["metadata"].get("namespace")),
                                payload=dict(obj), final_statuses=(409,))  # AlreadyExists is an answer

    async def get_metadata(self, kind: Kind, namespace: Optional[str], name: str) -> Optional[dict[str, Any]]:
        """An object's metadata only (PartialObjectMetadata: a Secret's data never travels), None if absent.

        Asked only before the first write of a child the watch has not shown as the fleet's."""
        try:
            obj = await self._call("get", kind.plural, "get", kind.path(namespace, name), final_statuses=(404,),
                                   headers={"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
                                                      "application/json"})
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        return {k: meta.get(k) for k in ("name", "namespace", "uid", "ownerReferences")} if isinstance(meta, dict) else {}

    async def get_secret_keys(self, namespace: str, name: str) -> Optional[frozenset[str]]:
        """The key names of a Secret the spec names, None if absent; the values are dropped here and never
        leave this method (reconcile/referenced_secrets.py)."""
        try:
            obj = await self._call("get", SECRET.plural, "get", SECRET.path(namespace, name), final_statuses=(404,))
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise
        data = obj.get("data") if isinstance(obj, dict) else None
        return frozenset(str(k) for k in data) if isinstance(data, dict) else frozenset()

    async def list_labelled(self, kind: Kind, namespace: str, selector: str) -> list[dict[str, Any]]:
        """LIST by a label selector: for objects no watch of the operator sees (another controller's)."""
        url = kind.path(namespace) + "?" + urlencode({"labelSelector": selector})
        body = await self._call("list", kind.plural, "get", url)
        items = body.get("items") if isinstance(body, dict) else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    async def delete(self, ref: ChildRef, kind: Kind, *, uid: Optional[str] = None) -> None:
        """Delete in the background; a precondition on uid never deletes a same-named successor."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("delete", kind.plural, "delete", kind.path(ref.namespace, ref.name), payload=body)
        except ApiFailure as exc:
            if exc.status != 404:  # already gone: the goal is reached
                raise

    async def merge_patch(self, ref: ChildRef, kind: Kind, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of one object (null removes a key)."""
        return await self._call("patch", kind.plural, "patch", kind.path(ref.namespace, ref.name),
                                payload=dict(patch), headers={"Content-Type": "application/merge-patch+json"})

    async def patch_scale(self, kind: Kind, namespace: str, name: str, replicas: int) -> dict[str, Any]:
        """Set replicas through the /scale subresource (what an HPA or the planner writes)."""
        return await self._call("patch", f"{kind.plural}/scale", "patch", kind.path(namespace, name, "scale"),
                                payload={"spec": {"replicas": replicas}},
                                headers={"Content-Type": "application/merge-patch+json"})

    async def apply_scale(self, kind: Kind, namespace: str, name: str, replicas: int, field_manager: str
                          ) -> dict[str, Any]:
        """Set replicas by server-side apply of an autoscaling/v1 Scale on the /scale subresource, as
        ``field_manager`` (forced: the value is the decision; an HPA's or KEDA's update keeps working)."""
        url = kind.path(namespace, name, "scale") + "?" + urlencode({"fieldManager": field_manager, "force": "true"})
        body = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas}}
        return await self._call("patch", f"{kind.plural}/scale", "patch", url, payload=body,
                                headers={"Content-Type": "application/apply-patch+yaml"})

    async def post_event(self, namespace: Optional[str], event: Mapping[str, Any]) -> Any:
        """Create a core/v1 Event (best effort is the caller's choice)."""
        return await self._call("create", "events", "post", EVENT.path(namespace), payload=dict(event))

    async def patch_status(self, kind: Kind, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the status with a merge patch on the /status subresource.

        Keys the new status drops are sent as null so that the merge removes them."""
        return await self._call("patch", f"{kind.plural}/status", "patch",
                                kind.path(namespace, name, "status"), payload={"status": dict(status)},
                                headers={"Content-Type": "application/merge-patch+json"})
