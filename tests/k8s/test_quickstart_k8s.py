"""docs/quickstart.sh on a real cluster (marked k8s: skipped without KUBECONFIG): images, the operator with
Helm, the CPU fleet, a first answer through the router, cleanup. It needs what a user needs: kubectl and helm on
PATH, and the images in a registry the cluster pulls from (PDFLEET_QUICKSTART_REGISTRY; with
PDFLEET_QUICKSTART_BUILD=1 the script builds and pushes them there first, with docker)."""

from __future__ import annotations

import json

import pytest

from quickstart_script import run_script

SCRIPT_TIMEOUT_S = 60 * 60  # image pull, model download and CPU engines' start, with room


@pytest.mark.k8s
def test_the_quickstart_ends_in_an_answer() -> None:
    result = run_script("quickstart.sh", port_env="PDFLEET_QUICKSTART_PORT", default_port="18000",
                        timeout_s=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    answer = next(line for line in result.stdout.splitlines() if line.startswith("{"))
    completion = json.loads(answer)
    assert completion["choices"][0]["text"].strip(), completion
    assert "== cleanup" in result.stdout
