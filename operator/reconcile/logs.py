"""Logging: plain text or one JSON object per line, with the fleet's namespace/name.

Reconciler messages carry `extra={"fleet": {"namespace": ..., "name": ...}}`; the JSON
format puts them in `namespace` and `name` fields so that log stores can filter a fleet.
"""

from __future__ import annotations

import json
import logging
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fleet = getattr(record, "fleet", None)
        if isinstance(fleet, dict):
            out.update({k: v for k, v in fleet.items() if k in ("namespace", "name")})
        k8s = getattr(record, "k8s_skip", None) or getattr(record, "k8s", None)  # kopf's object loggers
        if isinstance(k8s, dict):
            out.setdefault("namespace", k8s.get("namespace"))
            out.setdefault("name", k8s.get("name"))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fleet = getattr(record, "fleet", None)
        prefix = f"[{fleet.get('namespace')}/{fleet.get('name')}] " if isinstance(fleet, dict) else ""
        record.fleet_prefix = prefix
        return super().format(record)


def configure(fmt: str = "plain", verbose: bool = False) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(PlainFormatter("%(asctime)s %(levelname)s %(name)s %(fleet_prefix)s%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # kopf logs every successful event handler at INFO: one line per child event; keep them for -v.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if verbose else logging.WARNING)


def fleet_extra(namespace: str, name: str) -> dict[str, Any]:
    return {"fleet": {"namespace": namespace, "name": name}}
