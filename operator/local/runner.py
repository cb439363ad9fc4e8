"""`pdfleet local`'s run, start to stop: the steps in order, and the supervision of the engines.

Prepares the run (fabric preflight, the tiny model, the plan: fleet_setup.py), starts every engine
as its own process group under a watchdog (processes.py), waits until each is healthy (an engine
whose start failed on a taken port starts again on new ports), starts the router and the optional
gateway (router_and_gateway.py), warms the pairs (warmup.py), announces the router, then serves
(restarting an engine that exits, under --max-restarts) or runs --smoke (smoke.py). Every child
process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from pdfleet.operator.autoscale.scale_to_zero import ACTIVATE
from pdfleet.operator.local.console import EXIT_FAILED, EXIT_OK, StartupFailed, err, exit_code_after_stop, say

# How often the supervisor looks at its engines, and the start-up wait at the engines' /health.
POLL_S = 1.0
# How often the start-up wait names the engines it still waits for.
PROGRESS_S = 10.0


class LocalRunner:
    def __init__(self, resource: Any, args: argparse.Namespace) -> None:
        from pdfleet.operator.local.fleet import awake_spec, starts_at_zero

        self.resource = resource
        self.spec = awake_spec(resource.spec)  # the engines a wake starts
        self.start_asleep = starts_at_zero(resource.spec)  # both roles at 0: no engine until the first request
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
        self.pair = None  # scale_to_zero.PairAtZero when spec.scaling.scaleToZero is enabled
        self.launcher = None  # launcher.Launcher: forks engines from a pre-imported process (scale to zero)
        self.launcher_on = False  # off after a failed fork: the engines then start as fresh interpreters
        self.launcher_ready: Optional[asyncio.Future] = None  # a pair that starts asleep: the launcher's import

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
            err(f"error: {exc}")
            return EXIT_FAILED
        finally:
            await self._shutdown()
            if self.run_dir is not None:
                if ok and self.temp_run_dir:
                    shutil.rmtree(self.run_dir, ignore_errors=True)
                elif not ok:
                    err(f"logs kept in {self.run_dir}")

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
        if self.start_asleep and self.args.smoke:
            raise StartupFailed("--smoke needs engines up, and this fleet starts with both roles at 0 replicas;"
                                " set spec.prefill.replicas and spec.decode.replicas to 1 for a smoke test")
        model_path = await self._prepare_model()
        if self.stop.is_set():
            return EXIT_FAILED
        self.model_path = model_path
        self._plan(model_path)
        from pdfleet.operator.local.processes import Watchdog

        self.watchdog = Watchdog(cwd=self.run_dir)
        if self.start_asleep:  # nothing forks before the first request: the router need not wait for the import
            self.launcher_ready = asyncio.ensure_future(self._start_launcher())
        else:
            await self._start_launcher()
        if not self.start_asleep:
            for name in self.launches:
                self._start(name)
            self._write_state(healthy=False)
            if not await self._wait_healthy():
                return EXIT_FAILED
        await self._start_router()
        if self.start_asleep:  # nothing offered before the router is announced: the first request is held
            self._front_end(self.router_runner).set_endpoints([])
        else:  # asleep, the first request is the warm-up
            await self._warm_up()
        self._write_state(healthy=not self.start_asleep)
        say(f"router: {self.router_url}")
        if self.args.gateway:
            gateway_url = await self._start_gateway()
            if self.start_asleep:
                self.gateway.epp.router.set_endpoints([])
            say(f"gateway: {gateway_url}")
            say(f"gateway metrics: {self.gateway.metrics_url}")  # the EPP's: requests served through Envoy
            self._write_state(healthy=not self.start_asleep)
        if self.args.smoke:
            return await self._smoke()
        self._scale_to_zero()
        if self.start_asleep:
            from pdfleet.operator.local.scale_to_zero import RETIRED_LINE

            self.pair.asleep = True
            err(f"{RETIRED_LINE}both roles start at 0 replicas (the router holds the first request and starts them)")
        await self._supervise()
        err(f"stopping ({self.stop_reason})")
        return exit_code_after_stop(self.stop_reason)

    # --- setup ----------------------------------------------------------------

    async def _preflight(self) -> bool:
        """KVTransport before any engine starts: a fleet on the wrong fabric does not serve silently."""
        from pdfleet.operator.local.preflight import condition, local_kv_transport

        verdicts = await asyncio.to_thread(local_kv_transport, self.spec, dict(os.environ))
        self.kv_transport = condition(verdicts)
        kv = self.kv_transport
        line = f"KVTransport: {kv['status']} ({kv['reason']}) {kv['message']}"
        # stdout carries only the router line in a serving run; --preflight-only prints its verdict there.
        say(line) if self.args.preflight_only else err(line)
        self._write_state(healthy=False)
        return kv["status"] == "True"

    async def _prepare_model(self) -> Optional[str]:
        from pdfleet.operator.local import tiny_model

        if not tiny_model.is_tiny_model_name(self.spec.model.name):
            return None
        target = tiny_model.tiny_model_dir(cache_root=self.args.cache_dir)
        if not target.exists():
            err(f"generating the tiny model into {target} ...")
        # In a thread: generation takes seconds and signals must still be seen.
        path = await asyncio.to_thread(tiny_model.ensure_tiny_model, cache_root=self.args.cache_dir)
        return str(path)

    def _plan(self, model_path: Optional[str]) -> None:
        from pdfleet.operator.local.fleet_setup import plan_fleet

        plan = plan_fleet(self.spec, self.run_dir, model_path)
        for warning in plan.warnings:
            err(f"warning: {warning}")
        for launch in plan.engines:
            self.launches[launch.name] = launch
            self.restarts[launch.name] = 0

    async def _start_launcher(self) -> None:
        """With scale to zero (and not --no-launcher): the pre-imported launcher that forks the engines, so a
        wake does not pay the API server's import (launcher.py). Any failure: engines start as fresh
        interpreters, as without it."""
        from pdfleet.operator.local.launcher import Launcher, LauncherError, common_env
        from pdfleet.operator.plan.engine import ENGINE_MODULE

        s = self.spec.scaling.scale_to_zero
        if s is None or not s.enabled or getattr(self.args, "no_launcher", False):
            return
        log = self.run_dir / "launcher.log"
        launcher = Launcher.start(ENGINE_MODULE, common_env([lch.env for lch in self.launches.values()]), log,
                                  cwd=self.run_dir)  # main thread: its parent-death signal is this thread's
        self.watchdog.watch(launcher.pgid)
        try:
            ready = await asyncio.to_thread(launcher.wait_ready)
        except LauncherError as exc:
            err(f"launcher: {exc}; engines start as fresh interpreters (log {log})")
            await asyncio.to_thread(launcher.close, 10.0)
            self.watchdog.forget(launcher.pgid)
            return
        self.launcher, self.launcher_on = launcher, True
        err(f"launcher: pid {ready['pid']} imported {ENGINE_MODULE} in {ready['import_s']:.1f}s; it forks the engines")

    def _start(self, name: str) -> None:
        # Called from the event loop's (main) thread only: PR_SET_PDEATHSIG fires
        # when the thread that forked the child ends, not only the process.
        from pdfleet.operator.local.processes import Child, start_child

        launch = self.launches[name]
        log = self.run_dir / f"{name}.log"
        self.log_offsets[name] = log.stat().st_size if log.exists() else 0  # this start's lines begin here
        child, how = None, ""
        if self.launcher_on:
            from pdfleet.operator.local.launcher import LauncherError

            try:
                child, how = Child(name, self.launcher.fork(launch.argv, launch.env, log, self.run_dir), log), \
                    ", forked by the launcher"
            except LauncherError as exc:
                err(f"launcher: cannot start {name} ({exc}); it and later engines start as fresh interpreters")
                self.launcher_on = False  # the launcher itself is closed with the run (_shutdown)
        if child is None:
            child = start_child(name, launch.argv, launch.env, log, cwd=self.run_dir)
        self.children[name] = child
        self.watchdog.watch(child.pgid)
        cpus = "|".join(",".join(map(str, r)) for r in launch.cpus)
        err(f"started {name} (pid {child.pid}) on {launch.url}, side channel 127.0.0.1:{launch.ports.side_channel},"
            f" CPUs {cpus}, log {log}{how}")

    def _write_state(self, *, healthy: bool) -> None:
        if self.args.state_file is None:
            return
        from pdfleet.operator.local.run_state import fleet_state, write_state

        write_state(self.args.state_file, fleet_state(
            runner_pid=os.getpid(), healthy=healthy, router=self.router_url, run_dir=self.run_dir,
            watchdog_pid=self.watchdog.proc.pid if self.watchdog else None, kv_transport=self.kv_transport,
            launches=self.launches, children=self.children, restarts=self.restarts,
            gateway={"url": self.gateway.url, "metrics": self.gateway.metrics_url} if self.gateway is not None else None))

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
                err(f"startup interrupted ({self.stop_reason})")
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
                    err(f"{name} healthy after {time.monotonic() - started:.0f}s")
            now = time.monotonic()
            if now > deadline:
                for name in names:
                    if name not in ready:
                        self._report_failure(name, f"not healthy after {self.args.startup_timeout:.0f}s")
                return False
            if now - last_report >= PROGRESS_S and len(ready) < len(names):
                waiting = ", ".join(n for n in names if n not in ready)
                err(f"waiting for {waiting} ({now - started:.0f}s)")
                last_report = now
            await self._pause()
        return True

    async def _restart_on_new_ports(self, name: str) -> bool:
        """An engine that exited while starting because a port it was given was taken: start it again on
        new ports (the fleet is not announced yet, so nobody knows the old ones), under --max-restarts."""
        from pdfleet.operator.local.fleet_setup import on_new_ports
        from pdfleet.operator.local.ports import start_failed_on_port
        from pdfleet.operator.local.processes import read_since, stop_groups

        child = self.children[name]
        if not start_failed_on_port(read_since(child.log_path, self.log_offsets.get(name, 0))):
            return False
        if self.restarts[name] >= self.args.max_restarts:
            err(f"{name} failed to start on a port already taken; --max-restarts {self.args.max_restarts} spent")
            return False
        await asyncio.to_thread(stop_groups, [child.pgid], [child.proc], 5.0)
        self.watchdog.forget(child.pgid)
        old = self.launches[name].ports
        self.launches[name] = moved = on_new_ports(self.launches, name)
        self.restarts[name] += 1
        err(f"{name} failed to start: a port it was given (http {old.http}, side channel "
            f"{old.side_channel}) was taken; restarting on http {moved.ports.http}, side channel "
            f"{moved.ports.side_channel} (restart {self.restarts[name]} of {self.args.max_restarts})")
        self._start(name)
        self._write_state(healthy=False)
        return True

    def _report_failure(self, name: str, why: str) -> None:
        from pdfleet.operator.local.processes import log_tail

        child = self.children[name]
        err(f"error: {name} {why}; last lines of {child.log_path}:")
        err(log_tail(child.log_path).rstrip())

    # --- router, gateway, warm-up, smoke -------------------------------------------

    def _urls(self, role: str) -> list[str]:
        return [launch.url for launch in self.launches.values() if launch.role == role]

    async def _start_router(self) -> None:
        from pdfleet.operator.local.fleet import router_config
        from pdfleet.operator.local.router_and_gateway import start_router, wait_for_tokenizer

        config = router_config(self.spec, self.launches.values(), self.model_path)
        self.router_runner, self.router_url = await start_router(config, self.args.router_port)
        await wait_for_tokenizer(self.router_runner)

    @staticmethod
    def _front_end(runner: Any) -> Any:
        from pdfleet.connector.router.app import ROUTER_KEY

        return runner.app[ROUTER_KEY]

    async def _start_gateway(self) -> str:
        from pdfleet.operator.local.router_and_gateway import gateway_for, start_gateway

        self.gateway = gateway_for(self.router_runner)
        return await start_gateway(self.gateway)

    async def _warm_up(self) -> None:
        from pdfleet.operator.local import warmup
        from pdfleet.operator.plan.engine import served_model_name

        rounds = warmup.DEFAULT_ROUNDS if self.args.warmup_rounds is None else self.args.warmup_rounds
        plan = warmup.warmup_plan(self._urls("prefill"), self._urls("decode"), rounds)
        if plan:
            err(warmup.summary_line(await warmup.warm_up(plan, served_model_name(self.spec))))

    async def _smoke(self) -> int:
        from pdfleet.operator.local.smoke import run_smoke
        from pdfleet.operator.plan.engine import served_model_name

        engines = [(name, launch.role, launch.url) for name, launch in self.launches.items()]
        ok = await run_smoke(self.router_url, engines, served_model_name(self.spec),
                             metrics_raw=self.args.metrics_raw, stopped=self.stop.is_set)
        return EXIT_OK if ok else EXIT_FAILED

    # --- scale to zero ------------------------------------------------------------

    def _scale_to_zero(self) -> None:
        """With spec.scaling.scaleToZero: the pair stops when idle and starts on the first request."""
        from pdfleet.connector.router.app import ROUTER_KEY
        from pdfleet.connector.serving.router_state import static_groups
        from pdfleet.operator.local.fleet import router_config
        from pdfleet.operator.local.scale_to_zero import PairAtZero

        s = self.spec.scaling.scale_to_zero
        if s is None or not s.enabled:
            return
        router = self.router_runner.app[ROUTER_KEY]
        fronts = [router] + ([self.gateway.epp.router] if self.gateway is not None else [])
        # the engines as they run now (one may have moved to new ports when it started again)
        groups = lambda: static_groups(router_config(self.spec, self.launches.values(), self.model_path))  # noqa: E731
        self.pair = PairAtZero(front_ends=lambda: fronts, groups=groups,
                               stop_engines=self._stop_engines, start_engines=self._start_engines,
                               idle_seconds=float(s.idle_seconds))
        self.pair.hook()
        err(f"scale to zero: the pair stops after {s.idle_seconds}s without a request and starts on the next one")

    async def _stop_engines(self) -> None:
        from pdfleet.operator.local.processes import stop_groups
        from pdfleet.operator.local.scale_to_zero import RETIRED_LINE

        children, self.children = list(self.children.values()), {}
        await asyncio.to_thread(stop_groups, [c.pgid for c in children], [c.proc for c in children])
        for c in children:
            self.watchdog.forget(c.pgid)
        err(f"{RETIRED_LINE}no request for {self.pair.idle_seconds:g}s; every engine stopped "
            "(the router holds the next request and starts them)")
        self._write_state(healthy=False)

    async def _await_launcher(self) -> None:
        if self.launcher_ready is not None:
            ready, self.launcher_ready = self.launcher_ready, None
            await ready

    async def _start_engines(self) -> bool:
        await self._await_launcher()
        for name in self.launches:
            self._start(name)
        ok = await self._wait_healthy(list(self.launches))
        self._write_state(healthy=ok)
        return ok

    # --- running ----------------------------------------------------------------

    async def _pause(self) -> None:
        """POLL_S, or less when the run is asked to stop (or the pair asked to wake)."""
        waits = [asyncio.ensure_future(self.stop.wait())]
        if self.pair is not None:
            waits.append(asyncio.ensure_future(self.pair.asked.wait()))
        _, pending = await asyncio.wait(waits, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()

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
                err(f"restarting {name} (restart {self.restarts[name]} of {self.args.max_restarts})")
                self._start(name)
                self._write_state(healthy=False)
                if await self._wait_healthy([name]):
                    self._write_state(healthy=True)
            if self.pair is not None and not self.stop.is_set() and await self.pair.step() == ACTIVATE:
                err(self.pair.wakes[-1].line() if self.pair.wakes and not self.pair.asleep
                    else "waking the pair failed: see the engines' lines above")
            await self._pause()

    # --- teardown ----------------------------------------------------------------

    async def _shutdown(self) -> None:
        from pdfleet.operator.local.processes import stop_groups

        await self._await_launcher()  # a launcher still importing is closed below like any other
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None
        if self.router_runner is not None:
            await self.router_runner.cleanup()
            self.router_runner = None
        children = list(self.children.values())
        if children:
            await asyncio.to_thread(stop_groups, [c.pgid for c in children], [c.proc for c in children])
        if self.launcher is not None:
            await asyncio.to_thread(self.launcher.close)
            if self.watchdog is not None:
                self.watchdog.forget(self.launcher.pgid)
            self.launcher = None
        if self.watchdog is not None:
            await asyncio.to_thread(self.watchdog.close)
            self.watchdog = None
