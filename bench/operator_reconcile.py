"""Benchmark the operator against a local API server (FakeKube: kmock 0.8 made realistic).

The operator runs as its own process (`pdfleet operator`, KUBECONFIG login), the API
server in this one. Figures:

1. CR -> all children applied: median (and p90) of 20 fleets created one at a time;
2. writes per no-op resync: a restarted operator re-lists everything and should write nothing;
3. time to reconcile 200 CRs created at once (every child applied and every status written);
4. operator RSS (VmRSS of the operator process) before and after the 200 fleets.

Baseline, measured in the same run: the same children applied directly over HTTP by a
minimal client (server-side apply, 8 concurrent requests), i.e. what the API server
costs without any operator logic. Run it under the CPU lock:

    flock /tmp/pdfleet-cpu.lock .venv/bin/python bench/operator_reconcile.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import socket
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "support"))  # kube_fixture's waits

from kube_fixture import fake_kube, write_kubeconfig  # noqa: E402

from pdfleet.contract import labels  # noqa: E402
from pdfleet.operator import api  # noqa: E402
from pdfleet.operator.plan import PlanOptions, plan  # noqa: E402

NS = "bench"
IMAGE = "registry.example/pdfleet-runtime:bench"
LOG = open(os.environ.get("PDFLEET_BENCH_LOG", os.devnull), "ab")  # the operator's own log
CR_PATH = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NS}/{api.PLURAL}"


def fleet(name: str) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "network": {"networkPolicy": True}}}


def expected(name: str) -> list[dict]:
    body = fleet(name)
    body["metadata"]["namespace"] = NS
    return plan(body, PlanOptions(default_image=IMAGE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def metric(http: aiohttp.ClientSession, port: int, name: str) -> float:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def children_per_fleet(kube) -> dict[str, int]:
    """One pass over the server's objects (the check runs in the server's loop: keep it cheap)."""
    counts: dict[str, int] = {}
    for (_res, ns, _), obj in kube.objects.items():
        if ns == NS and not obj.deleted:
            fleet_name = (obj.last.raw["metadata"].get("labels") or {}).get(labels.FLEET)
            if fleet_name:
                counts[fleet_name] = counts.get(fleet_name, 0) + 1
    return counts


def applied(kube, name: str, n_children: int) -> bool:
    return children_per_fleet(kube).get(name, 0) >= n_children


def all_applied(kube, names: list[str], n_children: int) -> bool:
    counts = children_per_fleet(kube)
    return all(counts.get(n, 0) >= n_children for n in names)


async def wait_until(check, timeout: float, interval: float = 0.002) -> None:
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(interval)


async def start_operator(kubeconfig: str, metrics_port: int) -> asyncio.subprocess.Process:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PDFLEET_DEFAULT_IMAGE": IMAGE}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdfleet.operator.cli", "operator", "--namespace", NS, "--standalone",
        f"--metrics-port={metrics_port}", "--workers=8", env=env,
        stdout=LOG, stderr=asyncio.subprocess.STDOUT, start_new_session=True)


async def stop_operator(proc: asyncio.subprocess.Process) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 20)
    except asyncio.TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def wait_metrics(http: aiohttp.ClientSession, port: int, timeout: float = 60) -> None:
    deadline = time.perf_counter() + timeout
    while True:
        try:
            await metric(http, port, "pdfleet_operator_fleets")
            return
        except aiohttp.ClientError:
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(0.05)


async def baseline_apply(kube, objs: list[dict], concurrency: int = 8) -> float:
    """Apply objects straight to the server: the cost of the API alone."""
    slots = asyncio.Semaphore(concurrency)
    kinds = {"StatefulSet": "apis/apps/v1", "Deployment": "apis/apps/v1", "Service": "api/v1", "ConfigMap": "api/v1",
             "ServiceAccount": "api/v1", "PodDisruptionBudget": "apis/policy/v1",
             "Role": "apis/rbac.authorization.k8s.io/v1", "RoleBinding": "apis/rbac.authorization.k8s.io/v1",
             "NetworkPolicy": "apis/networking.k8s.io/v1"}

    async def one(o: dict) -> None:
        plural = {"PodDisruptionBudget": "poddisruptionbudgets", "NetworkPolicy": "networkpolicies"}.get(
            o["kind"], o["kind"].lower() + "s")
        url = f"/{kinds[o['kind']]}/namespaces/{NS}/{plural}/{o['metadata']['name']}?fieldManager=bench&force=true"
        async with slots:
            resp = await kube.patch(url, json=o, headers={"Content-Type": "application/apply-patch+yaml"})
            assert resp.status in (200, 201), await resp.text()
            await resp.read()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(o) for o in objs))
    return time.perf_counter() - t0


async def main(n_single: int, n_many: int) -> None:
    import logging
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    async with fake_kube([(api.GROUP, api.VERSION, api.PLURAL, api.KIND)]) as kube:
        kube.namespaces.add(NS)
        n_children = len(expected("x"))
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(os.path.join(tmp, "kubeconfig"), str(kube.url).rstrip("/"), NS)
            port = free_port()
            proc = await start_operator(kubeconfig, port)
            async with aiohttp.ClientSession() as http:
                await wait_metrics(http, port)
                rss_idle = rss_mib(proc.pid)

                # 1. one fleet at a time
                latencies = []
                for i in range(n_single):
                    name = f"single-{i}"
                    t0 = time.perf_counter()
                    resp = await kube.post(CR_PATH, json=fleet(name))
                    assert resp.status == 201
                    await wait_until(lambda: applied(kube, name, n_children), 30)  # noqa: B023 (awaited in the loop)
                    latencies.append(time.perf_counter() - t0)
                base_single = []
                for i in range(n_single):
                    objs = expected(f"base-{i}")
                    base_single.append(await baseline_apply(kube, objs))

                # 3. many fleets at once
                t0 = time.perf_counter()
                await asyncio.gather(*(kube.post(CR_PATH, json=fleet(f"many-{i}")) for i in range(n_many)))
                names = [f"many-{i}" for i in range(n_many)]
                await wait_until(lambda: all_applied(kube, names, n_children), 300, 0.05)
                t_children = time.perf_counter() - t0
                await wait_until(lambda: all((kube.get(f"{api.GROUP}/{api.VERSION}/{api.PLURAL}", NS, n) or {})
                                             .get("status", {}).get("observedGeneration") for n in names), 300, 0.05)
                t_status = time.perf_counter() - t0
                rss_loaded = rss_mib(proc.pid)
                # Baseline on a fresh server holding as many objects as this one held before the
                # burst (FakeKube's cost per request grows with the number of objects it stores).
                held_before = (2 * n_single) * n_children
                many_objs = [o for i in range(n_many) for o in expected(f"base-many-{i}")]
                async with fake_kube([(api.GROUP, api.VERSION, api.PLURAL, api.KIND)]) as fresh:
                    await baseline_apply(fresh, [o for i in range(2 * n_single) for o in expected(f"pre-{i}")])
                    assert len(list(fresh.objects.keys())) == held_before
                    base_many = await baseline_apply(fresh, many_objs)
                await asyncio.sleep(1.0)
                await stop_operator(proc)

                # 2. no-op resync: a fresh operator re-lists everything
                mark = len(kube.calls)
                port = free_port()
                proc = await start_operator(kubeconfig, port)
                await wait_metrics(http, port)
                total = n_single + n_many
                deadline = time.perf_counter() + 120
                while True:
                    try:
                        if await metric(http, port, "pdfleet_operator_reconciles_total") >= total:
                            break
                    except aiohttp.ClientError:
                        pass
                    if time.perf_counter() > deadline:
                        raise TimeoutError("resync did not finish")
                    await asyncio.sleep(0.05)
                t_resync = time.perf_counter()
                await asyncio.sleep(1.0)
                resync_writes = len(kube.writes(mark))
                resync_reads = len([c for c in kube.operator_calls(mark) if c.verb in ("get", "list")])
                rss_resync = rss_mib(proc.pid)
                await stop_operator(proc)
                del t_resync

        med, p90 = statistics.median(latencies), sorted(latencies)[int(0.9 * len(latencies)) - 1]
        bmed = statistics.median(base_single)
        print(f"children per fleet: {n_children}")
        print(f"CR -> all children applied (n={n_single}): median {med * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms; "
              f"baseline direct SSA of the same children: median {bmed * 1000:.1f} ms "
              f"(ratio {med / bmed:.1f}x, includes the watch round trip)")
        print(f"no-op resync after restart ({total} fleets, {total * n_children} children): "
              f"{resync_writes} writes ({resync_writes / total:.2f} per fleet), {resync_reads} list/get requests")
        print(f"{n_many} CRs at once: all children applied in {t_children:.2f} s, all statuses written in "
              f"{t_status:.2f} s ({n_many * n_children} children, {n_many * n_children / t_children:.0f} applies/s); "
              f"baseline direct SSA of {len(many_objs)} objects: {base_many:.2f} s (ratio {t_children / base_many:.1f}x)")
        print(f"operator RSS: idle {rss_idle:.0f} MiB, after {n_many + n_single} fleets {rss_loaded:.0f} MiB, "
              f"fresh after resync {rss_resync:.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=20)
    parser.add_argument("--many", type=int, default=200)
    a = parser.parse_args()
    asyncio.run(main(a.single, a.many))
