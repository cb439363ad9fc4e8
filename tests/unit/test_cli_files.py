"""`pdfleet validate` / `render` on the files a GitOps folder holds: a fleet beside other kinds, `kind: List`."""

from __future__ import annotations

import tomllib

import pytest

from pdfleet.operator.commands.files import fleet_documents
from test_cli import ROOT, pdfleet  # noqa: E402

FLEET = (ROOT / "examples" / "tiny-cpu.yaml").read_text()
ROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: tiny-route}
spec: {parentRefs: [{name: gw}]}
"""
LIST = """
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Service, metadata: {name: extra}, spec: {ports: [{port: 80}]}}
  - apiVersion: pdfleet.io/v1alpha1
    kind: DisaggregatedInference
    metadata: {name: listed}
    spec: {model: {name: m}}
"""


def test_a_fleet_an_httproute_and_a_list_validate_with_notes() -> None:
    result = pdfleet("validate", "-f", "-", stdin="---".join([FLEET, ROUTE, LIST]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "-: valid"
    assert result.stderr.splitlines() == [
        "-: document 1: skipped HTTPRoute tiny-route (not a DisaggregatedInference)",
        "-: document 2 item 0: skipped Service extra (not a DisaggregatedInference)",
        "-: tiny: note: spec.model.name: pdfleet/tiny-llama is built on the spot by `pdfleet local`; engines in a "
        "cluster cannot download it (docs/quickstart.md runs a public model)",
    ]


def test_a_bad_fleet_inside_a_list_is_named() -> None:
    result = pdfleet("validate", "-f", "-", stdin=LIST.replace("{name: m}", "{name: m}, bogus: 1"))
    assert result.returncode == 1
    assert "-: listed: spec.bogus: unknown field" in result.stderr


def test_render_skips_other_kinds_and_reads_lists() -> None:
    result = pdfleet("render", "-f", "-", stdin="---".join([FLEET, ROUTE, LIST]))
    assert result.returncode == 0, result.stderr
    assert "name: tiny-router" in result.stdout and "name: listed-router" in result.stdout
    assert "tiny-route\n" not in result.stdout and "skipped HTTPRoute tiny-route" in result.stderr


# (documents, names read as fleets, notes): pure, no subprocess
TABLE = [
    ([{"kind": "DisaggregatedInference", "metadata": {"name": "a"}}], ["a"], 0),
    ([{"metadata": {"name": "nokind"}, "spec": {}}], ["nokind"], 0),  # read as a fleet: told it lacks nothing else
    ([{"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInferense"}], ["document 0"], 0),  # a typo: checked
    ([{"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInferenceScaler"}], [], 1),
    ([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}}], [], 1),
    ([{"kind": "List", "items": [{"kind": "ConfigMap"}, {"kind": "DisaggregatedInference"}]}], ["document 0 item 1"], 1),
    ([[1, 2]], ["document 0"], 0),  # not a mapping: checked, and refused
]


@pytest.mark.parametrize("docs,names,notes", TABLE)
def test_which_documents_are_fleets(docs, names, notes) -> None:
    fleets, said = fleet_documents(docs)
    assert ([n for n, _ in fleets], len(said)) == (names, notes)


def test_a_file_of_other_kinds_only_is_valid_and_says_so() -> None:
    result = pdfleet("validate", "-f", "-", stdin=ROUTE)
    assert (result.returncode, result.stdout.strip()) == (0, "-: valid (no DisaggregatedInference in it)")


def test_version_is_the_packages() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = pdfleet("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"pdfleet {version}")


def test_the_local_only_model_is_noted() -> None:
    """examples/tiny-cpu.yaml is valid, and validate says its model exists only under `pdfleet local`."""
    result = pdfleet("validate", "-f", str(ROOT / "examples" / "tiny-cpu.yaml"))
    assert result.returncode == 0 and "note: spec.model.name: pdfleet/tiny-llama is built on the spot" in result.stderr
    quick = pdfleet("validate", "-f", str(ROOT / "examples" / "quickstart-cpu.yaml"))
    assert (quick.returncode, quick.stderr) == (0, "")  # control: a public model, no note
