"""docs/quickstart-gateway.sh on a real cluster (marked k8s: skipped without KUBECONFIG): the operator, the GAIE
CRD, Envoy Gateway with Envoy AI Gateway, the CPU fleet behind an InferencePool, the HTTPRoute, the picker's caller
token through an EnvoyPatchPolicy, answers through the Gateway, cleanup. It needs what a user needs: kubectl, helm
and curl on PATH, the images in a registry the cluster pulls from (PDFLEET_QUICKSTART_REGISTRY; with
PDFLEET_QUICKSTART_BUILD=1 the script builds and pushes them first), and a cluster that can pull Envoy Gateway's
and Envoy AI Gateway's charts and images."""

from __future__ import annotations

import json

import pytest

from quickstart_script import run_script

SCRIPT_TIMEOUT_S = 75 * 60  # the quickstart's hour, plus the gateway's install


@pytest.mark.k8s
def test_the_gateway_walkthrough_ends_in_answers() -> None:
    result = run_script("quickstart-gateway.sh", port_env="PDFLEET_QUICKSTART_GATEWAY_PORT", default_port="18080",
                        timeout_s=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    completion, chat = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")][-2:]
    assert completion["choices"][0]["text"].strip(), completion
    assert chat["choices"][0]["message"]["content"].strip(), chat
    assert "unserved route: 404" in result.stdout
    assert "== cleanup" in result.stdout
