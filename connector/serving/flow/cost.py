"""A request's estimated cost for flow control's fairness (pure): what it asks of the fleet, in tokens.

cost = estimated prompt tokens + the tokens it may generate. Prompt tokens are estimated without a
tokenizer (the gate runs before any): token ids count one each, text counts one per
``CHARS_PER_TOKEN`` characters (English BPE averages about 4). The generated part is ``max_tokens``
(``max_completion_tokens`` for chat) or ``min_tokens`` if larger (a lower bound on generation), times
``n`` choices, all read as vLLM reads them (body_fields.py: ``"4096"`` and ``4096.0`` are 4096); a
completion that sets no limit gets vLLM's default (16), a chat request with none (or a completion with
``max_tokens: null``) is counted at ``CHAT_DEFAULT_MAX_TOKENS`` (vLLM lets it run to the context's end: a
typical long answer, not the model's window). ``best_of`` is not counted: vLLM 0.32's request models have
no such field and ignore it. A body vLLM refuses is counted with the defaults (it is refused at once). Decode time grows with both (each generated token reads the whole
context), so sharing cost shares decode time far better than sharing requests. The result is bounded to
[1, MAX_COST]: a body cannot claim an unbounded or negative share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.connector.serving.body_fields import COMPLETIONS_DEFAULT_MAX_TOKENS, FieldError, Numbers, read_numbers

__all__ = ["CHARS_PER_TOKEN", "CHAT_DEFAULT_MAX_TOKENS", "COMPLETIONS_DEFAULT_MAX_TOKENS", "MAX_COST", "estimate_cost"]

CHARS_PER_TOKEN = 4
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


def estimate_cost(body: Mapping[str, Any], *, chat: bool) -> float:
    """Estimated tokens the request costs (prompt + generation), in [1, MAX_COST]."""
    if chat:
        messages = body.get("messages")
        prompt = _prompt_tokens(messages) if isinstance(messages, list) else 0
    else:
        prompt = _prompt_tokens(body.get("prompt"))
    try:
        numbers = read_numbers(body, chat=chat)
    except FieldError:
        numbers = Numbers(None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
    limit = CHAT_DEFAULT_MAX_TOKENS if numbers.max_tokens is None else numbers.max_tokens
    cost = prompt + min(_MAX_CHOICES, numbers.n) * max(limit, numbers.min_tokens)
    return float(min(MAX_COST, max(1, cost)))
