"""`pdfleet local` refuses bad resources before starting anything, naming the field."""

from __future__ import annotations

import textwrap

import pytest

from pdfleet.operator.cli import main
from pdfleet.operator.local.smoke import format_transfer_stats, parse_metric_lines, tokens_by_source

GOOD = textwrap.dedent("""
    apiVersion: pdfleet.io/v1alpha1
    kind: DisaggregatedInference
    metadata: {name: tiny}
    spec:
      model: {name: pdfleet/tiny-llama, dtype: float32}
      engine: {blockSize: 32}
      kvTransfer: {bufferDevice: cpu}
""")


def run_local(tmp_path, text, *extra):
    cr = tmp_path / "cr.yaml"
    cr.write_text(text)
    return main(["local", "-f", str(cr), "--run-dir", str(tmp_path / "run"), *extra])


@pytest.mark.parametrize("change, field", [
    (("blockSize: 32", "blockSize: 32, port: 0"), "spec.engine.port"),
    (("dtype: float32", "dtype: float64"), "spec.model.dtype"),
    (("kvTransfer: {bufferDevice: cpu}", "kvTransfer: {bufferDevice: cpu, leaseSecs: 3}"), "spec.kvTransfer.leaseSecs"),
    (("model: {name: pdfleet/tiny-llama, dtype: float32}", "model: {dtype: float32}"), "spec.model.name"),
])
def test_invalid_resource_exits_1_naming_the_field(tmp_path, capsys, change, field):
    assert run_local(tmp_path, GOOD.replace(*change)) == 1
    err = capsys.readouterr().err
    assert f"{field}:" in err and err.startswith("error: ")
    assert not (tmp_path / "run").exists()  # nothing was started


def test_cpu_only_needs_are_field_errors_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pdfleet.operator.local.command.has_gpu", lambda: False)
    text = GOOD.replace("blockSize: 32", "blockSize: 16").replace("bufferDevice: cpu", "bufferDevice: cuda")
    assert run_local(tmp_path, text) == 1
    err = capsys.readouterr().err
    assert "spec.engine.blockSize: CPU engines need a multiple of 32" in err
    assert "spec.kvTransfer.bufferDevice: 'cuda' needs a GPU" in err


def test_unreadable_and_non_yaml_files(tmp_path, capsys):
    assert main(["local", "-f", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert run_local(tmp_path, "spec: [unclosed") == 1
    assert "not valid YAML" in capsys.readouterr().err
    assert run_local(tmp_path, GOOD + "---\n" + GOOD) == 1
    assert "exactly one" in capsys.readouterr().err


def test_bad_router_port(tmp_path, capsys):
    assert run_local(tmp_path, GOOD, "--router-port", "70000") == 1
    assert "--router-port" in capsys.readouterr().err


METRICS = """\
# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 26.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 256.0
vllm:prompt_tokens_by_source_created{engine="0",model_name="m",source="external_kv_transfer"} 1.7e9
vllm:pdfleet_connector_pull_bytes_total{engine="0"} 5242880.0
"""


def test_transfer_figures_from_metrics():
    assert tokens_by_source(METRICS) == {"local_compute": 26.0, "external_kv_transfer": 256.0}
    assert parse_metric_lines(METRICS, ("vllm:pdfleet_",)) == [
        ('vllm:pdfleet_connector_pull_bytes_total{engine="0"}', 5242880.0)]
    lines = format_transfer_stats([("decode-0", "decode", METRICS), ("prefill-0", "prefill", None)], None)
    assert lines[0] == "decode-0 prompt tokens by source: external_kv_transfer=256, local_compute=26"
    assert 'decode-0 vllm:pdfleet_connector_pull_bytes_total{engine="0"} 5.24288e+06' in lines
    assert lines[-1] == "prefill-0: /metrics unavailable"


def _planned_runner(tmp_path, text: str, run: str):
    import argparse
    import json
    import stat

    import yaml

    from pdfleet.operator.api import parse
    from pdfleet.operator.local.command import add_arguments
    from pdfleet.operator.local.runner import LocalRunner

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    run_dir = tmp_path / run
    run_dir.mkdir()
    runner = LocalRunner(parse(yaml.safe_load(text)), ap.parse_args(["-f", "x", "--run-dir", str(run_dir)]))
    runner._plan("/models/tiny")
    launch = next(iter(runner.launches.values()))
    kv = json.loads(launch.argv[launch.argv.index("--kv-transfer-config") + 1])
    path = kv["kv_connector_extra_config"]["auth_secret_file"]
    assert stat.S_IMODE((run_dir / "side-channel-secret").stat().st_mode) == 0o600
    return path, {json.loads(a[a.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]["auth_secret_file"]
                  for a in (lch.argv for lch in runner.launches.values())}


def test_local_generates_a_key_per_run_and_every_engine_uses_it(tmp_path):
    """Secure by default like the operator: without authSecretRef, each run signs with its own new key."""
    from pathlib import Path

    first, files1 = _planned_runner(tmp_path, GOOD, "run1")
    second, _ = _planned_runner(tmp_path, GOOD, "run2")
    assert files1 == {first} and Path(first).parent.name == "run1"  # prefill and decode share one key
    k1, k2 = Path(first).read_text(), Path(second).read_text()
    assert len(k1) == 64 and k1 != k2
    from pdfleet.connector.adapter.config import parse_adapter_config

    assert parse_adapter_config({"auth_secret_file": first}, env={}).secret == k1.encode()
