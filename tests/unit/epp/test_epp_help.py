"""`pdfleet epp --help` says what --port is on the EPP: its /health and /metrics port, 9090 as rendered."""

from __future__ import annotations

import argparse

from pdfleet.connector.epp import command
from pdfleet.contract.gateway import EPP_METRICS


def test_port_is_the_health_and_metrics_port_by_default() -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert parser.parse_args([]).port == EPP_METRICS  # was the router's 8000
    assert "/health and /metrics" in parser.format_help()
    assert "port to listen on" not in parser.format_help()  # the router's words, which said 8000
