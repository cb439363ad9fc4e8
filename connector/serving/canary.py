"""Which revision pair serves a request during a canary (pure; issue 22, part 1's router half; issue 31).

``canary_share(key, salt)`` maps a request's key to a point in [0, 10000); the request goes to the
canary pair when that point is below the canary weight (percent x 100). The key names the request's
conversation (``conversation_key``), so the turns of one conversation land on one pair and its prefix
cache stays warm; a request with no usable key uses its request id (uniformly random). Properties:

- deterministic and the same on every router replica (sha256, not Python's salted hash);
- monotone: raising the weight only moves keys from the stable pair to the canary, never back, so
  each step keeps the caches the previous steps warmed;
- the salt (e.g. the canary revision) reshuffles which keys go first from one rollout to the next.

The conversation key, first match wins:

1. the client's own id, when it gives one: the session header (``x-session-id``, contract/routing.py;
   the router may be told another), then OpenAI's ``prompt_cache_key``, then OpenAI's ``user`` (an
   end-user id: all of one user's conversations then share a pair, which keeps them sticky too);
2. else the conversation's first turn in full. Chat: the leading system/developer messages, any
   few-shot example messages (``name`` starting with ``example``, OpenAI's convention), and the first
   user message after them, text parts read. Every later turn repeats that first turn verbatim, so
   it keeps the key; a long shared system prompt no longer hides what differs (the old key, the
   first 512 characters, gave every conversation behind such a prompt one key).
   Completions: the prompt up to the end of its first assistant cue (``\\nAssistant:``,
   ``<|im_start|>assistant``, ``[/INST]``, ...: the point where the first turn's prompt ended, which
   every later turn's prompt repeats); a prompt without a known cue is keyed by its first
   ``WINDOW_CHARS`` characters (a shared preamble longer than that collapses, and a first turn
   shorter than that changes key when the second turn arrives: send an explicit key then).
   Limits, by design of a stateless key: few-shot examples sent as plain user/assistant turns (chat)
   or written with the same cues (completions) look like the conversation's own first turn, so such
   conversations share one key; clients with such preambles should send an explicit key.
3. else (token ids, no messages): the request id.

``choose`` is the edge's one call: the picker asks it once per request, after reading the body, and
runs both legs on the pair it returns. Which revision is the canary, and its weight, come from the
operator's ``pdfleet.io/canary-weight`` label on the canary's EndpointSlices (endpoints.py:
``select_revision``); ``parse_weight`` reads that label.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Optional

from pdfleet.connector.serving.endpoints import RevisionEndpoints, Selection
from pdfleet.contract.routing import SESSION_HEADER

BUCKETS = 10_000  # weight resolution: 0.01 %
WINDOW_CHARS = 2048  # a cue-less completions prompt is keyed by its start (covers a ~1.5k-char shared preamble)
_MAX_EXPLICIT_CHARS = 1024  # longer explicit ids are refused as keys (the content decides instead)
_PREAMBLE_ROLES = frozenset({"system", "developer"})
# Where a templated completions prompt hands over to the model: the end of the user's turn.
ASSISTANT_CUES = (
    "<|im_start|>assistant",  # ChatML (Qwen, ...)
    "<|start_header_id|>assistant",  # Llama 3
    "<|assistant|>",  # Phi, Zephyr
    "<start_of_turn>model",  # Gemma
    "[/INST]",  # Llama 2, Mistral
    "### Response:",  # Alpaca
    "\nAssistant:", "\nASSISTANT:", "\nAI:",
)


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


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    value = headers.get(name)
    if value is None and not hasattr(headers, "getall"):  # a plain dict: match the name case-insensitively
        lower = name.lower()
        value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == lower), None)
    return value


def explicit_key(body: Mapping[str, Any], headers: Optional[Mapping[str, str]] = None, *,
                 session_header: str = SESSION_HEADER) -> Optional[str]:
    """The client's own conversation id (see the module docstring for the order), or None."""
    candidates = []
    if headers is not None:
        candidates.append(("session", _header(headers, session_header)))
    candidates += [("prompt_cache_key", body.get("prompt_cache_key")), ("user", body.get("user"))]
    for source, value in candidates:
        if isinstance(value, str) and value.strip() and len(value) <= _MAX_EXPLICIT_CHARS:
            return f"{source}:{value.strip()}"
    return None


def _text(content: Any) -> Optional[str]:
    """A message's text: a string, or its text parts joined (other parts, e.g. images, skipped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p["text"] for p in content
                 if isinstance(p, dict) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str)]
        return "\n".join(texts) if texts else None
    return None


def _first_turn_chat(messages: list[Any]) -> Optional[str]:
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        role, name, text = m.get("role"), m.get("name"), _text(m.get("content"))
        if text is None:
            continue
        parts.append(f"{role}:{text}")
        example = isinstance(name, str) and name.startswith("example")
        if role == "user" and not example:
            return "\n".join(parts)
        if role not in _PREAMBLE_ROLES and not example:
            return None  # the conversation starts with something other than a user turn: no stable key
    return None


def _first_turn_completions(prompt: str) -> str:
    ends = [i + len(cue) for cue in ASSISTANT_CUES if (i := prompt.find(cue)) >= 0]
    return prompt[:min(ends)] if ends else prompt[:WINDOW_CHARS]


def prefix_key(body: Mapping[str, Any], *, chat: bool) -> Optional[str]:
    """The conversation key from the request's content: its first turn in full (see the module
    docstring); None when the body has nothing usable (token ids, no prompt, no user turn)."""
    if chat:
        messages = body.get("messages")
        text = _first_turn_chat(messages) if isinstance(messages, list) else None
        return "chat:" + text if text else None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return "prompt:" + _first_turn_completions(prompt) if isinstance(prompt, str) and prompt else None


def conversation_key(body: Mapping[str, Any], *, chat: bool, request_id: str,
                     headers: Optional[Mapping[str, str]] = None, session_header: str = SESSION_HEADER) -> str:
    """The key the canary split hashes: the client's id, else the first turn, else the request id."""
    return (explicit_key(body, headers, session_header=session_header) or prefix_key(body, chat=chat)
            or "request:" + request_id)


def parse_weight(value: Any) -> Optional[int]:
    """The canary-weight label's value as a percent 0..100; None when absent or not a whole number
    in range (a malformed label makes no canary: the serving pair keeps every request)."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 3:
        return None
    weight = int(value)
    return weight if weight <= 100 else None


def choose(selection: Selection, body: Mapping[str, Any], *, chat: bool, request_id: str,
           headers: Optional[Mapping[str, str]] = None,
           session_header: str = SESSION_HEADER) -> Optional[RevisionEndpoints]:
    """The pair that serves this request: the canary for its share of conversations, else the serving one.
    ``headers``: the client request's (for the session header); without them only the body decides."""
    if selection.canary is None or selection.revision is None:
        return selection.revision
    key = conversation_key(body, chat=chat, request_id=request_id, headers=headers, session_header=session_header)
    return selection.canary if to_canary(key, selection.canary.revision, selection.canary_weight) else selection.revision
