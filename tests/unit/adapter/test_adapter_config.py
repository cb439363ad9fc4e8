"""The connector's settings as the adapter reads them: the contract's extra config, the side channel's
address from the environment and the key file (pure + a file read, no vLLM engine)."""

from __future__ import annotations

import pytest

from pdfleet.connector.adapter.config import ConfigError, parse_adapter_config


def test_config_defaults_and_loopback_fallback(tmp_path):
    cfg = parse_adapter_config({"allow_unauthenticated": True}, env={})
    assert cfg.side_channel_host == "127.0.0.1" and cfg.side_channel_port == 5600
    assert cfg.secret is None and cfg.settings.backends == ("UCX",)
    secret = tmp_path / "s"
    secret.write_bytes(b"0123456789abcdef-secret\n")
    cfg = parse_adapter_config(
        {"lease_seconds": 5, "auth_secret_file": str(secret), "handshake_timeout": 1.5},
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3", "VLLM_NIXL_SIDE_CHANNEL_PORT": "7000"},
    )
    assert (cfg.side_channel_host, cfg.side_channel_port, cfg.settings.lease_seconds) == ("10.1.2.3", 7000, 5.0)
    assert cfg.secret == b"0123456789abcdef-secret" and cfg.settings.handshake_timeout == 1.5


OPEN = {"allow_unauthenticated": True}


@pytest.mark.parametrize(
    "extra, env, needle",
    [
        (OPEN, {"VLLM_NIXL_SIDE_CHANNEL_HOST": "0.0.0.0"}, "wildcard"),
        (OPEN, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}, "VLLM_NIXL_SIDE_CHANNEL_PORT"),
        ({"lease_seconds": 0, **OPEN}, {}, "lease_seconds"),
        ({"backends": [], **OPEN}, {}, "backends"),
        # secure by default: no key file and no explicit opt-out
        ({}, {}, "auth_secret_file is not set"),
        ({"allow_unauthenticated": "yes"}, {}, "allow_unauthenticated must be true or false"),
        ({"auth_secret_file": "/nonexistent/secret"}, {}, "auth_secret_file"),
        ({"secret": "inline"}, {}, "unknown keys"),
        ({"handshake_retries": -1}, {}, "handshake_retries"),
        ({"read_floor_bandwidth": 0, **OPEN}, {}, "read_floor_bandwidth must be a number > 0"),
        ({"read_timeout_floor": "5", **OPEN}, {}, "read_timeout_floor must be a number > 0"),
    ],
)
def test_config_errors(extra, env, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_adapter_config(extra, env=env)


def test_short_secret_is_refused(tmp_path):
    f = tmp_path / "s"
    f.write_bytes(b"short")
    with pytest.raises(ConfigError, match="16"):
        parse_adapter_config({"auth_secret_file": str(f)}, env={})

def test_read_bounds_are_configurable():
    cfg = parse_adapter_config({"read_floor_bandwidth": 1e8, "read_timeout_floor": 2, **OPEN}, env={})
    assert (cfg.settings.read_floor_bandwidth, cfg.settings.read_timeout_floor) == (1e8, 2.0)
    assert (parse_adapter_config(OPEN, env={}).settings.read_floor_bandwidth,
            parse_adapter_config(OPEN, env={}).settings.read_timeout_floor) == (50e6, 5.0)
