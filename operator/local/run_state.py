"""`pdfleet local --state-file`: the fleet's processes, ports and logs as JSON, for tests and tools.

``fleet_state`` is pure (what the file says); ``write_state`` replaces the file whole, so a reader
never sees half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional


def fleet_state(*, runner_pid: int, healthy: bool, router: Optional[str], run_dir: Path,
                watchdog_pid: Optional[int], kv_transport: Mapping[str, Any], launches: Mapping[str, Any],
                children: Mapping[str, Any], restarts: Mapping[str, int],
                gateway: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The file's content: one entry per started engine (``children``: name -> processes.Child), with
    its launch (``launches``: name -> fleet.EngineLaunch) and restarts so far; with --gateway, the
    gateway's URL and its Endpoint Picker's /metrics."""
    return {
        "runner_pid": runner_pid,
        "healthy": healthy,
        "router": router,
        "gateway": dict(gateway) if gateway else None,
        "run_dir": str(run_dir),
        "watchdog_pid": watchdog_pid,
        "conditions": [dict(kv_transport)] if kv_transport else [],
        "engines": [
            {
                "name": name,
                "role": launches[name].role,
                "pid": child.pid,
                "pgid": child.pgid,
                "url": launches[name].url,
                "side_channel_port": launches[name].ports.side_channel,
                "kv_events": launches[name].ports.kv_events,
                "cpus": [list(r) for r in launches[name].cpus],
                "log": str(child.log_path),
                "restarts": restarts[name],
            }
            for name, child in children.items()
        ],
    }


def write_state(path: Path, state: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)
