"""The transport the engine runs its KV transfers on, as its pod's preflight found it (pure + a file read).

The `kv-preflight` init container writes its verdict to $PDFLEET_KV_TRANSPORT_FILE; the
connector exports it as an info metric (`vllm:pdfleet_connector_kv_transport_info{transport,status,reason}`
= 1), so a dashboard shows an engine serving over TCP next to its transfer times.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from pdfleet.contract.fabric import RESULT_ENV, parse_verdict

UNKNOWN = {"transport": "unknown", "status": "Unknown", "reason": "NoPreflight"}


def info_labels(verdict_text: Optional[str]) -> dict[str, str]:
    """Bounded labels from a verdict file's text; Unknown when absent or unreadable."""
    verdict = parse_verdict(verdict_text)
    if verdict is None:
        return dict(UNKNOWN)
    transport = (verdict.transport or "none").split(",")[0].split("/")[0]  # the UCX transport, not the device
    return {"transport": transport[:32], "status": "True" if verdict.status else "False",
            "reason": verdict.reason[:32]}


def read_info_labels(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    path = env.get(RESULT_ENV)
    if not path:
        return dict(UNKNOWN)
    try:
        with open(path, encoding="utf-8") as f:
            return info_labels(f.read(4096))
    except OSError:
        return dict(UNKNOWN)
