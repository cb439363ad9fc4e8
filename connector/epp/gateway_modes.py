"""What the Endpoint Picker learns of its gateway's ext_proc processing mode, one EPP process over all
its streams, and what it says (once) where a setting cannot work.

ext_proc tells the EPP the body modes on each stream (protocol_config) but not the header modes: whether
decode's response headers will come is presumed from the response body mode, learnt from the responses
themselves per pair of body modes (one gateway config), and asked for with mode_override.
"""

from __future__ import annotations

import logging

from pdfleet.connector.epp import protocol

log = logging.getLogger("pdfleet.epp")


class GatewayModes:
    def __init__(self) -> None:
        self._responding: set[tuple[str, str]] = set()  # body modes under which response headers came
        self._said: set[str] = set()

    def announced(self, request_mode: str, response_mode: str) -> None:
        """A stream announced these body modes: say once what cannot work under them."""
        for problem in protocol.mode_problems(request_mode, response_mode):
            self._say(problem)

    def responded(self, request_mode: str, response_mode: str) -> None:
        self._responding.add((request_mode, response_mode))

    def responds(self, request_mode: str, response_mode: str) -> bool:
        """Whether decode's response headers are known to reach the EPP under these body modes."""
        return (request_mode, response_mode) in self._responding or protocol.response_headers_presumed(response_mode)

    def unobserved(self, request_mode: str, response_mode: str) -> None:
        """A routed request ended without response headers where none were known to come."""
        self._say(protocol.NO_RESPONSE_HEADERS.format(modes=f"request_body_mode {request_mode}, "
                                                            f"response_body_mode {response_mode}"))

    def _say(self, message: str) -> None:
        if message not in self._said:  # once per process: each stream would repeat it
            self._said.add(message)
            log.warning("gateway processing mode: %s", message)
