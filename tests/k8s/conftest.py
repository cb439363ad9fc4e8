"""The operator scenarios against a real cluster (KUBECONFIG), marked `k8s`.

Each test gets a fresh namespace; the CRD from crds/ is applied once (server-side apply).
The operator runs in-process (its own thread and loop) and logs in through KUBECONFIG,
like `pdfleet operator` does outside a cluster. Pods cannot become ready without a real
model image, so scenarios that need ready pods are skipped here (the kmock tests cover them).
"""

from __future__ import annotations

import pathlib
import uuid
from typing import AsyncIterator

import aiohttp
import kopf
import pytest
import yaml


from k8s_env import K8sDriver, _session, apply_crd  # noqa: E402
from operator_scenarios import IMAGE  # noqa: E402

from pdfleet.operator.reconcile.embedded import EmbeddedOperator  # noqa: E402
from pdfleet.operator.reconcile.handlers import OperatorOptions  # noqa: E402
from pdfleet.operator.reconcile.reconciler import ReconcileOptions  # noqa: E402

CRD_FILE = pathlib.Path(__file__).resolve().parents[2] / "crds" / "pdfleet.io_disaggregatedinferences.yaml"


@pytest.fixture
async def k8s_http() -> AsyncIterator[aiohttp.ClientSession]:
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    assert info is not None, "KUBECONFIG is not readable"
    async with _session(info) as http:
        yield http


@pytest.fixture
async def k8s_namespace(k8s_http: aiohttp.ClientSession) -> AsyncIterator[str]:
    await apply_crd(k8s_http, yaml.safe_load(CRD_FILE.read_text()))
    name = f"pdfleet-test-{uuid.uuid4().hex[:8]}"
    async with k8s_http.post("api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}}) as resp:
        assert resp.status in (200, 201), await resp.text()
    try:
        yield name
    finally:
        async with k8s_http.delete(f"api/v1/namespaces/{name}") as resp:
            assert resp.status in (200, 202, 404)


@pytest.fixture
async def k8s_driver(k8s_http: aiohttp.ClientSession, k8s_namespace: str) -> AsyncIterator[K8sDriver]:
    driver = K8sDriver(k8s_http, k8s_namespace)
    options = OperatorOptions(reconcile=ReconcileOptions(default_image=IMAGE, drain_seconds=1.0),
                              watch_server_timeout=30, watch_client_timeout=45)
    driver.operator = EmbeddedOperator(options, namespaces=[k8s_namespace])
    await driver.operator.astart(timeout=60)
    try:
        yield driver
    finally:
        await driver.operator.astop()
        assert driver.operator.error is None, driver.operator.error


