"""pdfleet's data plane: NIXL KV transfer core, vLLM connector adapter, P/D router.

vLLM loads the connector with
``kv_connector_module_path="pdfleet.connector"`` and ``kv_connector="PdfleetConnector"``.
The class is resolved lazily so that importing the transfer core or the router
never imports vLLM.
"""

from __future__ import annotations

from typing import Any

from pdfleet.contract.connector_config import CONNECTOR_CLASS

__all__ = ["PdfleetConnector"]


def __getattr__(name: str) -> Any:
    if name == CONNECTOR_CLASS:  # the class the operator's kv-transfer-config names
        from pdfleet.connector.adapter.connector import PdfleetConnector

        return PdfleetConnector
    raise AttributeError(f"module 'pdfleet.connector' has no attribute {name!r}")
