"""The connector's typed counters: each declared once, exported under the names dashboards and docs use."""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from pdfleet.contract.connector_counters import (
    COUNTERS, METRIC_PREFIX, AdapterCounters, SinkCounters, SourceCounters, exported_name,
)

ROOT = Path(__file__).resolve().parents[3]
# Families exported besides the per-key counters (stats.py): pulls by layout, and the fabric's info gauge.
OTHER_FAMILIES = {"pulls_by_layout", "kv_transport_info"}


def _count_names() -> set[str]:
    """Every counter name pull_state's actions name (``Count("...")``)."""
    tree = ast.parse((ROOT / "connector/transfer/pull_state.py").read_text())
    return {n.args[0].value for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Count"
            and n.args and isinstance(n.args[0], ast.Constant)}


def test_every_count_of_the_pull_state_machine_is_a_sink_counter():
    names = _count_names()
    assert {"expired_leases", "heartbeat_retries", "reads_timed_out"} <= names
    sink = {f.name for f in fields(SinkCounters)}
    assert names <= sink
    assert "expired_lease" not in sink  # negative control: a misspelt Count would fail the line above


def test_exported_names_are_unique_and_dashboards_docs_and_tests_name_only_exported_ones():
    exported = {name for name, _ in COUNTERS.values()}
    assert len(exported) == len(COUNTERS) == 35
    assert exported_name("bytes") == "vllm:pdfleet_connector_pull_bytes"
    assert exported_name("notifs_rejected") == "vllm:pdfleet_connector_notifications_rejected"
    used: set[str] = set()
    for folder in ("charts", "docs", "tests", "operator", "bench"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".json", ".yaml", ".yml", ".tpl") and path.is_file():
                used |= set(re.findall(re.escape(METRIC_PREFIX) + r"([a-z_]+?)(?:_total)?\b", path.read_text()))
    assert "pull_bytes" in used and "handshakes_rejected" in used
    # names the docs list as replaced, or that a test shows to be missing on purpose
    legacy = {"expired_leases"}
    assert used - exported - OTHER_FAMILIES - legacy == set()


@pytest.mark.parametrize("cls, shared", [
    (SinkCounters, {"handshakes", "heartbeats", "messages_rejected", "failures"}),
    (SourceCounters, {"handshakes", "heartbeats", "messages_rejected"}),
    (AdapterCounters, {"failures"}),
])
def test_shared_counters_come_from_one_base(cls, shared):
    counts = cls()
    assert shared <= set(asdict(counts))
    assert all(v == 0.0 for v in asdict(counts).values())
