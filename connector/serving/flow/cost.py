"""A request's estimated cost for flow control's fairness (pure): what it asks of the fleet, in tokens.

cost = estimated prompt tokens + the tokens it may generate. Prompt tokens are estimated without a
tokenizer (the gate runs before any): token ids count one each, text counts one per
``CHARS_PER_TOKEN`` characters (English BPE averages about 4). The generated part is ``max_tokens``
(``max_completion_tokens`` for chat), times ``n`` / ``best_of`` choices; a completion that sets no
limit gets vLLM's default (16), a chat request with none is counted at ``CHAT_DEFAULT_MAX_TOKENS`` (vLLM
lets it run to the context's end: a typical long answer, not the model's window). Decode time grows with both (each generated token reads the whole
context), so sharing cost shares decode time far better than sharing requests. The result is bounded to
[1, MAX_COST]: a body cannot claim an unbounded or negative share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 512
MAX_COST = 10_000_000.0
_MAX_CHOICES = 128


def _prompt_tokens(value: Any) -> int:
    if isinstance(value, str):
        return -(-len(value) // CHARS_PER_TOKEN)
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return len(value)  # token ids
        return sum(_prompt_tokens(v) for v in value)  # several prompts, token-id lists, or content parts
    if isinstance(value, Mapping):
        return _prompt_tokens(value.get("text")) + _prompt_tokens(value.get("content"))
    return 0


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def estimate_cost(body: Mapping[str, Any], *, chat: bool) -> float:
    """Estimated tokens the request costs (prompt + generation), in [1, MAX_COST]."""
    if chat:
        messages = body.get("messages")
        prompt = _prompt_tokens(messages) if isinstance(messages, list) else 0
        limit = (_positive_int(body.get("max_completion_tokens")) or _positive_int(body.get("max_tokens"))
                 or CHAT_DEFAULT_MAX_TOKENS)
    else:
        prompt = _prompt_tokens(body.get("prompt"))
        limit = _positive_int(body.get("max_tokens")) or COMPLETIONS_DEFAULT_MAX_TOKENS
    choices = min(_MAX_CHOICES, max(_positive_int(body.get("n")) or 1, _positive_int(body.get("best_of")) or 1))
    cost = prompt + choices * limit
    return float(min(MAX_COST, max(1, cost)))
