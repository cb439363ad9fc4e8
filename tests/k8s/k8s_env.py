"""The scenarios' driver over a real cluster (imported by conftest.py and the tests)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Optional

import aiohttp
import kopf
import pytest

from pdfleet.operator import api
from pdfleet.operator.reconcile.embedded import EmbeddedOperator


def _session(info: kopf.ConnectionInfo) -> aiohttp.ClientSession:
    context: Any = None
    if info.server.startswith("https"):
        context = ssl.create_default_context(cafile=info.ca_path) if info.ca_path else ssl.create_default_context()
        if info.ca_data:
            import base64
            context.load_verify_locations(cadata=base64.b64decode(info.ca_data).decode())
        if info.insecure:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if info.certificate_path or info.certificate_data:
            import base64
            import tempfile
            cert, key = info.certificate_path, info.private_key_path
            if info.certificate_data:
                f = tempfile.NamedTemporaryFile(delete=False)
                f.write(base64.b64decode(info.certificate_data))
                f.close()
                cert = f.name
            if info.private_key_data:
                f = tempfile.NamedTemporaryFile(delete=False)
                f.write(base64.b64decode(info.private_key_data))
                f.close()
                key = f.name
            context.load_cert_chain(cert, key)
    headers = {"User-Agent": "pdfleet-k8s-tests"}
    if info.token:
        headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
    auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
    return aiohttp.ClientSession(base_url=info.server.rstrip("/") + "/", headers=headers, auth=auth,
                                 connector=aiohttp.TCPConnector(ssl=context) if context else None)


async def apply_crd(http: aiohttp.ClientSession, crd: dict[str, Any]) -> bool:
    """Server-side apply a CRD; True once the API server reports it Established (10 s at most)."""
    url = f"apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    async with http.patch(url + "?fieldManager=pdfleet-tests&force=true", json=crd,
                          headers={"Content-Type": "application/apply-patch+yaml"}) as resp:
        assert resp.status in (200, 201), await resp.text()
    for _ in range(100):
        async with http.get(url) as r:
            conds = (await r.json()).get("status", {}).get("conditions", [])
        if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            return True
        await asyncio.sleep(0.1)
    return False


def _path(resource: str, namespace: Optional[str], name: Optional[str] = None) -> str:
    parts = resource.split("/")
    group_version, plural = "/".join(parts[:-1]), parts[-1]
    root = f"api/{group_version}" if group_version == "v1" else f"apis/{group_version}"
    out = f"{root}/namespaces/{namespace}/{plural}" if namespace else f"{root}/{plural}"
    return f"{out}/{name}" if name else out


class K8sDriver:
    def __init__(self, http: aiohttp.ClientSession, namespace: str):
        self.http = http
        self.namespace = namespace
        self.operator: Optional[EmbeddedOperator] = None

    async def _json(self, resp: aiohttp.ClientResponse, ok: tuple[int, ...] = (200, 201)) -> Any:
        async with resp:
            if resp.status not in ok:
                raise AssertionError(f"{resp.method} {resp.url}: {resp.status} {await resp.text()}")
            return await resp.json()

    async def create_cr(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json(await self.http.post(_path(f"{api.GROUP}/{api.VERSION}/{api.PLURAL}", self.namespace),
                                                     json=body))

    async def patch_cr(self, name: str, patch: dict[str, Any]) -> None:
        await self._json(await self.http.patch(_path(f"{api.GROUP}/{api.VERSION}/{api.PLURAL}", self.namespace, name),
                                               json=patch, headers={"Content-Type": "application/merge-patch+json"}))

    async def delete_cr(self, name: str) -> None:
        await self._json(await self.http.delete(_path(f"{api.GROUP}/{api.VERSION}/{api.PLURAL}", self.namespace, name)),
                         ok=(200, 202))

    async def get(self, resource: str, name: str) -> Optional[dict[str, Any]]:
        async with self.http.get(_path(resource, self.namespace, name)) as resp:
            return None if resp.status == 404 else await self._json(resp)

    async def list(self, resource: str, labels: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else {}
        data = await self._json(await self.http.get(_path(resource, self.namespace), params=params))
        return data["items"]

    async def make_ready(self, kind: str, name: str, ready: Optional[int] = None) -> None:
        pytest.skip("pods of a fleet need a real model image to become ready; covered by the kmock tests")

    def operator_writes(self) -> float:
        metrics = self.operator.runtime["metrics"] if self.operator else None
        return metrics.count("pdfleet_operator_api_writes_total") if metrics else 0.0

    def operator_runs(self) -> int:
        return int(self.operator.runtime["reconciler"].runs) if self.operator else 0
