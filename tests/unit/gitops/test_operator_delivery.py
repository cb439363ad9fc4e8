"""docs/gitops.md delivers the operator itself (issue 39 part 1): the chart packaged and pushed as an OCI
artifact, an Argo CD Application and a Flux OCIRepository + HelmRelease for it. The YAML the doc shows is held
to the chart: the artifact's name and version are Chart.yaml's, the values are keys the chart's schema accepts,
and the install names the namespace every other doc uses."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "gitops.md").read_text()
CHART = yaml.safe_load((REPO / "charts" / "pdfleet" / "Chart.yaml").read_text())
SCHEMA = json.loads((REPO / "charts" / "pdfleet" / "values.schema.json").read_text())


def blocks(kind: str) -> list[dict[str, Any]]:
    docs = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S)]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]


def test_the_package_and_push_commands_name_the_charts_artifact() -> None:
    tgz = f"{CHART['name']}-{CHART['version']}.tgz"
    assert "helm package charts/pdfleet" in DOC
    (push,) = re.findall(rf"helm push {re.escape(tgz)} (oci://\S+)", DOC)
    (oci,) = blocks("OCIRepository")
    assert oci["spec"]["url"] == f"{push}/{CHART['name']}" and oci["spec"]["ref"]["tag"] == CHART["version"]
    assert oci["spec"]["layerSelector"]["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


def test_the_argo_cd_application_installs_this_chart() -> None:
    (app,) = blocks("Application")
    source = app["spec"]["source"]
    (oci,) = blocks("OCIRepository")
    assert f"oci://{source['repoURL']}/{source['chart']}" == oci["spec"]["url"]
    assert (source["chart"], source["targetRevision"]) == (CHART["name"], CHART["version"])
    assert app["spec"]["destination"]["namespace"] == "pdfleet-system"
    assert {"CreateNamespace=true", "ServerSideApply=true"} <= set(app["spec"]["syncPolicy"]["syncOptions"])
    jsonschema.validate(source["helm"]["valuesObject"], SCHEMA)


def test_the_flux_helm_release_installs_this_chart() -> None:
    (release,) = blocks("HelmRelease")
    (oci,) = blocks("OCIRepository")
    spec = release["spec"]
    assert spec["chartRef"] == {"kind": "OCIRepository", "name": oci["metadata"]["name"]}
    assert release["metadata"]["namespace"] == oci["metadata"]["namespace"]
    assert spec["targetNamespace"] == "pdfleet-system"
    assert spec["install"]["crds"] == spec["upgrade"]["crds"] == "CreateReplace"
    jsonschema.validate(spec["values"], SCHEMA)
    (kustomization,) = blocks("Kustomization")  # the fleets wait for this release
    assert {"name": release["metadata"]["name"]} in kustomization["spec"]["dependsOn"]


@pytest.mark.parametrize("path", [("image", "repositry"), ("runtimeImage", "repo")])
def test_a_misspelt_value_would_be_caught(path) -> None:
    """Negative control: the schema check refuses a value key the chart does not have."""
    (release,) = blocks("HelmRelease")
    values = copy.deepcopy(release["spec"]["values"])
    values[path[0]][path[1]] = values[path[0]].pop("repository")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, SCHEMA)
