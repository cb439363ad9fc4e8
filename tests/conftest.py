"""Test tiers: default (CI), `k8s` (a real cluster via KUBECONFIG), `gpu` (CUDA).

`k8s` and `gpu` tests are skipped, and reported as skipped, where their
hardware is absent; `-m k8s` / `-m gpu` selects them on a machine that has it.
"""

from __future__ import annotations

import os
import shutil

import pytest


def _has_cluster() -> bool:
    return bool(os.environ.get("KUBECONFIG")) or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs = {"k8s": (_has_cluster, "needs a Kubernetes cluster: set KUBECONFIG"), "gpu": (_has_gpu, "needs a CUDA GPU")}
    available: dict[str, bool] = {}
    for item in items:
        for marker, (probe, reason) in needs.items():
            if marker in item.keywords:
                if marker not in available:
                    available[marker] = probe()
                if not available[marker]:
                    item.add_marker(pytest.mark.skip(reason=reason))
