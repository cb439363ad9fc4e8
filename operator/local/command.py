"""`pdfleet local -f CR.yaml`: run the fleet a DisaggregatedInference describes as local processes.

Validates the resource with the API models, generates the built-in tiny model when
the resource names it, starts the prefill and decode engines (the plan's vLLM
command, on loopback, free ports, each pinned to its own CPUs), waits until they
are healthy, starts the P/D router in this process, warms every prefill/decode pair
with a request of its own (warmup.py; --warmup-rounds 0: none) and prints exactly one
line `router: http://127.0.0.1:PORT` on stdout. Progress and diagnostics go to stderr.

Without --smoke it serves until Ctrl-C or SIGTERM, restarting an engine that
exits (a few times, like a StatefulSet would). With --smoke it sends a few
requests through the router, prints the P/D output and a table of KV transfer figures
per engine (--metrics-raw: the raw metric lines too), and exits 0 only if all passed.
Every child process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import yaml

EXIT_OK = 0
EXIT_FAILED = 1
# How long the router line waits for the router's tokenizer (prefix routing) before it is printed anyway.
ROUTER_TOKENIZER_WAIT_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, type=Path, help="DisaggregatedInference YAML file")
    parser.add_argument("--router-port", type=int, default=0, help="router port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--gateway", action="store_true",
                        help="also start a real Envoy in front of the fleet through the Endpoint Picker (pdfleet[gateway])"
                             " and print `gateway: http://127.0.0.1:PORT`")
    parser.add_argument("--smoke", action="store_true",
                        help="send a few requests through the router, print output and KV transfer figures, then stop")
    parser.add_argument("--metrics-raw", action="store_true",
                        help="with --smoke, also print the raw connector and router metric lines")
    parser.add_argument("--startup-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long engines may take to become healthy (default 600)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where engine logs go (default: a new temporary directory, kept on failure)")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="write the fleet's processes, ports and logs as JSON here (for tests and tools)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache of the generated tiny model (default $PDFLEET_CACHE_DIR or ~/.cache/pdfleet)")
    parser.add_argument("--preflight-only", action="store_true",
                        help="run the fabric preflight (KVTransport), print it and exit: 0 if True, 1 if False")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="times an engine that exits is started again before the fleet stops (default 3)")
    parser.add_argument("--warmup-rounds", type=_non_negative_int, default=None, metavar="N",
                        help="P/D requests each prefill/decode pair serves before the router line (handshakes,"
                             " first transfers; default 2, 0: none)")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_resource(path: Path) -> Any:
    """The parsed resource, or a list of error lines."""
    from pdfleet.operator.api import InvalidResource, parse

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as exc:
        return [f"{path}: cannot read: {exc.strerror}"]
    except yaml.YAMLError as exc:
        return [f"{path}: not valid YAML: {exc}"]
    if len(docs) != 1:
        return [f"{path}: expected exactly one DisaggregatedInference document, found {len(docs)}"]
    try:
        return parse(docs[0])
    except InvalidResource as exc:
        return [f"{path}: {e}" for e in exc.errors]


def has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def run(args: argparse.Namespace) -> int:
    from pdfleet.operator.local.fleet import local_errors

    resource = load_resource(args.file)
    if isinstance(resource, list):
        for line in resource:
            _err(f"error: {line}")
        return EXIT_FAILED
    problems = local_errors(resource.spec, has_gpu=has_gpu())
    if problems:
        for e in problems:
            _err(f"error: {args.file}: {e}")
        return EXIT_FAILED
    if not 0 <= args.router_port <= 65535:
        _err(f"error: --router-port: must be in 0..65535, got {args.router_port}")
        return EXIT_FAILED
    return asyncio.run(LocalRunner(resource, args).main())


class StartupFailed(Exception):
    pass


class LocalRunner:
    def __init__(self, resource: Any, args: argparse.Namespace) -> None:
        self.resource = resource
        self.spec = resource.spec
        self.args = args
        self.stop = asyncio.Event()
        self.stop_reason = ""
        self.children: dict[str, Any] = {}  # engine name -> processes.Child
        self.launches: dict[str, Any] = {}  # engine name -> fleet.EngineLaunch
        self.restarts: dict[str, int] = {}
        self.log_offsets: dict[str, int] = {}  # engine name -> where its current start's log lines begin
        self.watchdog = None
        self.router_runner = None
        self.router_url: Optional[str] = None
        self.gateway = None  # connector.epp.local_gateway.LocalGateway with --gateway
        self.model_path: Optional[str] = None
        self.run_dir = args.run_dir
        self.temp_run_dir = args.run_dir is None
        self.kv_transport: dict[str, Any] = {}

    # --- top level ----------------------------------------------------------

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        ok = False
        try:
            rc = await self._main()
            ok = rc == EXIT_OK
            return rc
        except StartupFailed as exc:
            _err(f"error: {exc}")
            return EXIT_FAILED
        finally:
            await self._shutdown()
            if self.run_dir is not None:
                if ok and self.temp_run_dir:
                    shutil.rmtree(self.run_dir, ignore_errors=True)
                elif not ok:
                    _err(f"logs kept in {self.run_dir}")

    def _on_signal(self, sig: int) -> None:
        self.stop_reason = signal.Signals(sig).name
        self.stop.set()

    async def _main(self) -> int:
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix="pdfleet-local-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.spec.network.preflight.enabled or self.args.preflight_only:
            if not await self._preflight() or self.args.preflight_only:
                return EXIT_OK if self.kv_transport.get("status") == "True" else EXIT_FAILED
        model_path = await self._prepare_model()
        if self.stop.is_set():
            return EXIT_FAILED
        self.model_path = model_path
        self._plan(model_path)
        from pdfleet.operator.local.processes import Watchdog

        self.watchdog = Watchdog(cwd=self.run_dir)
        for name in self.launches:
            self._start(name)
        self._write_state(healthy=False)
        if not await self._wait_healthy():
            return EXIT_FAILED
        await self._start_router()
        await self._warm_up()
        self._write_state(healthy=True)
        print(f"router: {self.router_url}", flush=True)
        if self.args.gateway:
            print(f"gateway: {await self._start_gateway()}", flush=True)
        if self.args.smoke:
            return await self._smoke()
        await self._supervise()
        _err(f"stopping ({self.stop_reason})")
        return EXIT_OK if self.stop_reason in ("SIGINT", "SIGTERM") else EXIT_FAILED

    # --- setup ----------------------------------------------------------------

    async def _preflight(self) -> bool:
        """KVTransport before any engine starts: a fleet on the wrong fabric does not serve silently."""
        from pdfleet.operator.local.preflight import condition, local_kv_transport

        verdicts = await asyncio.to_thread(local_kv_transport, self.spec, dict(os.environ))
        self.kv_transport = condition(verdicts)
        kv = self.kv_transport
        line = f"KVTransport: {kv['status']} ({kv['reason']}) {kv['message']}"
        # stdout carries only the router line in a serving run; --preflight-only prints its verdict there.
        print(line, flush=True) if self.args.preflight_only else _err(line)
        self._write_state(healthy=False)
        return kv["status"] == "True"

    async def _prepare_model(self) -> Optional[str]:
        from pdfleet.operator.local import tiny_model

        if not tiny_model.is_tiny_model_name(self.spec.model.name):
            return None
        target = tiny_model.tiny_model_dir(cache_root=self.args.cache_dir)
        if not target.exists():
            _err(f"generating the tiny model into {target} ...")
        # In a thread: generation takes seconds and signals must still be seen.
        path = await asyncio.to_thread(tiny_model.ensure_tiny_model, cache_root=self.args.cache_dir)
        return str(path)

    def _plan(self, model_path: Optional[str]) -> None:
        from pdfleet.operator.local.fleet import EnginePorts, kv_events_endpoints, plan_local
        from pdfleet.operator.local.processes import reserve_ports
        from pdfleet.operator.plan.engine import SECRET_FILE
        from pdfleet.operator.plan.naming import revision

        spec = self.spec
        # Same behaviour as the pods (always signed), with a key made for this run only
        # (created 0600 before any byte is written; never printed).
        path = self.run_dir / SECRET_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        secret_file = str(path)
        ports: dict[str, list[EnginePorts]] = {}
        taken: list[int] = []  # ports outside the ephemeral range, bind-checked (ports.py)
        for role in ("prefill", "decode"):
            r = spec.role(role)
            http = reserve_ports(r.replicas, taken=taken)
            taken += http
            side = reserve_ports(r.replicas, consecutive=r.tensor_parallel_size, taken=taken)
            taken += [b + k for b in side for k in range(r.tensor_parallel_size)]
            ports[role] = [EnginePorts(h, s, *kv_events_endpoints(str(self.run_dir.resolve()), f"{role}-{i}"))
                           for i, (h, s) in enumerate(zip(http, side))]
        plan = plan_local(
            spec,
            revision=revision(spec, "local"),
            model_path=model_path,
            cpus=sorted(os.sched_getaffinity(0)),
            ports=ports,
            base_env=os.environ,
            secret_file=secret_file,
        )
        for warning in plan.warnings:
            _err(f"warning: {warning}")
        for launch in plan.engines:
            self.launches[launch.name] = launch
            self.restarts[launch.name] = 0

    def _start(self, name: str) -> None:
        # Called from the event loop's (main) thread only: PR_SET_PDEATHSIG fires
        # when the thread that forked the child ends, not only the process.
        from pdfleet.operator.local.processes import start_child

        launch = self.launches[name]
        log = self.run_dir / f"{name}.log"
        self.log_offsets[name] = log.stat().st_size if log.exists() else 0  # this start's lines begin here
        child = start_child(name, launch.argv, launch.env, log, cwd=self.run_dir)
        self.children[name] = child
        self.watchdog.watch(child.pgid)
        cpus = "|".join(",".join(map(str, r)) for r in launch.cpus)
        _err(f"started {name} (pid {child.pid}) on {launch.url}, side channel 127.0.0.1:{launch.ports.side_channel},"
             f" CPUs {cpus}, log {log}")

    def _write_state(self, *, healthy: bool) -> None:
        if self.args.state_file is None:
            return
        state = {
            "runner_pid": os.getpid(),
            "healthy": healthy,
            "router": self.router_url,
            "run_dir": str(self.run_dir),
            "watchdog_pid": self.watchdog.proc.pid if self.watchdog else None,
            "conditions": [self.kv_transport] if self.kv_transport else [],
            "engines": [
                {
                    "name": name,
                    "role": self.launches[name].role,
                    "pid": child.pid,
                    "pgid": child.pgid,
                    "url": self.launches[name].url,
                    "side_channel_port": self.launches[name].ports.side_channel,
                    "kv_events": self.launches[name].ports.kv_events,
                    "cpus": [list(r) for r in self.launches[name].cpus],
                    "log": str(child.log_path),
                    "restarts": self.restarts[name],
                }
                for name, child in self.children.items()
            ],
        }
        tmp = self.args.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.args.state_file)

    # --- health -------------------------------------------------------------

    async def _wait_healthy(self, names: Optional[list[str]] = None) -> bool:
        from pdfleet.operator.local.health import healthy

        names = list(names or self.children)
        started = time.monotonic()
        deadline = started + self.args.startup_timeout
        ready: set[str] = set()
        last_report = 0.0
        while len(ready) < len(names):
            if self.stop.is_set():
                _err(f"startup interrupted ({self.stop_reason})")
                return False
            for name in names:
                if name in ready:
                    continue
                child = self.children[name]
                if not child.alive():
                    if await self._restart_on_new_ports(name):
                        continue
                    self._report_failure(name, f"exited with code {child.proc.returncode} while starting")
                    return False
                if await asyncio.to_thread(healthy, self.launches[name].url):
                    ready.add(name)
                    _err(f"{name} healthy after {time.monotonic() - started:.0f}s")
            now = time.monotonic()
            if now > deadline:
                for name in names:
                    if name not in ready:
                        self._report_failure(name, f"not healthy after {self.args.startup_timeout:.0f}s")
                return False
            if now - last_report >= 10 and len(ready) < len(names):
                waiting = ", ".join(n for n in names if n not in ready)
                _err(f"waiting for {waiting} ({now - started:.0f}s)")
                last_report = now
            try:
                await asyncio.wait_for(self.stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
        return True

    async def _restart_on_new_ports(self, name: str) -> bool:
        """An engine that exited while starting because a port it was given was taken: start it again on
        new ports (the fleet is not announced yet, so nobody knows the old ones), under --max-restarts."""
        from pdfleet.operator.local.fleet import with_ports
        from pdfleet.operator.local.ports import start_failed_on_port
        from pdfleet.operator.local.processes import read_since, reserve_ports, stop_groups

        child = self.children[name]
        if not start_failed_on_port(read_since(child.log_path, self.log_offsets.get(name, 0))):
            return False
        if self.restarts[name] >= self.args.max_restarts:
            _err(f"{name} failed to start on a port already taken; --max-restarts {self.args.max_restarts} spent")
            return False
        await asyncio.to_thread(stop_groups, [child.pgid], [child.proc], 5.0)
        self.watchdog.forget(child.pgid)
        launch = self.launches[name]
        tp = len(launch.cpus)
        taken = [p for other, l in self.launches.items() if other != name
                 for p in (l.ports.http, *range(l.ports.side_channel, l.ports.side_channel + len(l.cpus)))]
        taken += [launch.ports.http, *range(launch.ports.side_channel, launch.ports.side_channel + tp)]
        (http,) = reserve_ports(1, taken=taken)
        (side,) = reserve_ports(1, consecutive=tp, taken=[*taken, http])
        self.launches[name] = with_ports(launch, dataclasses.replace(launch.ports, http=http, side_channel=side))
        self.restarts[name] += 1
        _err(f"{name} failed to start: a port it was given (http {launch.ports.http}, side channel "
             f"{launch.ports.side_channel}) was taken; restarting on http {http}, side channel {side} "
             f"(restart {self.restarts[name]} of {self.args.max_restarts})")
        self._start(name)
        self._write_state(healthy=False)
        return True

    def _report_failure(self, name: str, why: str) -> None:
        from pdfleet.operator.local.processes import log_tail

        child = self.children[name]
        _err(f"error: {name} {why}; last lines of {child.log_path}:")
        _err(log_tail(child.log_path).rstrip())

    # --- router ---------------------------------------------------------------

    async def _start_router(self) -> None:
        from pdfleet.connector.router.app import start_router
        from pdfleet.contract.router_config import RouterConfig
        from pdfleet.operator.plan.engine import hash_seed
        from pdfleet.operator.plan.router import disaggregation_fields, flow_control_config

        spec = self.spec
        config = RouterConfig(
            prefill=tuple(l.url for l in self.launches.values() if l.role == "prefill"),
            decode=tuple(l.url for l in self.launches.values() if l.role == "decode"),
            prefill_policy=spec.router.prefill_policy, decode_policy=spec.router.decode_policy,
            kv_events=tuple((l.url, f"{l.ports.kv_events},{l.ports.kv_events_replay}")
                            for l in self.launches.values() if l.ports.kv_events),
            tokenizer=self.model_path or spec.model.name, block_size=spec.engine.block_size,
            hash_seed=hash_seed(spec), flow_control=flow_control_config(spec), **disaggregation_fields(spec),
        )
        try:
            self.router_runner, port = await start_router(config, "127.0.0.1", self.args.router_port)
        except OSError as exc:
            raise StartupFailed(f"--router-port {self.args.router_port}: cannot listen: {exc.strerror}") from None
        self.router_url = f"http://127.0.0.1:{port}"
        # The router runs in this process: loading its tokenizer (importing transformers: ~6 s on 2
        # cores) holds the GIL, and every request sent meanwhile waits on it. Announce it once loaded.
        from pdfleet.connector.router.app import ROUTER_KEY

        try:
            await asyncio.wait_for(self.router_runner.app[ROUTER_KEY].prefix.wait_ready(), ROUTER_TOKENIZER_WAIT_S)
        except asyncio.TimeoutError:
            _err(f"the router's tokenizer is still loading after {ROUTER_TOKENIZER_WAIT_S:g}s; serving anyway"
                 " (prefix routing scores by what the router routed until it is loaded)")

    async def _start_gateway(self) -> str:
        from pdfleet.connector.epp.local_gateway import LocalGateway
        from pdfleet.connector.router.app import ROUTER_KEY

        self.gateway = LocalGateway(self.router_runner.app[ROUTER_KEY].config)
        try:
            return await self.gateway.start()
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise StartupFailed(f"--gateway: {exc}") from None

    async def _warm_up(self) -> None:
        from pdfleet.operator.local import warmup
        from pdfleet.operator.plan.engine import served_model_name

        rounds = warmup.DEFAULT_ROUNDS if self.args.warmup_rounds is None else self.args.warmup_rounds
        plan = warmup.warmup_plan([l.url for l in self.launches.values() if l.role == "prefill"],
                                  [l.url for l in self.launches.values() if l.role == "decode"], rounds)
        if not plan:
            return
        result = await warmup.warm_up(plan, served_model_name(self.spec))
        _err(f"warm-up: {result.answered}/{result.pairs} P/D requests answered, {result.pulled} KV pulls,"
             f" {result.seconds:.1f}s" + (f"; {len(result.errors)} failed: {'; '.join(result.errors[:3])}"
                                         if result.errors else ""))

    # --- running ----------------------------------------------------------------

    async def _supervise(self) -> None:
        from pdfleet.operator.local.processes import stop_groups

        while not self.stop.is_set():
            for name, child in list(self.children.items()):
                if child.alive():
                    continue
                self._report_failure(name, f"exited with code {child.proc.returncode}")
                # Its engine core and workers may live on holding ports: end the whole group.
                await asyncio.to_thread(stop_groups, [child.pgid], [child.proc], 5.0)
                self.watchdog.forget(child.pgid)
                if self.restarts[name] >= self.args.max_restarts:
                    self.stop_reason = f"{name} exited {self.restarts[name] + 1} times"
                    self.stop.set()
                    break
                self.restarts[name] += 1
                _err(f"restarting {name} (restart {self.restarts[name]} of {self.args.max_restarts})")
                self._start(name)
                self._write_state(healthy=False)
                if await self._wait_healthy([name]):
                    self._write_state(healthy=True)
            try:
                await asyncio.wait_for(self.stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    async def _smoke(self) -> int:
        import aiohttp

        from pdfleet.operator.local import smoke
        from pdfleet.operator.local.smoke_report import engine_figures, format_table
        from pdfleet.operator.plan.engine import served_model_name

        model = served_model_name(self.spec)
        results = []
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            # The warm-up moved KV too: count what the smoke requests moved.
            moved_before = await self._decode_transferred(session)
            for req in smoke.smoke_requests(model):
                if self.stop.is_set():
                    break
                result = await smoke.send(session, self.router_url, req)
                results.append(result)
                prompt = req.body.get("prompt") or req.body["messages"][-1]["content"]
                status = "ok" if result.ok else f"FAILED: {result.detail}"
                print(f"P/D {result.label}: {_clip(prompt)!r} -> {result.text!r} [{status}]", flush=True)
            engines = []
            for name, launch in self.launches.items():
                engines.append((name, launch.role, await smoke.fetch_metrics(session, launch.url)))
            router_metrics = await smoke.fetch_metrics(session, self.router_url)
        print("KV transfer (the warm-up included):", flush=True)
        for line in format_table([engine_figures(*e) for e in engines], router_metrics):
            print(f"  {line}", flush=True)
        if self.args.metrics_raw:
            print("Metrics:", flush=True)
            for line in smoke.format_transfer_stats(engines, router_metrics):
                print(f"  {line}", flush=True)
        transferred = smoke.decode_transferred(engines) - moved_before
        passed = sum(r.ok for r in results)
        total = len(smoke.smoke_requests(model))
        ok = passed == total and transferred > 0
        if transferred <= 0:
            print("smoke: decode received no prompt tokens by KV transfer", flush=True)
        print(f"smoke: {passed}/{total} requests passed, {int(transferred)} prompt tokens moved by KV transfer"
              f" -> {'PASS' if ok else 'FAIL'}", flush=True)
        return EXIT_OK if ok else EXIT_FAILED

    async def _decode_transferred(self, session: Any) -> float:
        from pdfleet.operator.local import smoke

        engines = [(name, l.role, await smoke.fetch_metrics(session, l.url))
                   for name, l in self.launches.items() if l.role == "decode"]
        return smoke.decode_transferred(engines)

    # --- teardown ----------------------------------------------------------------

    async def _shutdown(self) -> None:
        from pdfleet.operator.local.processes import stop_groups

        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None
        if self.router_runner is not None:
            await self.router_runner.cleanup()
            self.router_runner = None
        children = list(self.children.values())
        if children:
            await asyncio.to_thread(stop_groups, [c.pgid for c in children], [c.proc for c in children])
        if self.watchdog is not None:
            await asyncio.to_thread(self.watchdog.close)
            self.watchdog = None


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
