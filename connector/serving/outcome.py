"""How a relayed request is recorded: did its whole answer reach the client? (pure)

Clients such as the official ``openai`` package close the connection as soon as
they read an SSE stream's ``data: [DONE]``, often before the router has read
the end of decode's chunked body. That close cancels the router's handler; a
request whose answer was already delivered must still count as served, and only
a client that leaves before the end counts as a disconnect (499).
"""

from __future__ import annotations

import re

__all__ = ["CLIENT_CLOSED", "StreamEnd", "recorded_status"]

CLIENT_CLOSED = 499  # nginx's "client closed request"

# The terminal SSE event: its own line, then the blank line that ends an event.
# JSON text cannot hold a raw newline, so this cannot match inside a data chunk.
_DONE_EVENT = re.compile(rb"(?:^|\n)data: ?\[DONE\]\r?\n\r?\n\Z")
_TAIL = 32  # longer than any match of _DONE_EVENT (at most 17 bytes)


class StreamEnd:
    """Fed every chunk relayed to the client; ``done`` once the last one ended the SSE stream.

    Chunks split anywhere (one byte at a time included): the last bytes relayed
    are kept and matched as one. The kept tail is longer than any match, so a
    match at its start is a match at the stream's start.
    """

    __slots__ = ("_tail", "done")

    def __init__(self) -> None:
        self._tail = b""
        self.done = False

    def feed(self, chunk: bytes) -> bool:
        if chunk:
            self._tail = (self._tail + chunk[-_TAIL:])[-_TAIL:]
            self.done = _DONE_EVENT.search(self._tail) is not None
        return self.done


def recorded_status(sent_status: int | None, *, delivered: bool, client_left: bool) -> int:
    """The status a generate request is counted under.

    ``sent_status``: what the router answered (None when the handler was cancelled
    before it answered); ``delivered``: the whole answer was written to the client
    (for SSE, up to ``data: [DONE]``); ``client_left``: the client closed its
    connection before the router finished.
    """
    if client_left and not delivered:
        return CLIENT_CLOSED
    if sent_status is None:
        return CLIENT_CLOSED if client_left else 500
    return sent_status
