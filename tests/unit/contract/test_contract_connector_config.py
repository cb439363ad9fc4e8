"""The connector's extra config: the plan renders it, the connector parses it, one set of defaults."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from pdfleet.connector.adapter.config import AdapterConfig, parse_adapter_config
from pdfleet.contract.connector_config import DEFAULTS, GPU_NIXL_THREADS, ConnectorConfigError, ConnectorExtraConfig
from pdfleet.operator.api import parse
from pdfleet.operator.api.types import KVTransferSpec
from pdfleet.operator.plan import plan
from pdfleet.operator.plan.engine import kv_transfer_config

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
    ({"nixl_threads": -1, "allow_unauthenticated": True}, "nixl_threads must be an integer in [0, 64]"),
    ({"nixl_threads": 65, "allow_unauthenticated": True}, "nixl_threads must be an integer in [0, 64]"),
    ({"nixl_threads": True, "allow_unauthenticated": True}, "nixl_threads must be an integer in [0, 64]"),
    ({"nixl_threads": 2.0, "allow_unauthenticated": True}, "nixl_threads must be an integer in [0, 64]"),
    ({"nixl_split_batch": 0, "allow_unauthenticated": True}, "nixl_split_batch must be an integer in [1, 4096]"),
])
def test_bad_extra_config_names_the_key(extra, needle):
    with pytest.raises(ConnectorConfigError, match=None) as err:
        ConnectorExtraConfig.parse(extra)
    assert needle in str(err.value)
    with pytest.raises(ConnectorConfigError):
        parse_adapter_config(extra, env={})


def test_the_adapter_takes_the_contracts_values():
    cfg = parse_adapter_config({"allow_unauthenticated": True, "lease_seconds": 7}, env={})
    assert cfg.settings.lease_seconds == 7.0 and cfg.settings.backends == DEFAULTS.backends and cfg.secret is None
    # The adapter holds the contract's object as parsed, and copies none of its fields.
    assert cfg.settings == ConnectorExtraConfig.parse({"allow_unauthenticated": True, "lease_seconds": 7})
    assert {f.name for f in fields(AdapterConfig)} & {f.name for f in fields(ConnectorExtraConfig)} == set()


@pytest.mark.parametrize("buffer, requested, rendered", [
    ("cuda", None, GPU_NIXL_THREADS),  # measured default for GPU reads (bench part l)
    ("cpu", None, None),  # DRAM fleets: not rendered, the connector's default (0) applies
    ("cuda", 0, None),  # the user's 0 wins and, being the default, is not rendered
    ("cpu", 2, 2),
])
def test_decode_gets_the_nixl_threads_the_spec_asks_for(buffer, requested, rendered):
    kv = {"bufferDevice": buffer} | ({} if requested is None else {"nixlThreads": requested})
    cr = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
          "spec": {"model": {"name": "m"}, "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                   "kvTransfer": kv}}
    extra = kv_transfer_config(parse(cr).spec, "decode", "r1")["kv_connector_extra_config"]
    assert extra.get("nixl_threads") == rendered
    cfg = parse_adapter_config(extra | {"allow_unauthenticated": True, "auth_secret_file": None}, env={})
    assert cfg.settings.nixl_threads == (rendered or 0) and cfg.settings.nixl_split_batch == DEFAULTS.nixl_split_batch


def test_an_api_nixl_threads_out_of_range_is_refused_naming_the_field():
    cr = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
          "spec": {"model": {"name": "m"}, "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                   "kvTransfer": {"nixlThreads": 65}}}
    with pytest.raises(Exception) as err:
        parse(cr)
    assert "nixlThreads" in str(err.value)
