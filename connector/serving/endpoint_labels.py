"""The name an endpoint's metric series carry: ``<role>-<n>``, never its URL (pure).

/metrics is scraped by anyone who can reach the router, and an engine's URL is its pod IP
(issue 20 row 8). Each endpoint gets the smallest ordinal of its role that no other
known endpoint holds, the first time it is seen (new endpoints in URL order, so a static
``--prefill a --prefill b`` list gives ``prefill-0``, ``prefill-1``). An ordinal stays with
its endpoint while the endpoint is known or still has legs in flight, and is reused after
that, so the label set stays as small as the fleet however often pods (and IPs) churn.

Ordinals are this router's: two router replicas may name one pod differently, so sum
across routers by ``role``, not by ``endpoint``. An endpoint listed under both roles
(one kv_both engine) keeps the name of the role it was first seen under.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

__all__ = ["EndpointLabels", "UNKNOWN"]

UNKNOWN = "unknown"  # an endpoint the router does not know (never an address)


class EndpointLabels:
    def __init__(self) -> None:
        self._names: dict[str, str] = {}  # url -> name

    def __call__(self, url: str) -> str:
        return self._names.get(url, UNKNOWN)

    def update(self, known: Mapping[str, str], keep: Collection[str] = ()) -> dict[str, str]:
        """``known``: url -> role of every endpoint known now; ``keep``: urls that keep their
        name although no longer known (legs in flight). Returns the names freed (url -> name)."""
        freed = {u: n for u, n in self._names.items() if u not in known and u not in keep}
        for u in freed:
            del self._names[u]
        taken: dict[str, set[int]] = {}
        for name in self._names.values():
            role, _, n = name.rpartition("-")
            taken.setdefault(role, set()).add(int(n))
        for url in sorted(u for u in known if u not in self._names):
            role = known[url]
            used = taken.setdefault(role, set())
            n = next(i for i in range(len(used) + 1) if i not in used)
            used.add(n)
            self._names[url] = f"{role}-{n}"
        return freed

    def names(self) -> dict[str, str]:
        return dict(self._names)
