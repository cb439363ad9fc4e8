"""`pdfleet operator` as a process: KUBECONFIG login, namespace scope, liveness and metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import eventually, write_kubeconfig
from operator_scenarios import STS, fleet
from observability_assets import OPERATOR_PREFIX, all_queries, split_by_source

from pdfleet.operator.observability.promql import exported_names, missing_metrics
from ports import free_port  # noqa: F401 (also imported from here by this folder's tests)

pytestmark = pytest.mark.timeout(60)



async def test_operator_command_serves_a_namespace(kube, tmp_path):
    kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), str(kube.url).rstrip("/"), NAMESPACE)
    live, metrics = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PDFLEET_DEFAULT_IMAGE": "registry.example/runtime:cmd"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdfleet.operator.cli", "operator", "--namespace", NAMESPACE, "--standalone",
        f"--liveness=http://127.0.0.1:{live}/healthz", f"--metrics-port={metrics}", "--log-format=json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )
    try:
        await FakeDriver(kube).create_cr(fleet())
        await eventually(lambda: len(kube.list(STS, NAMESPACE, {"pdfleet.io/fleet": "llama"})) == 2,
                         timeout=30, what="StatefulSets from the operator process")
        sts = kube.list(STS, NAMESPACE, {"pdfleet.io/fleet": "llama"})[0]
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/runtime:cmd"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{live}/healthz") as resp:
                assert resp.status == 200
            for _ in range(200):  # the counter moves when the reconcile (status write included) ends
                async with http.get(f"http://127.0.0.1:{metrics}/metrics") as resp:
                    text = await resp.text()
                if 'pdfleet_operator_reconciles_total{result="changed"}' in text:
                    break
                await asyncio.sleep(0.05)
        assert 'pdfleet_operator_reconciles_total{result="changed"}' in text
        assert 'pdfleet_operator_children{fleet="llama",namespace="team-a"} 13.0' in text
        assert "pdfleet_operator_reconcile_duration_seconds_bucket" in text
        # Every operator metric the dashboard and the alert rules query is on this page (the fleet's
        # replicas, conditions and revision included); a misspelled one would not be.
        queried = [(where, expr) for where, expr in all_queries() if OPERATOR_PREFIX in expr]
        operator_missing, _ = split_by_source(missing_metrics(queried, exported_names(text)))
        assert queried and operator_missing == {}
        misspelled = [("negative control", "pdfleet_operator_fleet_replica")]
        assert missing_metrics(misspelled, exported_names(text)) == {"pdfleet_operator_fleet_replica": ["negative control"]}
        assert 'pdfleet_operator_fleet_condition{fleet="llama",namespace="team-a",status="true",type="Ready"}' in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 20)
        except asyncio.TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = await proc.communicate()
    lines = out.decode(errors="replace").splitlines()
    assert any('"namespace": "team-a", "name": "llama"' in line and "created" in line for line in lines), \
        "\n".join(lines[-30:])
    assert proc.returncode in (0, -signal.SIGTERM), proc.returncode


async def test_operator_command_refuses_bad_arguments():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdfleet.operator.cli", "operator", "--standalone",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"--namespace" in err and b"--all-namespaces" in err
