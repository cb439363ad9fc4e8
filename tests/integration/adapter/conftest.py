"""Fixtures for the adapter tests; the harness (real vLLM schedulers + worker connectors) is adapter_harness.py."""

from __future__ import annotations

import pytest

from pdfleet.operator.local.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def tiny_model() -> str:
    return str(ensure_tiny_model())
