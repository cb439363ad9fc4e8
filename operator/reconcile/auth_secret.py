"""Creates each fleet's generated Secrets, once (the I/O edge of plan/auth.py): the side-channel key,
the engines' API token (issue 30) and, behind a gateway, the Endpoint Picker's caller token (issue 38);
all are handled alike.

The operator only ever *creates* this Secret (POST). A 409 AlreadyExists is checked:
the existing Secret's metadata (only; PartialObjectMetadata, so no key reaches the
operator) must name this fleet as its controller by uid, else someone else made it
and may know the key, so it is never used: the fleet is not Ready (NotOwned) until it
is deleted or spec.kvTransfer.authSecretRef names a Secret the user manages. That read
needs `get` on secrets; it adds no power the operator lacks (it creates pods, which may
mount any Secret of their namespace), and it never patches or lists Secrets. The key is drawn from
os.urandom, sent once in the request body and never logged, put in status, or kept
in memory after the request. A fleet whose Secret was confirmed is not asked again
for RECHECK_SECONDS (a Secret deleted by hand is re-created within that time, or at
the next operator start); after an operator restart the first reconcile's POST gets
409 and the existing key stays.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Optional

from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan.auth import (
    KEY_BYTES, api_secret_name, epp_caller_secret_name, generated_api_secret, generated_epp_caller_secret,
    generated_secret, generated_secret_name, needs_epp_caller_secret, needs_generated_secret,
)
from pdfleet.operator.plan import kinds
from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.reconcile_plan.ownership import ownership

SECRET = kinds.SECRET
RECHECK_SECONDS = 600.0


class AuthSecrets:
    def __init__(self, client: KubeClient, *, clock: Callable[[], float] = time.monotonic,
                 keygen: Callable[[], bytes] = lambda: os.urandom(KEY_BYTES)) -> None:
        self._client = client
        self._clock = clock
        self._keygen = keygen
        self._confirmed: dict[tuple[str, str, str, str], float] = {}  # (namespace, fleet, uid, Secret) -> when
        self.created = 0

    async def ensure(self, namespace: str, fleet: str, spec: DisaggregatedInferenceSpec,
                     owner: Optional[Mapping[str, Any]]) -> tuple[Optional[str], Optional[str]]:
        """(error, not owned): (None, None) when the Secrets the engines mount are the fleet's (or the user
        brings the side-channel key); an error to retry; or a Secret's ref when one of that name is someone
        else's. Two Secrets: the side-channel key (unless the user brings one) and the engines' API token."""
        made = []
        if needs_generated_secret(spec):
            made.append((generated_secret_name(fleet), generated_secret))
        made.append((api_secret_name(fleet), generated_api_secret))
        if needs_epp_caller_secret(spec):  # behind a gateway: the token only the gateway may call the EPP with
            made.append((epp_caller_secret_name(fleet), generated_epp_caller_secret))
        for name, build in made:
            error, foreign = await self._ensure_one(namespace, fleet, name, build, owner)
            if error or foreign:
                return error, foreign
        return None, None

    async def _ensure_one(self, namespace: str, fleet: str, name: str, build: Callable[..., dict[str, Any]],
                          owner: Optional[Mapping[str, Any]]) -> tuple[Optional[str], Optional[str]]:
        uid = str((owner or {}).get("uid", ""))
        key = (namespace, fleet, uid, name)
        seen = self._confirmed.get(key)
        now = self._clock()
        if seen is not None and now - seen < RECHECK_SECONDS:
            return None, None
        body = build(fleet, namespace, self._keygen(), dict(owner) if owner else None)
        try:
            await self._client.create(SECRET, body)
            self.created += 1
        except ApiFailure as exc:
            if exc.status != 409:
                return f"create Secret {name}: {exc.status or 'connection error'}", None
            # 409 AlreadyExists: ours from before (an earlier reconcile or operator), or a squatter's
            try:
                meta = await self._client.get_metadata(SECRET, namespace, name)
            except ApiFailure as read:
                return f"check owner of Secret {name}: {read.status or 'connection error'}", None
            if ownership(meta, uid) == "foreign":
                return None, f"Secret/{name}"
            if meta is None:  # deleted between the two calls: create it at the next reconcile
                return f"create Secret {name}: deleted while checked", None
        finally:
            body.clear()  # drop our only reference to the key
        self._confirmed[key] = now
        return None, None

    def forget(self, namespace: str, fleet: str) -> None:
        for k in [k for k in self._confirmed if k[:2] == (namespace, fleet)]:
            del self._confirmed[k]
