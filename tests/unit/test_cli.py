"""The `pdfleet` command as a user runs it: a real subprocess, no cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def pdfleet(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdfleet.operator.cli", *args], input=stdin, capture_output=True, text=True, cwd=ROOT
    )


def test_validate_accepts_examples() -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        result = pdfleet("validate", "-f", str(example))
        assert result.returncode == 0, result.stderr
        assert "valid" in result.stdout


def test_validate_refuses_with_one_line_per_error() -> None:
    bad = """
apiVersion: pdfleet.io/v1alpha1
kind: DisaggregatedInference
metadata: {name: demo}
spec:
  model: {name: m}
  prefill: {replicas: -2}
  decode: {tensorParallelSize: 2, replica: 3}
"""
    result = pdfleet("validate", "-f", "-", stdin=bad)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert any("spec.prefill.replicas" in line for line in lines)
    assert any("spec.decode.replica: unknown field" in line for line in lines)


def test_validate_reports_unreadable_yaml() -> None:
    result = pdfleet("validate", "-f", "-", stdin="spec: [unclosed")
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("content, code, says", [
    # issue 20 row 9: these printed a traceback
    (b"apiVersion: pdfleet.io/v1alpha1\nkind: DisaggregatedInference\nmetadata: [1]\nspec: {model: {name: m}}\n",
     1, "document 0: metadata: Input should be a valid dictionary"),
    (b"\xff\xfe kind: x\n", 2, "not UTF-8 text: byte 0xff at offset 0"),
    (b"- 1\n- 2\n", 2, "document 0: not a resource: a YAML mapping is expected, got list"),
    (b"[" * 5000, 2, "not valid YAML"),
    (b"", 2, "no resource found"),
])
def test_validate_never_prints_a_traceback(tmp_path, content, code, says) -> None:
    path = tmp_path / "cr.yaml"
    path.write_bytes(content)
    result = pdfleet("validate", "-f", str(path))
    assert (result.returncode, "Traceback" in result.stderr) == (code, False), result.stderr
    assert says in result.stderr, result.stderr


def test_validate_names_a_missing_file() -> None:
    result = pdfleet("validate", "-f", "/nonexistent/cr.yaml")
    assert result.returncode == 2 and "No such file or directory" in result.stderr


def test_render_gpu_rdma_shows_what_the_issue_asks() -> None:
    result = pdfleet("render", "-f", str(ROOT / "examples" / "gpu-rdma.yaml"), "--namespace", "ml")
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    text = result.stdout
    assert "IPC_LOCK" in text and "rdma/ib: 1" in text and "fieldPath: status.podIP" in text
    headless = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    assert len(headless) == 2
    assert {d["metadata"]["namespace"] for d in docs} == {"ml"}
    assert result.stdout == pdfleet("render", "-f", str(ROOT / "examples" / "gpu-rdma.yaml"), "--namespace", "ml").stdout


def test_crd_command_prints_the_committed_crd() -> None:
    result = pdfleet("crd")
    assert result.returncode == 0
    assert result.stdout == (ROOT / "crds" / "pdfleet.io_disaggregatedinferences.yaml").read_text()


def test_unknown_subcommand_is_refused() -> None:
    result = pdfleet("frobnicate")
    assert result.returncode == 2 and "invalid choice" in result.stderr
