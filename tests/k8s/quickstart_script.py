"""Run one of docs/'s quickstart scripts as a user would (the k8s tier): skipped where a tool it calls or the
registry of the images is missing; PDFLEET_QUICKSTART_BUILD=1 has the script build and push them first."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(script: str, *, port_env: str, default_port: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """docs/<script> with REGISTRY from PDFLEET_QUICKSTART_REGISTRY and LOCAL_PORT from ``port_env``."""
    missing = [tool for tool in ("kubectl", "helm", "curl") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{script} needs {', '.join(missing)} on PATH")
    registry = os.environ.get("PDFLEET_QUICKSTART_REGISTRY")
    if not registry:
        pytest.skip("set PDFLEET_QUICKSTART_REGISTRY to where the images are (docs/quickstart.md step 1)")
    env = {**os.environ, "REGISTRY": registry, "BUILD_IMAGES": os.environ.get("PDFLEET_QUICKSTART_BUILD", "0"),
           "LOCAL_PORT": os.environ.get(port_env, default_port)}
    return subprocess.run(["bash", str(REPO / "docs" / script)], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
