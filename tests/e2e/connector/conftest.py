"""Fixtures for the connector end-to-end tests; server helpers live in vllm_servers.py."""

from __future__ import annotations

import pytest

from pdfleet.operator.local.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    return str(ensure_tiny_model())
