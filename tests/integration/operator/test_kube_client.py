"""KubeClient against a real HTTP server: credentials from a kopf login, re-login on 401, the retry policy."""

from __future__ import annotations

import json
from typing import Any

import aiohttp.web
import kopf
import pytest

from pdfleet.operator.plan.kinds import CONFIGMAP
from pdfleet.operator.reconcile_plan.children import ChildRef
from pdfleet.operator.kube.client import USER_AGENT, ApiFailure, KubeClient, RetryPolicy

REF = ChildRef("v1", "ConfigMap", "ns", "cm")


class Server:
    """Answers each request with the next scripted (status, body, headers); records what came in."""

    def __init__(self) -> None:
        self.script: list[tuple[int, Any, dict[str, str]]] = []
        self.seen: list[dict[str, Any]] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.seen.append({"method": request.method, "path": request.path_qs,
                          "auth": request.headers.get("Authorization"), "agent": request.headers.get("User-Agent"),
                          "type": request.headers.get("Content-Type"), "body": await request.text()})
        status, body, headers = self.script.pop(0) if self.script else (200, {"kind": "ConfigMap"}, {})
        text = body if isinstance(body, str) else json.dumps(body)
        return aiohttp.web.Response(status=status, text=text, headers=headers)


@pytest.fixture
async def server() -> Any:
    srv = Server()
    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", srv.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    srv.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield srv
    await runner.cleanup()


def client_of(server: Server, tokens: list[str], sleeps: list[float] | None = None) -> tuple[KubeClient, list[str]]:
    logins: list[str] = []

    def login() -> kopf.ConnectionInfo:
        token = tokens[min(len(logins), len(tokens) - 1)]
        logins.append(token)
        return kopf.ConnectionInfo(server=server.url + "/", token=token)  # type: ignore[attr-defined]

    async def sleep(seconds: float) -> None:
        (sleeps if sleeps is not None else []).append(seconds)

    return KubeClient(login, timeout=5, policy=RetryPolicy(attempts=3), sleep=sleep), logins


async def test_requests_carry_the_logged_in_credentials_and_content_type(server: Server) -> None:
    client, logins = client_of(server, ["t1"])
    try:
        out = await client.merge_patch(REF, CONFIGMAP, {"data": {"a": "1"}})
        await client.merge_patch(REF, CONFIGMAP, {"data": {"a": "2"}})
    finally:
        await client.close()
    assert out == {"kind": "ConfigMap"}
    assert logins == ["t1"]  # one login, one session for every request
    first = server.seen[0]
    assert first["method"] == "PATCH" and first["path"] == "/api/v1/namespaces/ns/configmaps/cm"
    assert first["auth"] == "Bearer t1" and first["agent"] == USER_AGENT
    assert first["type"] == "application/merge-patch+json" and json.loads(first["body"]) == {"data": {"a": "1"}}


async def test_a_401_logs_in_again_once_and_repeats_the_request(server: Server) -> None:
    server.script = [(401, {"message": "expired"}, {})]
    client, logins = client_of(server, ["old", "new"])
    try:
        await client.merge_patch(REF, CONFIGMAP, {"data": {}})
    finally:
        await client.close()
    assert logins == ["old", "new"]
    assert [s["auth"] for s in server.seen] == ["Bearer old", "Bearer new"]


async def test_a_second_401_fails_without_looping(server: Server) -> None:
    server.script = [(401, {"message": "no"}, {})] * 5
    client, logins = client_of(server, ["bad"])
    try:
        with pytest.raises(ApiFailure) as failure:
            await client.merge_patch(REF, CONFIGMAP, {"data": {}})
    finally:
        await client.close()
    assert failure.value.status == 401 and failure.value.message == "no"
    assert len(logins) == 2 and len(server.seen) == 2


async def test_retriable_statuses_are_retried_honouring_retry_after(server: Server) -> None:
    server.script = [(429, {"message": "slow down"}, {"Retry-After": "7"}),
                     (500, "upstream broke", {}), (200, {"ok": True}, {})]
    sleeps: list[float] = []
    client, _ = client_of(server, ["t"], sleeps)
    try:
        assert await client.merge_patch(REF, CONFIGMAP, {}) == {"ok": True}
    finally:
        await client.close()
    assert len(server.seen) == 3 and sleeps[0] >= 7 and sleeps[1] < 7


@pytest.mark.parametrize("status", [400, 403, 404])
async def test_other_statuses_fail_at_once_with_the_servers_message(server: Server, status: int) -> None:
    server.script = [(status, {"kind": "Status", "message": "field x is wrong"}, {})]
    client, _ = client_of(server, ["t"])
    try:
        with pytest.raises(ApiFailure) as failure:
            await client.merge_patch(REF, CONFIGMAP, {})
    finally:
        await client.close()
    assert failure.value.status == status and failure.value.message == "field x is wrong"
    assert len(server.seen) == 1


async def test_get_metadata_reads_404_as_absent(server: Server) -> None:
    server.script = [(404, {"message": "not found"}, {})]
    client, _ = client_of(server, ["t"])
    try:
        assert await client.get_metadata(CONFIGMAP, "ns", "cm") is None
    finally:
        await client.close()


async def test_the_operators_login_reads_the_kubeconfig(server: Server, tmp_path: Any, monkeypatch: Any) -> None:
    """The production path: handlers.login (kopf's public login_with_kubeconfig) feeds the client."""
    import logging

    import yaml

    from pdfleet.operator.reconcile.handlers import login

    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "k", "cluster": {"server": server.url}}],  # type: ignore[attr-defined]
              "users": [{"name": "u", "user": {"token": "from-kubeconfig"}}],
              "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    client = KubeClient(lambda: login(settings=kopf.OperatorSettings(), logger=logging.getLogger("test")), timeout=5)
    try:
        await client.merge_patch(REF, CONFIGMAP, {"data": {}})
    finally:
        await client.close()
    assert server.seen[0]["auth"] == "Bearer from-kubeconfig"
