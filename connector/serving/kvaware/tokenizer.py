"""The served model's tokenizer as vLLM applies it, for hashing prompts like the engines do."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pdfleet.connector.serving.kvaware.chat_prompt import content_format, plain_conversation
from pdfleet.connector.serving.kvaware.prompt_tokens import composes
from pdfleet.contract import metrics

log = logging.getLogger("pdfleet.router.prefix")


class Tokenizer:
    """A fast (Rust) tokenizer as vLLM applies it to a completion prompt: ``tok(text)`` gives ids;
    ``encode`` gives offsets too, for the prompt token cache; ``render_chat`` gives the prompt
    text of a plain chat request (chat_prompt.py), when the model has a chat template."""

    def __init__(self, backend: Any, chat: Any = None) -> None:
        self._encode, self._encode_batch = backend.encode, backend.encode_batch
        self.composes = composes(self.encode, _COMPOSE_SAMPLE)
        self._chat, self.chat_format = chat, None
        if chat is not None and getattr(chat, "chat_template", None):
            try:
                self.chat_format = content_format(*(self._render([{"role": "user", "content": c}])
                                                    for c in ("PDFLEET-MARK", [{"type": "text", "text": "PDFLEET-MARK"}])),
                                                  "PDFLEET-MARK")
            except Exception as exc:  # a template that cannot render a plain message: no chat scoring
                log.warning("the chat template does not render a plain message (%r): chat requests are "
                            "scored by text", exc)

    def _render(self, conversation: list[dict[str, Any]]) -> str:
        return self._chat.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)

    def render_chat(self, body: Mapping[str, Any]) -> str | None:
        if self.chat_format is None:
            return None
        conversation = plain_conversation(body, self.chat_format)
        return self._render(conversation) if conversation is not None else None

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=True).ids

    def encode(self, text: str, special: bool) -> _RustEncoding:
        return _RustEncoding(self._encode(text, add_special_tokens=special))

    def encode_unlocked(self, text: str, special: bool) -> _RustEncoding:
        """``encode`` for a worker thread: encode_batch releases the GIL while it tokenizes."""
        return _RustEncoding(self._encode_batch([text], add_special_tokens=special)[0])


class _RustEncoding:
    """A tokenizers.Encoding as prompt_tokens.Encoding, without copying its offsets into Python."""

    __slots__ = ("ids", "_enc")

    def __init__(self, enc: Any) -> None:
        self._enc = enc
        self.ids = enc.ids

    def token_starting_at(self, char: int) -> int | None:
        i = self._enc.char_to_token(char)
        return i if i is not None and self._enc.token_to_chars(i)[0] == char else None


_COMPOSE_SAMPLE = ("You are a careful assistant.  Answer in JSON, please: {\"a\": [1, 2, 12345]}\n\n"
                   "User: what's the time in Zürich? It's 10:30 -- isn't it?\tThanks!  Bye.")


def load_tokenizer(name: str | None) -> Callable[[str], list[int]] | None:
    """The served model's tokenizer as vLLM applies it to a completion prompt, or None."""
    return load_tokenizer_reporting(name)[0]


def load_tokenizer_reporting(name: str | None) -> tuple[Callable[[str], list[int]] | None, str]:
    """The tokenizer (or None) and the reason for the metric: metrics.TOKENIZER_LOADED, or why not."""
    if not name:
        return None, metrics.TOKENIZER_NOT_CONFIGURED
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # no transformers, no files, no network: route without exact hashes
        reason = failure_reason(exc)
        log.warning("no tokenizer for %s (%s: %r): prefix routing uses what the router routed itself", name, reason,
                    exc)
        return None, reason
    backend = getattr(tok, "_tokenizer", None) if getattr(tok, "is_fast", False) else None
    if backend is not None:
        return Tokenizer(backend, chat=tok), metrics.TOKENIZER_LOADED
    return (lambda text: tok(text, add_special_tokens=True)["input_ids"]), metrics.TOKENIZER_LOADED


_MAX_CHAIN = 16  # causes followed at most (transformers wraps the Hub's errors in OSError, twice)
_GATED = {"GatedRepoError"}
_UNREACHABLE = {"LocalEntryNotFoundError", "ConnectError", "ConnectTimeout", "ConnectionError", "gaierror",
                "TimeoutError", "ReadTimeout", "OfflineModeIsEnabled"}
_NOT_FOUND = {"RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "HFValidationError"}


def failure_reason(exc: BaseException) -> str:
    """Why a tokenizer did not load, from the exception and its causes (pure): the first cause that says it."""
    chain, seen = [], exc
    while seen is not None and len(chain) < _MAX_CHAIN:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    names = {type(e).__name__ for e in chain}
    if names & _GATED or any("gated repo" in str(e) for e in chain):
        return metrics.TOKENIZER_GATED
    if any(isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES) for e in chain):
        return metrics.TOKENIZER_CACHE_NOT_WRITABLE
    if names & _UNREACHABLE:
        return metrics.TOKENIZER_UNREACHABLE
    if names & _NOT_FOUND or any(isinstance(e, ValueError) and "backend tokenizer" in str(e) for e in chain):
        return metrics.TOKENIZER_NOT_FOUND
    if any(isinstance(e, ImportError) for e in chain):
        return metrics.TOKENIZER_NO_TRANSFORMERS
    return metrics.TOKENIZER_FAILED


__all__ = ["Tokenizer", "failure_reason", "load_tokenizer", "load_tokenizer_reporting"]
