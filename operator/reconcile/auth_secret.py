"""Creates each fleet's generated side-channel key Secret, once (the I/O edge of plan/auth.py).

The operator only ever *creates* this Secret (POST; 409 AlreadyExists means it is
there and is kept as it is): it never reads, patches or lists Secrets, so its RBAC
holds `create` on secrets and nothing that could read a key. The key is drawn from
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
from pdfleet.operator.plan.auth import KEY_BYTES, generated_secret, generated_secret_name, needs_generated_secret
from pdfleet.operator.plan import kinds
from pdfleet.operator.reconcile.kube import ApiFailure, KubeClient

SECRET = kinds.SECRET
RECHECK_SECONDS = 600.0


class AuthSecrets:
    def __init__(self, client: KubeClient, *, clock: Callable[[], float] = time.monotonic,
                 keygen: Callable[[], bytes] = lambda: os.urandom(KEY_BYTES)) -> None:
        self._client = client
        self._clock = clock
        self._keygen = keygen
        self._confirmed: dict[tuple[str, str, str], float] = {}  # (namespace, fleet, uid) -> when
        self.created = 0

    async def ensure(self, namespace: str, fleet: str, spec: DisaggregatedInferenceSpec,
                     owner: Optional[Mapping[str, Any]]) -> Optional[str]:
        """None when the Secret the engines mount exists (or the user brings one), else the error."""
        if not needs_generated_secret(spec):
            return None
        key = (namespace, fleet, str((owner or {}).get("uid", "")))
        seen = self._confirmed.get(key)
        now = self._clock()
        if seen is not None and now - seen < RECHECK_SECONDS:
            return None
        body = generated_secret(fleet, namespace, self._keygen(), dict(owner) if owner else None)
        try:
            await self._client.create(SECRET, body)
            self.created += 1
        except ApiFailure as exc:
            if exc.status != 409:  # 409 AlreadyExists: created before (maybe by an earlier operator): keep it
                return f"create Secret {generated_secret_name(fleet)}: {exc.status or 'connection error'}"
        finally:
            body.clear()  # drop our only reference to the key
        self._confirmed[key] = now
        return None

    def forget(self, namespace: str, fleet: str) -> None:
        for k in [k for k in self._confirmed if k[:2] == (namespace, fleet)]:
            del self._confirmed[k]
