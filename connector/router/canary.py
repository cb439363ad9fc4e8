"""Which revision pair serves a request during a canary (pure; issue 22, part 1's router half).

``canary_share(key, salt)`` maps a request's key to a point in [0, 10000); the request goes to the
canary pair when that point is below the canary weight (percent x 100). Keys are a conversation's
prefix (``prefix_key``), so the turns of one conversation land on one pair and its prefix cache
stays warm; a request with no usable prefix uses its request id (uniformly random). Properties:

- deterministic and the same on every router replica (sha256, not Python's salted hash);
- monotone: raising the weight only moves keys from the stable pair to the canary, never back, so
  each step keeps the caches the previous steps warmed;
- the salt (e.g. the canary revision) reshuffles which keys go first from one rollout to the next.

The edge decides once per request and uses that pair for both legs. Not wired into app.py yet.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

BUCKETS = 10_000  # weight resolution: 0.01 %
_PREFIX_CHARS = 512  # what identifies a conversation: the start of its first turn(s)


def canary_share(key: str, salt: str) -> int:
    digest = hashlib.sha256(salt.encode() + b"\0" + key.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def to_canary(key: str, salt: str, weight_percent: float) -> bool:
    """True when the request with this key goes to the canary pair at this weight (0..100)."""
    if weight_percent <= 0:
        return False
    if weight_percent >= 100:
        return True
    return canary_share(key, salt) < round(weight_percent * BUCKETS / 100)


def prefix_key(body: dict[str, Any], *, chat: bool) -> Optional[str]:
    """The conversation key of a request: its system prompt and first user turn (chat) or the start
    of its prompt (completions); None when the body has nothing usable (token ids, no prompt)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                continue
            parts.append(f"{m.get('role')}:{m['content']}")
            if m.get("role") == "user":
                break
        text = "\n".join(parts)
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else None
    return text[:_PREFIX_CHARS] if text else None
