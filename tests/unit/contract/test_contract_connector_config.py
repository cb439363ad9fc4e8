"""The connector's extra config: the plan renders it, the connector parses it, one set of defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdfleet.connector.adapter.config import parse_adapter_config
from pdfleet.contract.connector_config import DEFAULTS, ConnectorConfigError, ConnectorExtraConfig
from pdfleet.operator.api import parse
from pdfleet.operator.api.types import KVTransferSpec
from pdfleet.operator.plan import plan

ROOT = Path(__file__).resolve().parents[3]


def test_the_api_defaults_are_the_connectors():
    api = KVTransferSpec()
    assert api.lease_seconds == DEFAULTS.lease_seconds == 120
    assert tuple(api.backends) == DEFAULTS.backends
    # what a connector configured with nothing but a key file runs with
    parsed = ConnectorExtraConfig.parse({"allow_unauthenticated": True})
    assert parsed == ConnectorExtraConfig(allow_unauthenticated=True)


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma"])
def test_what_the_plan_renders_the_connector_parses(example):
    cr = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    spec = parse(cr).spec
    (sts, *_) = [o for o in plan(cr) if o["kind"] == "StatefulSet"]
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    extra = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    parsed = ConnectorExtraConfig.parse(extra)
    assert parsed.lease_seconds == spec.kv_transfer.lease_seconds
    assert parsed.backends == tuple(spec.kv_transfer.backends)
    assert parsed.auth_secret_file and parsed.compat_extra.startswith("pdfleet-revision=")
    assert ConnectorExtraConfig.parse(parsed.to_extra()) == parsed


@pytest.mark.parametrize("extra, needle", [
    ({"lease_seconds": 0, "allow_unauthenticated": True}, "lease_seconds must be a number > 0"),
    ({"backends": [], "allow_unauthenticated": True}, "backends must be a non-empty list"),
    ({"handshake_retries": -1, "allow_unauthenticated": True}, "handshake_retries must be an integer >= 0"),
    ({"allow_unauthenticated": "yes"}, "allow_unauthenticated must be true or false"),
    ({}, "auth_secret_file is not set"),
    ({"leases": 3, "allow_unauthenticated": True}, "unknown keys ['leases']"),
])
def test_bad_extra_config_names_the_key(extra, needle):
    with pytest.raises(ConnectorConfigError, match=None) as err:
        ConnectorExtraConfig.parse(extra)
    assert needle in str(err.value)
    with pytest.raises(ConnectorConfigError):
        parse_adapter_config(extra, env={})


def test_the_adapter_takes_the_contracts_values():
    cfg = parse_adapter_config({"allow_unauthenticated": True, "lease_seconds": 7}, env={})
    assert cfg.lease_seconds == 7.0 and cfg.backends == DEFAULTS.backends and cfg.secret is None
