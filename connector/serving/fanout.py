"""Requests that vLLM splits into several engine requests cannot be served P/D (pure).

vLLM turns a completion with several prompts into one engine request per
prompt, and ``n > 1`` (or beam search) into one child request per sequence, all
carrying the same ``kv_transfer_params``. Prefill's answer then holds the
``kv_transfer_params`` of one of them only (vLLM 0.32: the first prompt's, or the
last child to finish): decode would hand one prompt's KV cache to every prompt
or sequence, and the other prefill blocks would stay leased, unused, until their
lease ends. The router serves such requests from decode alone instead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAN_OUT", "fan_out_reason"]

FAN_OUT = "fan_out"  # the fallbacks metric's reason


def fan_out_reason(body: dict[str, Any]) -> str | None:
    """Why this request body would become several engine requests, or None if it is one."""
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return f"n={n}"
    if body.get("use_beam_search") is True:
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
