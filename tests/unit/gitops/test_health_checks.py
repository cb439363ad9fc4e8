"""The Argo CD health script (run in Lua 5.1, the dialect of Argo CD's gopher-lua) and the
Flux CEL health expressions of docs/gitops.md agree on the same sample resources.

Samples are built with the API's own status models, so a renamed status field
breaks these tests instead of leaving the health checks silently stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import celpy
import kubernetes_validate
import lupa.lua51
import pytest
import yaml

from pdfleet.operator.api.types import Condition, DisaggregatedInferenceStatus

REPO = Path(__file__).resolve().parents[3]
SCRIPT_PATH = REPO / "charts" / "pdfleet" / "files" / "argocd-health.lua"
SCRIPT = SCRIPT_PATH.read_text()
GITOPS_DOC = (REPO / "docs" / "gitops.md").read_text()
ARGO_KEY = "resource.customizations.health.pdfleet.io_DisaggregatedInference"
ARGO_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
# Argo CD health -> the kstatus-style result Flux reports.
FLUX_OF_ARGO = {"Healthy": "Current", "Progressing": "InProgress", "Degraded": "Failed"}


def cond(type_, status, reason, message="", generation=None):
    return Condition(type=type_, status=status, reason=reason, message=message, observed_generation=generation)


def resource(generation, status=None):
    obj = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
           "metadata": {"name": "llama", "namespace": "ml"}, "spec": {"model": {"name": "m"}}}
    if generation is not None:
        obj["metadata"]["generation"] = generation
    if status is not None:
        obj["status"] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return obj


def status(observed, *conditions):
    return DisaggregatedInferenceStatus(observed_generation=observed, conditions=list(conditions))


READY = cond("Ready", "True", "Ready", "revision abc: 2 prefill, 2 decode ready", 3)
COMPLETE = cond("Progressing", "False", "Complete", "", 3)
NOT_DEGRADED = cond("Degraded", "False", "AsExpected", "", 3)
INVALID = "spec.decode.tensorParallelSize: must be a multiple of spec.prefill.tensorParallelSize"

# name -> (resource, expected Argo CD health)
CASES = {
    "no status yet": (resource(1), "Progressing"),
    "status without conditions": (resource(1, status(1)), "Progressing"),
    "ready and complete": (resource(3, status(3, READY, COMPLETE, NOT_DEGRADED)), "Healthy"),
    "new spec not yet observed": (resource(4, status(3, READY, COMPLETE, NOT_DEGRADED)), "Progressing"),
    "serving while rolling out": (
        resource(3, status(3, cond("Ready", "True", "Serving", "", 3),
                           cond("Progressing", "True", "RollingOut", "revision def coming up", 3), NOT_DEGRADED)),
        "Progressing"),
    "waiting for pods": (
        resource(1, status(1, cond("Ready", "False", "Waiting", "waiting for ready pods: decode", 1),
                           cond("Progressing", "True", "Reconciling", "", 1), cond("Degraded", "False", "AsExpected", "", 1))),
        "Progressing"),
    "not ready, nothing in progress": (
        resource(2, status(2, cond("Ready", "False", "Waiting", "waiting for ready pods: prefill", 2),
                           cond("Progressing", "False", "Stalled", "", 2), cond("Degraded", "False", "AsExpected", "", 2))),
        "Progressing"),
    "invalid spec": (
        resource(2, status(2, cond("Ready", "False", "InvalidSpec", INVALID, 2),
                           cond("Progressing", "False", "InvalidSpec", "no child is changed until the spec is fixed", 2),
                           cond("Degraded", "True", "InvalidSpec", INVALID, 2))),
        "Degraded"),
    "invalid spec, Ready only": (
        resource(2, status(2, cond("Ready", "False", "InvalidSpec", INVALID, 2))), "Degraded"),
    "invalid spec of an older generation": (
        resource(5, status(4, cond("Ready", "False", "InvalidSpec", INVALID, 4),
                           cond("Degraded", "True", "InvalidSpec", INVALID, 4))),
        "Progressing"),
    "apply failed": (
        resource(3, status(3, cond("Ready", "False", "ApplyFailed", "statefulsets: 403 forbidden", 3),
                           cond("Progressing", "False", "Stalled", "", 3),
                           cond("Degraded", "True", "ApplyFailed", "statefulsets: 403 forbidden", 3))),
        "Degraded"),
    # issue 39: what the operator writes once spec.progressDeadlineSeconds passed (GitOps tools stop waiting)
    "progress deadline exceeded": (
        resource(2, status(2, cond("Ready", "False", "ImagePullBackOff", "waiting for ready pods: decode", 2),
                           cond("Progressing", "False", "ProgressDeadlineExceeded", "not complete 1800 s", 2),
                           cond("Degraded", "True", "ProgressDeadlineExceeded", "not complete 1800 s", 2))),
        "Degraded"),
    "waiting for a missing Secret": (
        resource(2, status(2, cond("Ready", "False", "SecretMissing", "Secret hf-token ... does not exist", 2),
                           cond("Progressing", "True", "SecretMissing", "Secret hf-token ... does not exist", 2),
                           cond("Degraded", "False", "AsExpected", "", 2))),
        "Progressing"),
    # issue 41: both roles at 0 by design (spec.scaling.scaleToZero) is healthy, not waiting
    "scaled to zero": (
        resource(3, status(3, cond("Ready", "True", "ScaledToZero", "prefill and decode are at 0 (idle)", 3),
                           COMPLETE, NOT_DEGRADED, cond("ScaledToZero", "True", "ScaledToZero", "", 3))),
        "Healthy"),
    "conditions carry no generation": (
        resource(3, status(3, cond("Ready", "True", "Ready"), cond("Progressing", "False", "Complete"))), "Healthy"),
}


def argo_health(obj, script=SCRIPT):
    lua = lupa.lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(script)
    return hs["status"], hs["message"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_argocd_health(case):
    obj, expected = CASES[case]
    health, message = argo_health(obj)
    assert health == expected
    assert health in ARGO_STATUSES
    assert isinstance(message, str) and message


def test_degraded_message_is_the_operators():
    _, message = argo_health(CASES["invalid spec"][0])
    assert message == INVALID


def test_progress_message_names_the_generation():
    _, message = argo_health(CASES["new spec not yet observed"][0])
    assert "4" in message


def test_a_script_without_the_generation_check_fails_the_table():
    # Negative control: drop the observedGeneration rule and the stale cases change verdict.
    rule = 'if generation ~= nil and (observed == nil or observed < generation) then'
    assert rule in SCRIPT
    broken = SCRIPT.replace(rule, "if false then")
    assert argo_health(CASES["new spec not yet observed"][0], broken)[0] == "Healthy"


def test_samples_are_valid_status_objects():
    for obj, _ in CASES.values():
        if "status" in obj:
            DisaggregatedInferenceStatus.model_validate(obj["status"])


# --- the documents ------------------------------------------------------------------

def yaml_blocks(markdown: str):
    for block in re.findall(r"```yaml\n(.*?)```", markdown, flags=re.S):
        yield yaml.safe_load(block)


def test_docs_show_the_chart_script_verbatim():
    (cm,) = [b for b in yaml_blocks(GITOPS_DOC) if b.get("kind") == "ConfigMap"]
    assert cm["metadata"] == {"name": "argocd-cm", "namespace": "argocd", "labels": cm["metadata"]["labels"]}
    assert cm["data"][ARGO_KEY] == SCRIPT
    kubernetes_validate.validate(cm, "1.33.0", strict=True)


def flux_exprs():
    (kustomization,) = [b for b in yaml_blocks(GITOPS_DOC) if b.get("kind") == "Kustomization"]
    (check,) = [c for c in kustomization["spec"]["healthCheckExprs"]
                if c["apiVersion"] == "pdfleet.io/v1alpha1" and c["kind"] == "DisaggregatedInference"]
    return check


def flux_health(obj, exprs):
    """Flux's order: inProgress, then failed, then current; nothing matching (or an error) keeps waiting."""
    env = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    for field, verdict in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if field not in exprs:
            continue
        result = env.program(env.compile(exprs[field])).evaluate(activation)
        if isinstance(result, celpy.celtypes.BoolType) and bool(result):
            return verdict
    return "InProgress"


@pytest.mark.parametrize("case", sorted(CASES))
def test_flux_expressions_agree_with_argocd(case):
    obj, expected = CASES[case]
    assert flux_health(obj, flux_exprs()) == FLUX_OF_ARGO[expected]


def test_flux_comparison_can_fail():
    # Negative control: without the generation rule, a stale Ready counts as Current.
    exprs = dict(flux_exprs())
    exprs["inProgress"] = "status.conditions.exists(c, c.type == 'Progressing' && c.status == 'True')"
    assert flux_health(CASES["new spec not yet observed"][0], exprs) == "Current"
