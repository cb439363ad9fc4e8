"""Requests that vLLM splits into several engine requests cannot be served P/D (pure).

vLLM turns a completion with several prompts into one engine request per
prompt, and ``n > 1`` (or beam search) into one child request per sequence, all
carrying the same ``kv_transfer_params``. Prefill's answer then holds the
``kv_transfer_params`` of one of them only (vLLM 0.32: the first prompt's, or the
last child to finish): decode would hand one prompt's KV cache to every prompt
or sequence, and the other prefill blocks would stay leased, unused, until their
lease ends. The router serves such requests from decode alone instead, and so a body vLLM will
refuse for a number prefill never sees (``n``, ``max_tokens``, ``min_tokens``: the prefill leg drops
or overwrites them), which decode alone refuses at no prefill's cost.
"""

from __future__ import annotations

from typing import Any

from pdfleet.connector.serving.body_fields import FieldError, read_numbers

__all__ = ["FAN_OUT", "fan_out_reason"]

FAN_OUT = "fan_out"  # the fallbacks metric's reason


def fan_out_reason(body: dict[str, Any], *, chat: bool = True) -> str | None:
    """Why this request body would become several engine requests (or is one vLLM refuses for a
    field prefill never sees), or None if it is one. ``chat``: the route (a completion refuses
    ``"n": null``, a chat request reads it as 1); unknown, it is read as chat reads it."""
    try:
        numbers = read_numbers(body, chat=chat)  # as vLLM reads them: "n": "4" and 4.0 are 4
    except FieldError as exc:  # decode alone refuses it; P/D would spend a prefill and a lease first
        return f"refused {exc}"
    if numbers.n != 1:
        return f"n={numbers.n}"
    if numbers.use_beam_search:
        return "use_beam_search"
    prompts = _count_prompts(body.get("prompt"))
    if prompts > 1:
        return f"{prompts} prompts"
    embeds = body.get("prompt_embeds")
    if isinstance(embeds, list) and len(embeds) > 1:
        return f"{len(embeds)} prompt_embeds"
    return None


def _count_prompts(prompt: Any) -> int:
    """A string or a list of token ids is one prompt; a list of those is one per item."""
    if not isinstance(prompt, list):
        return 1
    if all(isinstance(t, int) for t in prompt):
        return 1  # [] included: vLLM refuses it, one request's worth of refusal
    return len(prompt)
