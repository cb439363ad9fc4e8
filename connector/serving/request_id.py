"""The X-Request-Id the router sends on both legs (pure).

vLLM builds its own request id from the header: ``cmpl-<id>-<8>`` for completions,
``chatcmpl-<id>-<8>`` for chat (vllm/entrypoints/openai/*/serving.py,
vllm/v1/engine/input_processor.py), and that id comes back in prefill's
``kv_transfer_params`` as ``remote_request_id``. Decode refuses one longer than
MAX_ID_LEN (pdfleet.contract.routing) and sends no release, so prefill would hold
the blocks for the whole lease while the client gets an answer recomputed by decode.
A client id that leaves less than VLLM_ID_OVERHEAD characters of room, or that is not
printable ASCII, is replaced by a fresh one; the client gets the id that was used.
"""

from __future__ import annotations

import uuid
from typing import Callable

from pdfleet.contract.routing import MAX_ID_LEN

VLLM_ID_OVERHEAD = 32  # "chatcmpl-" + "-" + 8 random characters = 18, with room for a prompt index
MAX_CLIENT_ID_LEN = MAX_ID_LEN - VLLM_ID_OVERHEAD


def upstream_request_id(client_id: str | None, new: Callable[[], str] = lambda: uuid.uuid4().hex) -> str:
    """The client's id when decode will accept what vLLM makes of it, else a new one."""
    if client_id and len(client_id) <= MAX_CLIENT_ID_LEN and client_id.isascii() and client_id.isprintable():
        return client_id
    return new()
