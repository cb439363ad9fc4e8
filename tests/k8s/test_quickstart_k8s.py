"""docs/quickstart.sh on a real cluster (marked k8s: skipped without KUBECONFIG): images, the operator with
Helm, the CPU fleet, a first answer through the router, cleanup. It needs what a user needs: kubectl and helm on
PATH, and the images in a registry the cluster pulls from (PDFLEET_QUICKSTART_REGISTRY; with
PDFLEET_QUICKSTART_BUILD=1 the script builds and pushes them there first, with docker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT_S = 60 * 60  # image pull, model download and CPU engines' start, with room


@pytest.mark.k8s
def test_the_quickstart_ends_in_an_answer() -> None:
    missing = [tool for tool in ("kubectl", "helm", "curl") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the quickstart needs {', '.join(missing)} on PATH")
    registry = os.environ.get("PDFLEET_QUICKSTART_REGISTRY")
    if not registry:
        pytest.skip("set PDFLEET_QUICKSTART_REGISTRY to where the images are (docs/quickstart.md step 1)")
    env = {**os.environ, "REGISTRY": registry, "BUILD_IMAGES": os.environ.get("PDFLEET_QUICKSTART_BUILD", "0"),
           "LOCAL_PORT": os.environ.get("PDFLEET_QUICKSTART_PORT", "18000")}
    result = subprocess.run(["bash", str(REPO / "docs" / "quickstart.sh")], env=env, capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    answer = next(line for line in result.stdout.splitlines() if line.startswith("{"))
    completion = json.loads(answer)
    assert completion["choices"][0]["text"].strip(), completion
    assert "== cleanup" in result.stdout
