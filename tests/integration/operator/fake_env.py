"""The scenarios' driver over FakeKube (imported by conftest.py and the tests)."""

from __future__ import annotations

from typing import Any, Optional

from kube_fixture import FakeKube

from pdfleet.operator import api
from pdfleet.operator.reconcile.embedded import EmbeddedOperator

NAMESPACE = "team-a"


class FakeDriver:
    """The scenarios' view of FakeKube: the test writes over HTTP like kubectl would."""

    namespace = NAMESPACE

    def __init__(self, kube: FakeKube):
        self.kube = kube
        self.operator: Optional[EmbeddedOperator] = None

    async def create_cr(self, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self.kube.post(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NAMESPACE}/{api.PLURAL}", json=body)
        assert resp.status == 201, await resp.text()
        return await resp.json()

    async def patch_cr(self, name: str, patch: dict[str, Any]) -> None:
        resp = await self.kube.patch(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NAMESPACE}/{api.PLURAL}/{name}",
                                     json=patch, headers={"Content-Type": "application/merge-patch+json"})
        assert resp.status == 200, await resp.text()

    async def delete_cr(self, name: str) -> None:
        resp = await self.kube.delete(f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NAMESPACE}/{api.PLURAL}/{name}")
        assert resp.status == 200, await resp.text()

    async def get(self, resource: str, name: str) -> Optional[dict[str, Any]]:
        return self.kube.get(resource, NAMESPACE, name)

    async def list(self, resource: str, labels: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
        return self.kube.list(resource, NAMESPACE, labels)

    async def make_ready(self, kind: str, name: str, ready: Optional[int] = None) -> None:
        if kind == "StatefulSet":
            await self.kube.simulate_statefulset(NAMESPACE, name, ready=ready)
        elif kind == "LeaderWorkerSet":
            await self.kube.simulate_leaderworkerset(NAMESPACE, name, ready=ready)
        else:
            await self.kube.simulate_deployment(NAMESPACE, name, ready=ready)

    def operator_writes(self) -> float:
        return float(len(self.kube.writes()))

    def operator_runs(self) -> int:
        return int(self.operator.runtime["reconciler"].runs) if self.operator else 0
