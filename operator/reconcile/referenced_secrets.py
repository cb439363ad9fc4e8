"""Reads the Secrets a fleet's spec names, before its pods are made (the I/O edge of
reconcile_plan/secret_refs.py; issue 39).

A GET of each Secret named by ``kvTransfer.authSecretRef`` or ``model.source.hf.tokenSecretRef``, in the
fleet's namespace only: the same ``get`` on secrets the operator holds for its generated Secrets (never
list or watch). Only the key names are kept; the values are dropped at once, never logged, stored or put
in status. A Secret confirmed with its key is not read again for RECHECK_SECONDS, so a resync with
nothing changed reads nothing; a missing one is read at each reconcile (retried with backoff).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

from pdfleet.operator.kube.client import ApiFailure, KubeClient
from pdfleet.operator.reconcile_plan.secret_refs import ABSENT, UNREADABLE, SecretRef, Seen

logger = logging.getLogger("pdfleet.operator")
RECHECK_SECONDS = 600.0


class ReferencedSecrets:
    def __init__(self, client: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._confirmed: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}  # (namespace, name) -> when, keys

    async def check(self, namespace: str, refs: Sequence[SecretRef]) -> dict[str, Seen]:
        """name -> its key names, ABSENT or UNREADABLE, for each Secret ``refs`` name."""
        out: dict[str, Seen] = {}
        now = self._clock()
        for name in sorted({r.name for r in refs}):
            wanted = {r.key for r in refs if r.name == name}
            when, keys = self._confirmed.get((namespace, name), (None, frozenset()))
            if when is not None and now - when < RECHECK_SECONDS and wanted <= keys:
                out[name] = keys
                continue
            out[name] = await self._read(namespace, name)
            seen = out[name]
            if isinstance(seen, frozenset) and wanted <= seen:
                self._confirmed[(namespace, name)] = (now, seen)
        return out

    async def _read(self, namespace: str, name: str) -> Seen:
        try:
            keys = await self._client.get_secret_keys(namespace, name)
        except ApiFailure as exc:  # e.g. 403 where get on secrets was taken away: the pods will say
            logger.warning("cannot read Secret %s/%s to check it: %s", namespace, name, exc)
            return UNREADABLE
        return ABSENT if keys is None else keys

    def forget(self, namespace: str) -> None:
        for k in [k for k in self._confirmed if k[0] == namespace]:
            del self._confirmed[k]
