"""Fixtures for the adapter tests; the harness (real vLLM schedulers + worker connectors) is adapter_harness.py."""

from __future__ import annotations

import pytest

from pdfleet.operator.local.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def tiny_model() -> str:
    return str(ensure_tiny_model())


@pytest.fixture(autouse=True)
def short_source_linger(monkeypatch):
    """A closing prefill worker keeps answering for up to 4 s while leases are held (a drain's last
    acks); these tests close sides with leases left on purpose and test no drain, so 0.2 s will do."""
    from pdfleet.connector.adapter import worker as worker_mod
    monkeypatch.setattr(worker_mod, "SOURCE_LINGER_SECONDS", 0.2)
