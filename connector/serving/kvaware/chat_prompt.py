"""Which chat requests the router can render to the engine's exact prompt (pure).

vLLM renders a chat request with the model's chat template and tokenizes the
result without adding special tokens (the template has them). The router does
the same for the plain cases only: every message a ``role`` among system, user
and assistant with string content (or text parts), no tools, no per-request
template or template arguments, ``add_generation_prompt`` left on and
``continue_final_message`` off. Anything else is scored from the routed index
(by text), as before. A request the router renders differently from the engine
(say a server started with its own ``--chat-template``) only misses the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLES = frozenset({"system", "user", "assistant"})
_MESSAGE_KEYS = frozenset({"role", "content", "name"})
# request fields that change the rendered prompt (or its tokens) in ways the router does not follow
_RENDERING_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "documents", "mm_processor_kwargs",
                     "prompt_embeds")
STRING, PARTS = "string", "parts"


def plain_conversation(body: Mapping[str, Any], content_format: str) -> list[dict[str, Any]] | None:
    """The conversation to render for a plain chat request, in the template's content format
    (``string``: text contents; ``parts``: lists of text parts), else None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    if any(body.get(f) not in (None, [], {}) for f in _RENDERING_FIELDS):
        return None
    if body.get("add_generation_prompt", True) is not True or body.get("continue_final_message", False):
        return None
    if body.get("add_special_tokens", False):
        return None
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not set(m) <= _MESSAGE_KEYS:
            return None
        texts = _texts_of(m.get("content"))
        if texts is None:
            return None
        # vLLM joins text parts for a string-content template and passes them as parts otherwise
        msg: dict[str, Any] = {"role": m["role"], "content": "\n".join(texts) if content_format == STRING
                               else [{"type": "text", "text": t} for t in texts]}
        if "name" in m:
            if not isinstance(m["name"], str):
                return None
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _texts_of(content: Any) -> list[str] | None:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return texts
    return None


def content_format(render_string: str, render_parts: str, marker: str) -> str | None:
    """The template's content format from one sample rendered both ways (``marker`` is the
    sample's text): a template that prints a parts list as Python takes strings; one that
    renders the text from parts takes parts; one that drops the text is not understood."""
    if marker in render_parts and "'type'" not in render_parts:
        return PARTS
    if marker in render_string:
        return STRING
    return None


__all__ = ["plain_conversation", "content_format", "STRING", "PARTS"]
