"""The plan and the connector agree: every kv-transfer config the plan emits is one the
connector's own config parser accepts (a mismatch here stopped every engine once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdfleet.connector.adapter.config import ConfigError, parse_adapter_config
from pdfleet.operator.api import parse
from pdfleet.operator.plan import revision_of
from pdfleet.operator.plan.engine import vllm_args

ROOT = Path(__file__).resolve().parents[3]
ENV = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}


def kv_config(example: str, role: str, secret_file: str | None) -> dict:
    resource = parse(yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text()))
    args = vllm_args(resource.spec, role, revision_of(resource), secret_file=secret_file)
    return json.loads(args[args.index("--kv-transfer-config") + 1])


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_connector_accepts_what_the_plan_emits(example: str, role: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    config = kv_config(example, role, str(secret))
    adapter = parse_adapter_config(config["kv_connector_extra_config"], ENV)
    assert adapter.settings.compat_extra.startswith("pdfleet-revision=")
    assert adapter.settings.lease_seconds == config["kv_connector_extra_config"]["lease_seconds"]


def test_revision_reaches_the_compat_hash_input() -> None:
    tiny = kv_config("tiny-cpu", "decode", None)["kv_connector_extra_config"]["compat_extra"]
    gpu = kv_config("gpu-rdma", "decode", None)["kv_connector_extra_config"]["compat_extra"]
    assert tiny != gpu


def test_contract_check_can_fail() -> None:
    """Negative control: a key the connector does not know is refused, naming it."""
    config = kv_config("tiny-cpu", "prefill", None)["kv_connector_extra_config"]
    with pytest.raises(ConfigError, match="revision"):
        parse_adapter_config({**config, "revision": "x"}, ENV)
