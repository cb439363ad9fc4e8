"""A pre-imported launcher ("zygote") for `pdfleet local`'s engines (issue 41, a faster wake).

An engine's API server spends ~9 of a wake's ~24 s (2 cores) importing vLLM and torch. With scale to zero
the runner starts this process once: it imports the engine's module (operator/plan/engine.py:
ENGINE_MODULE) and then, on each request over a socket pair it inherited (no listener), forks a child that
becomes that engine: its own session (so it is stopped by process group, like start_child's), a parent-death
signal, stdio to the engine's log, the environment and working directory start_child would give it, then
the module as ``__main__`` with the engine's arguments. Only this process can reap its children, so it
reports each child's exit status. The engine core and worker vLLM spawns from that child are fresh
interpreters as before (vLLM's CPU platform forces the spawn method).

Forking is refused while this process has a second thread (checked in /proc/self/task: numpy's and torch's
OpenBLAS pools are kept off by OPENBLAS_NUM_THREADS=1 in this process's own environment only).

Wire format, both ways: a 4-byte big-endian length, then that many bytes of one JSON object; at most
MAX_FRAME bytes, checked before anything is read or decoded. Runner -> launcher: ``{"op": "start", "id",
"module", "args", "env", "cwd", "log"}``. Launcher -> runner: ``{"ready": true, "pid", "import_s"}`` once
(or ``{"ready": false, "error"}`` and exit), ``{"id", "pid"}`` or ``{"id", "error"}`` per start, and
``{"exit": pid, "returncode"}`` when a child ends (negative: the signal that ended it, as Popen says).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20  # an engine's whole environment and arguments are a few KiB
READY_TIMEOUT_S = 180.0  # the import takes ~11 s on 2 idle cores, longer beside starting engines
REPLY_TIMEOUT_S = 10.0
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1"}  # the launcher's own: no BLAS thread pools before a fork


class FrameError(ValueError):
    pass


# --- framing and requests (pure) ------------------------------------------------------------------


def encode(msg: Mapping[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"message of {len(body)} bytes is over the {MAX_FRAME}-byte bound")
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Frames out of a byte stream; the length is checked against the bound before the body is read."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > self.max_frame:
                raise FrameError(f"frame of {size} bytes is over the {self.max_frame}-byte bound")
            if len(self._buf) < HEADER.size + size:
                break
            body = bytes(self._buf[HEADER.size:HEADER.size + size])
            del self._buf[:HEADER.size + size]
            try:
                msg = json.loads(body)
            except ValueError as exc:
                raise FrameError(f"frame is not JSON: {exc}") from None
            if not isinstance(msg, dict):
                raise FrameError(f"frame is a JSON {type(msg).__name__}, not an object")
            out.append(msg)
        return out


@dataclass(frozen=True)
class StartRequest:
    id: int
    module: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    log: str


def _str_list(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FrameError(f"{field}: must be a list of strings")
    return tuple(value)


def parse_start(msg: Mapping[str, Any], module: str) -> StartRequest:
    """A start request, checked field by field; only the module this launcher imported may be run."""
    if msg.get("op") != "start":
        raise FrameError(f"op: must be 'start', got {msg.get('op')!r}")
    rid = msg.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise FrameError("id: must be an integer")
    if msg.get("module") != module:
        raise FrameError(f"module: this launcher runs {module!r} only, got {msg.get('module')!r}")
    env = msg.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise FrameError("env: must be an object of strings")
    for field in ("cwd", "log"):
        if not isinstance(msg.get(field), str) or not os.path.isabs(msg[field]):
            raise FrameError(f"{field}: must be an absolute path")
    return StartRequest(rid, module, _str_list(msg.get("args"), "args"), env, msg["cwd"], msg["log"])


def module_args(argv: Sequence[str], module: str) -> Optional[tuple[str, ...]]:
    """The arguments of ``python -m module ARGS`` (a launch's command), None for any other command."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == module:
        return tuple(argv[3:])
    return None


def common_env(envs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The variables every engine gets with the same value: the launcher imports under them, so what a
    module reads at import time is what a fresh engine would read (per-engine ports and CPUs are read later)."""
    if not envs:
        return {}
    return {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}


def returncode(status: int) -> int:
    """A wait status as Popen.returncode: the exit code, or minus the signal that ended the process."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


# --- the launcher process ---------------------------------------------------------------------------


def _send(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    sock.sendall(encode(msg))


def _become_engine(req: StartRequest, closing: Sequence[int], launcher_pid: int) -> int:
    """In the forked child: set up as start_child would, run the module as __main__; the exit code."""
    import atexit
    import runpy

    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher_pid:  # the launcher died between fork and prctl
        return 1
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in closing:
        os.close(fd)
    log = os.open(req.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(req.cwd)
    os.environ.clear()
    os.environ.update(req.env)
    if req.env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    sys.argv = [req.module, *req.args]
    # `python -m` of a module that is already imported warns that it runs a second copy: here that is the point
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    code = 0
    try:
        runpy.run_module(req.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the engine's own failure, reported as an interpreter would
        import traceback

        traceback.print_exc()
        code = 1
    # What an interpreter does on its way out: join non-daemon threads, run atexit handlers.
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def serve(sock: socket.socket, module: str) -> int:
    """The launcher's loop: starts children on request, reports their ends; returns at end of file."""
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears of each child's end
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    reader = FrameReader()
    children: set[int] = set()
    try:
        while True:
            for key, _ in sel.select(timeout=1.0):
                if key.fileobj == wake_r:
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                data = sock.recv(65536)
                if not data:
                    return 0
                for msg in reader.feed(data):
                    try:
                        req = parse_start(msg, module)
                    except FrameError as exc:
                        rid = msg.get("id")
                        _send(sock, {"id": rid if isinstance(rid, int) else None, "error": str(exc)})
                        continue
                    n = thread_count()
                    if n != 1:
                        _send(sock, {"id": req.id, "error": f"{n} threads in the launcher: a fork is unsafe"})
                        continue
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        code = 1
                        try:
                            code = _become_engine(req, (sock.detach(), wake_r, wake_w), me)
                        finally:
                            os._exit(code)
                    children.add(pid)
                    _send(sock, {"id": req.id, "pid": pid})
            for pid in list(children):  # reap: on SIGCHLD, and every second in case a signal merged
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    children.discard(pid)
                    continue
                if done:
                    children.discard(pid)
                    _send(sock, {"exit": pid, "returncode": returncode(status)})
    except (OSError, FrameError) as exc:
        print(f"launcher: the runner's channel failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        _stop_children(children)


def _stop_children(children: set[int]) -> None:
    """The runner is gone or done: no child of this launcher outlives it."""
    for pid in children:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while children and time.monotonic() < deadline:
        for pid in list(children):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    children.discard(pid)
            except ChildProcessError:
                children.discard(pid)
        time.sleep(0.05)
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="pdfleet.operator.local.launcher")
    ap.add_argument("--fd", type=int, required=True, help="this end of the runner's socket pair")
    ap.add_argument("--module", required=True, help="the module to import now and run in each child")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the runner (end of file, or SIGTERM) stops it
    sock = socket.socket(fileno=args.fd)
    started = time.monotonic()
    try:
        import importlib

        importlib.import_module(args.module)
        import runpy  # noqa: F401 - imported before any fork
    except BaseException as exc:  # noqa: BLE001 - whatever it is, the runner falls back and says why
        _send(sock, {"ready": False, "error": f"importing {args.module} failed: {exc!r}"})
        return 1
    n = thread_count()
    if n != 1:
        _send(sock, {"ready": False, "error": f"{n} threads after importing {args.module}: a fork is unsafe"})
        return 1
    _send(sock, {"ready": True, "pid": os.getpid(), "import_s": round(time.monotonic() - started, 3)})
    return serve(sock, args.module)


# --- the runner's side ------------------------------------------------------------------------------


class LauncherError(RuntimeError):
    pass


class Launched:
    """A child of the launcher, with what the runner asks of a subprocess.Popen (pid, poll, returncode)."""

    def __init__(self, launcher: "Launcher", pid: int) -> None:
        self.launcher = launcher
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.launcher.drain()
        return self.returncode


class Launcher:
    """The runner's handle on the launcher process: start it, wait until it has imported, fork engines."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, module: str) -> None:
        self.proc = proc
        self.sock = sock
        self.module = module
        self.ready: Optional[dict[str, Any]] = None
        self._reader = FrameReader()
        self._lock = threading.Lock()
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._launched: dict[int, Launched] = {}
        self._closed = False

    @classmethod
    def start(cls, module: str, env: Mapping[str, str], log_path: Path, cwd: Path,
              python: str = sys.executable) -> "Launcher":
        """Start the launcher (call from the main thread: its parent-death signal is the calling thread's)."""
        from pdfleet.operator.local.processes import _parent_death_signal

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [python, "-m", "pdfleet.operator.local.launcher", "--fd", str(theirs.fileno()),
                     "--module", module],
                    env={**os.environ, **env, **THREAD_ENV}, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(theirs.fileno(),),
                    preexec_fn=_parent_death_signal(os.getpid()))
        finally:
            theirs.close()
        return cls(proc, ours, module)

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Block until the launcher has imported its module; LauncherError if it cannot serve."""
        deadline = time.monotonic() + timeout
        while self.ready is None:
            self._read(max(0.0, deadline - time.monotonic()), until=lambda: self.ready is not None)
            if self.ready is None and time.monotonic() >= deadline:
                raise LauncherError(f"not ready after {timeout:.0f}s")
        if not self.ready.get("ready"):
            raise LauncherError(str(self.ready.get("error")))
        return self.ready

    def fork(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path) -> Launched:
        """Start ``python -m MODULE ARGS`` as a child of the launcher; LauncherError when it cannot."""
        args = module_args(argv, self.module)
        if args is None:
            raise LauncherError(f"the command is not `python -m {self.module} ...`")
        if self.ready is None or not self.ready.get("ready") or self._closed:
            raise LauncherError("the launcher is not serving")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._next_id += 1
            rid = self._next_id
        msg = {"op": "start", "id": rid, "module": self.module, "args": list(args),
               "env": {**os.environ, **env}, "cwd": str(Path(cwd).resolve()), "log": str(Path(log_path).resolve())}
        try:
            frame = encode(msg)
            with self._lock:
                self.sock.sendall(frame)
        except (OSError, FrameError) as exc:
            raise LauncherError(f"cannot send the start request: {exc}") from None
        self._read(REPLY_TIMEOUT_S, until=lambda: rid in self._replies)
        reply = self._replies.pop(rid, None)
        if reply is None:
            raise LauncherError(f"no answer within {REPLY_TIMEOUT_S:.0f}s")
        if "error" in reply or not isinstance(reply.get("pid"), int):
            raise LauncherError(str(reply.get("error", reply)))
        with self._lock:
            launched = self._launched.setdefault(reply["pid"], Launched(self, reply["pid"]))
        return launched

    def drain(self) -> None:
        """Take in whatever the launcher said, without waiting."""
        self._read(0.0, until=lambda: False)

    def _read(self, timeout: float, until) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            with self._lock:
                if self._closed:
                    self._orphans_gone()
                    return
                # short waits under the lock: a poll from another thread is never held up for long
                self.sock.settimeout(min(0.2, max(0.0, deadline - time.monotonic())))
                try:
                    data = self.sock.recv(65536)
                except (BlockingIOError, socket.timeout, TimeoutError):
                    data = None
                except OSError:
                    data = b""
                if data is None:
                    messages = []
                elif not data:
                    self._closed = True
                    self._orphans_gone()
                    return
                else:
                    try:
                        messages = self._reader.feed(data)
                    except FrameError:
                        self._closed = True
                        self._orphans_gone()
                        return
                for msg in messages:
                    self._take(msg)
            if data is None and time.monotonic() >= deadline:  # read until nothing more is waiting
                return

    def _take(self, msg: dict[str, Any]) -> None:
        if "ready" in msg and self.ready is None:
            self.ready = msg
        elif isinstance(msg.get("exit"), int) and isinstance(msg.get("returncode"), int):
            launched = self._launched.setdefault(msg["exit"], Launched(self, msg["exit"]))
            launched.returncode = msg["returncode"]
        elif isinstance(msg.get("id"), int):
            self._replies[msg["id"]] = msg

    def _orphans_gone(self) -> None:
        """The launcher is gone: its children died with it (parent-death signal) or will be stopped by group;
        one no longer in /proc (or a zombie) counts as ended with an unknown code (-1)."""
        from pdfleet.operator.local.processes import _leader_alive

        for launched in self._launched.values():
            if launched.returncode is None and not _leader_alive(launched.pid):
                launched.returncode = -1

    def close(self, timeout: float = 30.0) -> None:
        """End of file for the launcher: it stops what it still runs and exits."""
        with self._lock:
            self._closed = True
            self.sock.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
