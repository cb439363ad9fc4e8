"""The fabric preflight's verdict: what the ``kv-preflight`` init container writes (as JSON, to its
termination message and to a shared file) and what the operator (KVTransport condition) and the
engine's connector (an info metric) read back."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional

CONDITION_TYPE = "KVTransport"
CONTAINER_NAME = "kv-preflight"
RESULT_ENV = "PDFLEET_KV_TRANSPORT_FILE"  # the file the connector reads the verdict from
MAX_BYTES = 4000  # the kubelet keeps at most 4 KiB of a termination message
MAX_MESSAGE = 500  # characters of the message a reader keeps

# Reasons
VERIFIED = "TransportVerified"
TCP_FALLBACK = "TCPFallback"
DEVICE_MISSING = "DeviceMissing"
BELOW_MIN = "BelowMinGBps"
PROBE_FAILED = "ProbeFailed"


@dataclass(frozen=True)
class FabricVerdict:
    status: bool
    reason: str
    message: str
    transport: Optional[str] = None  # e.g. "rc_mlx5/mlx5_0:1", "tcp/eth0", "cma/memory"
    gbps: Optional[float] = None

    def as_dict(self) -> dict[str, object]:
        return {"type": CONDITION_TYPE, "status": "True" if self.status else "False", "reason": self.reason,
                "message": self.message, "transport": self.transport,
                "gBps": None if self.gbps is None else round(self.gbps, 3)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)[:MAX_BYTES]


def parse_verdict(text: Optional[str]) -> Optional[FabricVerdict]:
    """A verdict from its JSON text; None when absent, oversized or not a verdict (a pod's status is
    written by the pod: never trusted further than this)."""
    if not text or len(text) > MAX_BYTES:
        return None
    try:
        raw: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("status") not in ("True", "False"):
        return None
    gbps = raw.get("gBps")
    ok_rate = isinstance(gbps, (int, float)) and not isinstance(gbps, bool) and math.isfinite(gbps) and gbps >= 0

    def text(key: str, most: int) -> str:  # a field of the wrong type is dropped, not turned into text
        value = raw.get(key)
        return value[:most] if isinstance(value, str) else ""

    return FabricVerdict(raw["status"] == "True", text("reason", 100), text("message", MAX_MESSAGE),
                         text("transport", 200) or None, float(gbps) if ok_rate else None)
