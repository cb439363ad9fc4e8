"""Which revision pair serves a request during a canary (pure; issue 22, part 1's router half).

``canary_share(key, salt)`` maps a request's key to a point in [0, 10000); the request goes to the
canary pair when that point is below the canary weight (percent x 100). Keys are a conversation's
prefix (``prefix_key``), so the turns of one conversation land on one pair and its prefix cache
stays warm; a request with no usable prefix uses its request id (uniformly random). Properties:

- deterministic and the same on every router replica (sha256, not Python's salted hash);
- monotone: raising the weight only moves keys from the stable pair to the canary, never back, so
  each step keeps the caches the previous steps warmed;
- the salt (e.g. the canary revision) reshuffles which keys go first from one rollout to the next.

``choose`` is the edge's one call: app.py asks it once per request, after reading the body, and
runs both legs on the pair it returns. Which revision is the canary, and its weight, come from the
operator's ``pdfleet.io/canary-weight`` label on the canary's EndpointSlices (endpoints.py:
``select_revision``); ``parse_weight`` reads that label.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

from pdfleet.connector.router.endpoints import RevisionEndpoints, Selection

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


def parse_weight(value: Any) -> Optional[int]:
    """The canary-weight label's value as a percent 0..100; None when absent or not a whole number
    in range (a malformed label makes no canary: the serving pair keeps every request)."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 3:
        return None
    weight = int(value)
    return weight if weight <= 100 else None


def choose(selection: Selection, body: dict[str, Any], *, chat: bool, request_id: str) -> Optional[RevisionEndpoints]:
    """The pair that serves this request: the canary for its share of conversations, else the serving one."""
    if selection.canary is None or selection.revision is None:
        return selection.revision
    key = prefix_key(body, chat=chat) or request_id
    return selection.canary if to_canary(key, selection.canary.revision, selection.canary_weight) else selection.revision
