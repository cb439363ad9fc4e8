"""The import arrows point one way, and no product code reaches into kopf's internals.

Operator: plan (pure) <- kube (observed records, the client) <- autoscale <- rollout, reconcile_plan (the
decisions, pure: no client, HTTP, kopf or metrics registry) <- reconcile (the I/O edge); autoscale never
imports reconcile or reconcile_plan.
Connector: the transfer core knows nothing of vLLM (nor of the adapter over it, the router or the
operator); the router and the gateway's Endpoint Picker never import the adapter (what they share
with it lives in pdfleet.contract) nor vLLM; no connector code imports the operator; the contract
imports nothing of either half.
Read from the source with `ast`, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("operator", "connector", "contract")

PURE_DECISIONS = ("pdfleet.operator.reconcile", "pdfleet.operator.kube.client", "aiohttp", "kopf", "prometheus_client")
# package folder -> module prefixes it must never import
FORBIDDEN = {
    "operator/plan": ("pdfleet.operator.reconcile", "pdfleet.operator.reconcile_plan", "pdfleet.operator.rollout",
                      "pdfleet.operator.autoscale", "pdfleet.operator.kube"),
    "operator/kube": ("pdfleet.operator.reconcile", "pdfleet.operator.reconcile_plan", "pdfleet.operator.rollout",
                      "pdfleet.operator.autoscale"),
    "operator/autoscale": ("pdfleet.operator.reconcile", "pdfleet.operator.reconcile_plan"),
    # The decisions are pure: no client, no HTTP, no kopf, no metrics registry, nothing of the I/O edge.
    "operator/reconcile_plan": PURE_DECISIONS,
    "operator/rollout": PURE_DECISIONS + ("pdfleet.operator.reconcile_plan",),
    "connector/transfer": ("vllm", "pdfleet.connector.adapter", "pdfleet.connector.router",
                           "pdfleet.connector.serving", "pdfleet.connector.epp", "pdfleet.operator"),
    # The serving pipeline is shared by both front ends and imports neither; each front end only it.
    "connector/serving": ("vllm", "pdfleet.connector.adapter", "pdfleet.connector.router", "pdfleet.connector.epp",
                          "pdfleet.operator"),
    "connector/router": ("vllm", "pdfleet.connector.adapter", "pdfleet.connector.epp", "pdfleet.operator"),
    "connector/epp": ("vllm", "pdfleet.connector.adapter", "pdfleet.connector.router", "pdfleet.operator"),
    "connector/fabric": ("vllm", "pdfleet.connector.adapter", "pdfleet.connector.router",
                         "pdfleet.connector.serving", "pdfleet.connector.epp", "pdfleet.operator"),
    "connector/adapter": ("pdfleet.connector.router", "pdfleet.connector.serving", "pdfleet.connector.epp",
                          "pdfleet.operator"),
    "contract": ("vllm", "pdfleet.operator", "pdfleet.connector"),
}


def imported_modules(source: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return out


def violations(source: str, forbidden: tuple[str, ...]) -> list[str]:
    return [m for m in imported_modules(source) if any(m == f or m.startswith(f + ".") for f in forbidden)]


def private_kopf(source: str) -> list[str]:
    return [m for m in imported_modules(source) if m.startswith("kopf.") and m.split(".")[1].startswith("_")]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_import_arrows_point_one_way(folder: str) -> None:
    found = {str(p.relative_to(ROOT)): bad for p in sorted((ROOT / folder).rglob("*.py"))
             if (bad := violations(p.read_text(), FORBIDDEN[folder]))}
    assert not found, f"{folder} must not import {FORBIDDEN[folder]}: {found}"


def test_no_kopf_private_api_in_product_code() -> None:
    found = {str(p.relative_to(ROOT)): bad for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))
             if (bad := private_kopf(p.read_text()))}
    assert not found, f"kopf's private modules are used: {found}"


def test_the_checks_catch_what_they_look_for() -> None:
    """Negative control: the same checks flag an arrow back and a private kopf import, lazy ones too."""
    back = "def f():\n    from pdfleet.operator.reconcile.children import ChildRef\n"
    assert violations(back, FORBIDDEN["operator/autoscale"]) == [
        "pdfleet.operator.reconcile.children", "pdfleet.operator.reconcile.children.ChildRef"]
    assert violations("from pdfleet.operator import reconcile\n", FORBIDDEN["operator/autoscale"]) == [
        "pdfleet.operator.reconcile"]
    assert violations("from pdfleet.operator.kube.observed import ChildRef\n", FORBIDDEN["operator/autoscale"]) == []
    assert private_kopf("from kopf._cogs.clients import api\n") == ["kopf._cogs.clients", "kopf._cogs.clients.api"]
    assert private_kopf("import kopf\nkopf.ConnectionInfo\n") == []


@pytest.mark.parametrize("folder, source, caught", [
    ("connector/transfer", "import vllm\n", ["vllm"]),
    ("connector/transfer", "def f():\n    from vllm.config import VllmConfig\n", ["vllm.config", "vllm.config.VllmConfig"]),
    ("connector/transfer", "import numpy\n", []),
    ("connector/router", "from pdfleet.connector.adapter.params import MAX_ID_LEN\n",
     ["pdfleet.connector.adapter.params", "pdfleet.connector.adapter.params.MAX_ID_LEN"]),
    ("connector/router", "from pdfleet.contract.routing import MAX_ID_LEN\n", []),
    ("connector/epp", "from pdfleet.connector import adapter\n", ["pdfleet.connector.adapter"]),
    ("contract", "from pdfleet.connector.serving import canary\n",
     ["pdfleet.connector.serving", "pdfleet.connector.serving.canary"]),
    ("connector/epp", "from pdfleet.connector.router.app import ROUTER_KEY\n",
     ["pdfleet.connector.router.app", "pdfleet.connector.router.app.ROUTER_KEY"]),
    ("connector/serving", "from pdfleet.connector.epp import protocol\n",
     ["pdfleet.connector.epp", "pdfleet.connector.epp.protocol"]),
])
def test_the_connector_rules_catch_what_they_look_for(folder: str, source: str, caught: list[str]) -> None:
    """Negative controls: a test file that added `import vllm` to transfer/, or an adapter import to
    the router, would be flagged by the rule that guards its folder."""
    assert violations(source, FORBIDDEN[folder]) == caught


def loaded_io(module: str) -> list[str]:
    """The I/O modules importing ``module`` loads, directly or not (a fresh interpreter)."""
    code = (f"import sys, {module}\n"
            f"print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in {IO_TOPS!r} "
            f"or m.startswith({IO_PREFIXES!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONSAFEPATH": "1"}, check=True).stdout
    return sorted({m if m.startswith("pdfleet") else m.split(".")[0] for m in out.split()})


IO_TOPS = ("aiohttp", "kopf", "prometheus_client")
IO_PREFIXES = ("pdfleet.operator.kube.client", "pdfleet.operator.reconcile.")


def test_the_plan_loads_no_io_even_indirectly() -> None:
    """The rule above reads each file's own imports; this one follows them: the reconcile's plan and
    the paired rollout load no client, HTTP, kopf or metrics registry. Negative control: the
    reconciler, their edge, loads them."""
    assert loaded_io("pdfleet.operator.reconcile_plan.plan") == []
    assert loaded_io("pdfleet.operator.rollout.paired") == []
    edge = loaded_io("pdfleet.operator.reconcile.reconciler")
    assert {"aiohttp", "kopf", "pdfleet.operator.kube.client"} <= set(edge)


@pytest.mark.parametrize("folder, source, caught", [
    ("operator/reconcile_plan", "from pdfleet.operator.kube.client import KubeClient\n",
     ["pdfleet.operator.kube.client", "pdfleet.operator.kube.client.KubeClient"]),
    ("operator/reconcile_plan", "def f():\n    import aiohttp\n", ["aiohttp"]),
    ("operator/reconcile_plan", "import kopf\n", ["kopf"]),
    ("operator/reconcile_plan", "from pdfleet.operator.reconcile.canary import CanaryEdge\n",
     ["pdfleet.operator.reconcile.canary", "pdfleet.operator.reconcile.canary.CanaryEdge"]),
    ("operator/reconcile_plan", "from pdfleet.operator.kube.observed import ObservedPod\n", []),
    ("operator/rollout", "from pdfleet.operator.reconcile_plan import children\n",
     ["pdfleet.operator.reconcile_plan", "pdfleet.operator.reconcile_plan.children"]),
])
def test_the_decision_rules_catch_what_they_look_for(folder: str, source: str, caught: list[str]) -> None:
    """Negative controls: a client, HTTP or kopf import, or one of the reconcile's edge, added to the pure
    reconcile plan would be flagged; the observed records it reads are allowed."""
    assert violations(source, FORBIDDEN[folder]) == caught
