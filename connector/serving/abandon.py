"""A prefill leg whose client went away: hand its blocks back at once (not at lease expiry).

A prefill leg is one non-streamed token. When the client disconnects during it, vLLM
usually finishes the request anyway (the abort arrives while the only step runs) and
the prefill then holds the KV blocks under a lease for a decode leg that will never
come: an abort storm would pin prefill memory for a whole lease each. So the router
gives the prefill leg a short grace (it is shielded from the client's cancellation):
if it returns kv_transfer_params within ``GRACE_SECONDS``, they go to a decode with
``max_tokens=1``: the decode pulls the blocks, which releases them on prefill right away
(one READ and one decode step, far less than the prefill already spent), and the answer
is dropped. A leg still running after the grace is cancelled: vLLM aborts it and holds
nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

log = logging.getLogger("pdfleet.router")

# At most this many hand-backs run at once; beyond that the leases simply expire.
MAX_IN_FLIGHT = 64
GRACE_SECONDS = 2.0


# Fields a one-token leg drops: they only shape an answer nobody reads (prompt_logprobs of a 32k-token
# prompt at 20 makes it ~50 MB), or split the request (n, best_of, beam search: never P/D, fanout.py), or
# would be refused beside max_tokens=1 (min_tokens). What makes the prompt's KV stays: the prompt or the
# messages and how they are rendered and tokenized, the model (LoRA), cache_salt, priority, sampling
# settings (harmless for one token; decode samples its own first token from the KV, it never sees
# prefill's).
ANSWER_ONLY_FIELDS = ("prompt_logprobs", "logprobs", "top_logprobs", "logprob_token_ids", "echo",
                      "return_token_ids", "return_tokens_as_token_ids", "return_token_offsets",
                      "n", "best_of", "use_beam_search", "stream_options", "min_tokens")


def one_token_body(body: dict[str, Any], kv_transfer_params: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The request as a one-token, unstreamed leg carrying ``kv_transfer_params``, without the fields
    that only shape its answer: a prefill leg, or a decode leg that only consumes the prefilled blocks."""
    out = {k: v for k, v in body.items() if k not in ANSWER_ONLY_FIELDS}
    out["max_tokens"] = 1
    if chat:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = kv_transfer_params
    return out


def release_body(body: dict[str, Any], kv_transfer_params: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The decode leg that only consumes the prefilled blocks: one token, not streamed."""
    return one_token_body(body, kv_transfer_params, chat=chat)


class Abandoned:
    """Background hand-backs of prefill legs whose client left (bounded, best effort)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self.started = 0
        self.skipped = 0

    def hand_back(self, prefill: "asyncio.Future[Any]", send: Callable[[dict[str, Any]], Awaitable[None]],
                  grace: float = GRACE_SECONDS) -> None:
        """Give the prefill leg ``grace`` seconds; kv_transfer_params it returns go to ``send``."""
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self.skipped += 1
            prefill.cancel()
            return
        task = asyncio.get_running_loop().create_task(self._run(prefill, send, grace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.started += 1

    @staticmethod
    async def _run(prefill: "asyncio.Future[Any]", send: Callable[[dict[str, Any]], Awaitable[None]],
                   grace: float) -> None:
        try:
            result = await asyncio.wait_for(prefill, grace)  # cancels the leg when the grace runs out
        except (asyncio.TimeoutError, asyncio.CancelledError):
            return
        except Exception:
            return
        params = getattr(result, "kv_transfer_params", None)
        if params:  # else prefill failed or was aborted: it holds nothing
            await Abandoned._send(send, params)

    @staticmethod
    async def _send(send: Callable[[dict[str, Any]], Awaitable[None]], params: dict[str, Any]) -> None:
        try:
            await send(params)
        except Exception as exc:  # best effort: the lease expires anyway
            log.info("handing back an abandoned prefill failed: %s", exc)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
