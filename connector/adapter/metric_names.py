"""The connector's exported counters (no vLLM import, so tools and tests read the names without
loading vLLM): derived from the typed counters in pdfleet.contract.connector_counters, where each
is declared once."""

from __future__ import annotations

from pdfleet.contract.connector_counters import COUNTERS, LAYOUT_KEY, METRIC_PREFIX, exported_name

__all__ = ["COUNTERS", "LAYOUT_KEY", "METRIC_PREFIX", "exported_name"]
