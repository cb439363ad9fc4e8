"""Operator scenarios shared by the kmock-backed integration tests and the `k8s` tests.

A scenario drives the API through a `Driver` (the fake server, or a real cluster) while
the real kopf operator runs in its own thread, and asserts on what the API then holds.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any, Optional, Protocol

from pdfleet.operator.api import parse
from pdfleet.operator.plan import PlanOptions, plan, revision_of

CR_RESOURCE = "pdfleet.io/v1alpha1/disaggregatedinferences"
STS = "apps/v1/statefulsets"
DEPLOY = "apps/v1/deployments"
KIND_RESOURCES = {
    "StatefulSet": STS, "Deployment": DEPLOY, "Service": "v1/services", "ConfigMap": "v1/configmaps",
    "ServiceAccount": "v1/serviceaccounts", "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "Role": "rbac.authorization.k8s.io/v1/roles", "RoleBinding": "rbac.authorization.k8s.io/v1/rolebindings",
    "NetworkPolicy": "networking.k8s.io/v1/networkpolicies",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1/leaderworkersets",
    "PodGroup": "scheduling.volcano.sh/v1beta1/podgroups",
    "InferencePool": "inference.networking.k8s.io/v1/inferencepools",
}
IMAGE = "registry.example/pdfleet-runtime:test"
THIRD_PARTY_KINDS = ("LeaderWorkerSet", "PodGroup", "InferencePool")


def fleet(name: str = "llama", **spec: Any) -> dict[str, Any]:
    base = {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "prefill": {"replicas": 1}, "decode": {"replicas": 1},
        "router": {"replicas": 1},
        "network": {"networkPolicy": True},
    }
    for key, value in spec.items():
        base[key] = value
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
            "metadata": {"name": name}, "spec": base}


class Driver(Protocol):
    namespace: str

    async def create_cr(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def patch_cr(self, name: str, patch: dict[str, Any]) -> None: ...
    async def delete_cr(self, name: str) -> None: ...
    async def get(self, resource: str, name: str) -> Optional[dict[str, Any]]: ...
    async def list(self, resource: str, labels: Optional[dict[str, str]] = None) -> list[dict[str, Any]]: ...
    async def make_ready(self, kind: str, name: str, ready: Optional[int] = None) -> None: ...
    def operator_writes(self) -> float: ...
    def operator_runs(self) -> int: ...


def expected_children(cr: dict[str, Any], namespace: str, serving: Optional[str] = None) -> list[dict[str, Any]]:
    body = copy.deepcopy(cr)
    body["metadata"]["namespace"] = namespace
    return plan(body, PlanOptions(default_image=IMAGE, serving_revision=serving))


def names_by_kind(objs: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for o in objs:
        out.setdefault(o["kind"], set()).add(o["metadata"]["name"])
    return out


async def fleet_children(d: Driver, name: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for kind, resource in KIND_RESOURCES.items():
        try:
            listed = await d.list(resource, {"pdfleet.io/fleet": name})
        except Exception:
            if kind in THIRD_PARTY_KINDS:
                continue  # a real cluster without the LeaderWorkerSet / Volcano / InferencePool CRDs installed
            raise
        found = {o["metadata"]["name"] for o in listed if not o["metadata"].get("deletionTimestamp")}
        if found:
            out[kind] = found
    return out


async def serving_services(d: Driver, name: str) -> set[str]:
    """The fleet's Services labelled as the serving revision's."""
    listed = await d.list(KIND_RESOURCES["Service"], {"pdfleet.io/fleet": name})
    return {o["metadata"]["name"] for o in listed if not o["metadata"].get("deletionTimestamp")
            and (o["metadata"].get("labels") or {}).get("pdfleet.io/serving") == "true"}


async def status_of(d: Driver, name: str) -> dict[str, Any]:
    cr = await d.get(CR_RESOURCE, name)
    return (cr or {}).get("status") or {}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


async def wait_status(d: Driver, name: str, check, what: str, timeout: float = 15.0) -> dict[str, Any]:
    async def poll() -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            st = await status_of(d, name)
            try:
                if check(st):
                    return st
            except (KeyError, IndexError, TypeError):
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}; status={st}")
            await asyncio.sleep(0.05)
    return await poll()


async def wait_children(d: Driver, name: str, want: dict[str, set[str]], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        have = await fleet_children(d, name)
        if have == want:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"children differ:\nwant={want}\nhave={have}")
        await asyncio.sleep(0.05)


async def settle(d: Driver, quiet: float = 0.5, timeout: float = 15.0) -> None:
    """Wait until the operator has written nothing for `quiet` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    last, since = d.operator_writes(), asyncio.get_running_loop().time()
    while asyncio.get_running_loop().time() - since < quiet:
        await asyncio.sleep(0.05)
        now = d.operator_writes()
        if now != last:
            last, since = now, asyncio.get_running_loop().time()
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the operator keeps writing")


async def make_fleet_ready(d: Driver, name: str) -> None:
    for sts in await d.list(STS, {"pdfleet.io/fleet": name}):
        await d.make_ready("StatefulSet", sts["metadata"]["name"])
    for dep in await d.list(DEPLOY, {"pdfleet.io/fleet": name}):
        await d.make_ready("Deployment", dep["metadata"]["name"])
    for lws in await d.list(KIND_RESOURCES["LeaderWorkerSet"], {"pdfleet.io/fleet": name}):
        await d.make_ready("LeaderWorkerSet", lws["metadata"]["name"])


# ---------------------------------------------------------------------------- scenarios

async def scenario_create(d: Driver) -> dict[str, Any]:
    cr = await d.create_cr(fleet())
    want = names_by_kind(expected_children(cr, d.namespace))
    await wait_children(d, "llama", want)
    uid = cr["metadata"]["uid"]
    for kind, resource in KIND_RESOURCES.items():
        for obj in await d.list(resource, {"pdfleet.io/fleet": "llama"}):
            refs = obj["metadata"].get("ownerReferences") or []
            assert [r["uid"] for r in refs if r.get("controller")] == [uid], (kind, obj["metadata"]["name"], refs)
            assert obj["metadata"]["annotations"]["pdfleet.io/applied-hash"]
    st = await wait_status(d, "llama", lambda s: s.get("observedGeneration") == cr["metadata"]["generation"],
                           "observedGeneration")
    assert condition(st, "Ready")["status"] == "False", st
    assert st["url"] == f"http://llama-router.{d.namespace}.svc:8000"
    created = [e for e in await d.list("v1/events") if e.get("reason") == "Created"
               and e["involvedObject"]["uid"] == uid]
    assert created and created[0]["type"] == "Normal" and created[0]["message"].startswith("created ")
    return cr


async def scenario_status_follows_children(d: Driver) -> None:
    cr = await scenario_create(d)
    revision = (await status_of(d, "llama"))["revision"]
    await make_fleet_ready(d, "llama")
    st = await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready=True")
    assert st["prefill"] == {"replicas": 1, "desiredReplicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    assert st["decode"]["readyReplicas"] == 1 and st["router"]["readyReplicas"] == 1
    (endpoint,) = st["endpoints"]["prefill"]
    pod = await d.get("v1/pods", endpoint["pod"])
    assert endpoint == {"pod": f"llama-prefill-{revision}-0", "ip": pod["status"]["podIP"],
                        "sideChannelPort": 5600, "httpPort": 8000, "revision": revision,
                        "kvEventsPort": 5557}
    assert condition(st, "Progressing")["status"] == "False" and condition(st, "Degraded")["status"] == "False"
    ready_since = condition(st, "Ready")["lastTransitionTime"]

    # The prefill pod stops being ready: endpoints empty, Ready flips to False.
    await d.make_ready("StatefulSet", f"llama-prefill-{revision}", ready=0)
    st = await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "False", "Ready=False")
    assert st["endpoints"]["prefill"] == [] and st["prefill"]["readyReplicas"] == 0
    assert cr["metadata"]["uid"]
    # And back: lastTransitionTime moves only on flips.
    await d.make_ready("StatefulSet", f"llama-prefill-{revision}")
    st = await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready=True again")
    assert condition(st, "Ready")["lastTransitionTime"] >= ready_since


async def scenario_scale(d: Driver) -> None:
    cr = await scenario_create(d)
    revision = (await status_of(d, "llama"))["revision"]
    await d.patch_cr("llama", {"spec": {"prefill": {"replicas": 3}}})

    async def replicas() -> int:
        sts = await d.get(STS, f"llama-prefill-{revision}")
        return sts["spec"]["replicas"] if sts else -1

    for _ in range(300):
        if await replicas() == 3:
            break
        await asyncio.sleep(0.05)
    assert await replicas() == 3
    st = await wait_status(d, "llama", lambda s: s["observedGeneration"] == cr["metadata"]["generation"] + 1,
                           "observedGeneration after scale")
    assert st["revision"] == revision, "scaling must not change the revision"
    names = (await fleet_children(d, "llama"))["StatefulSet"]
    assert names == {f"llama-prefill-{revision}", f"llama-decode-{revision}"}


async def scenario_invalid_spec(d: Driver) -> None:
    cr = await scenario_create(d)
    await settle(d)
    before = await fleet_children(d, "llama")
    sts_before = await d.get(STS, f"llama-decode-{(await status_of(d, 'llama'))['revision']}")
    writes = d.operator_writes()
    # Passes the CRD (plain strings), breaks an operator-only rule.
    await d.patch_cr("llama", {"spec": {"decode": {"extraArgs": ["--enforce-eager", "--port=9000"]}}})
    st = await wait_status(d, "llama", lambda s: condition(s, "Ready")["reason"] == "InvalidSpec", "InvalidSpec")
    assert "spec.decode.extraArgs[1]" in condition(st, "Ready")["message"]
    assert st["observedGeneration"] == cr["metadata"]["generation"] + 1
    await asyncio.sleep(0.5)
    assert await fleet_children(d, "llama") == before
    sts_after = await d.get(STS, sts_before["metadata"]["name"])
    assert sts_after["metadata"]["resourceVersion"] == sts_before["metadata"]["resourceVersion"], "a child was touched"
    # Only the status and one Warning event were written.
    assert d.operator_writes() - writes == 2
    events = [e for e in await d.list("v1/events") if e.get("reason") == "InvalidSpec"]
    assert len(events) == 1 and events[0]["type"] == "Warning" and "--port" in events[0]["message"]
    # Fixing the spec brings the fleet back.
    await d.patch_cr("llama", {"spec": {"decode": {"extraArgs": ["--enforce-eager"]}}})
    await wait_status(d, "llama", lambda s: condition(s, "Ready")["reason"] != "InvalidSpec", "valid again")


async def scenario_delete(d: Driver) -> None:
    await scenario_create(d)
    await settle(d)
    await d.delete_cr("llama")
    await wait_children(d, "llama", {})
    writes = d.operator_writes()
    await asyncio.sleep(0.5)
    assert await fleet_children(d, "llama") == {}, "the operator re-created children of a deleted fleet"
    assert d.operator_writes() == writes


async def scenario_paired_rollout(d: Driver, *, drain_seconds: float) -> list[dict[str, Any]]:
    """Spec change -> new revision beside the old one; switch when both new roles are ready; drain."""
    await scenario_create(d)
    await make_fleet_ready(d, "llama")
    st = await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready")
    old = st["revision"]

    await d.patch_cr("llama", {"spec": {"engine": {"blockSize": 32}}})
    new_cr = await d.get(CR_RESOURCE, "llama")
    new = revision_of(parse({k: v for k, v in new_cr.items() if k != "status"}), PlanOptions(default_image=IMAGE))
    assert new and new != old
    both = {f"llama-{r}-{rev}" for r in ("prefill", "decode") for rev in (old, new)}
    for _ in range(300):
        if (await fleet_children(d, "llama")).get("StatefulSet") == both:
            break
        await asyncio.sleep(0.05)
    assert (await fleet_children(d, "llama"))["StatefulSet"] == both
    st = await wait_status(d, "llama", lambda s: condition(s, "Progressing")["reason"] == "RollingOut", "RollingOut")
    assert st["revision"] == old, "the router switched before the new pair was ready"
    # The operator says which revision serves by a label on that revision's engine Services
    # (their EndpointSlices carry it to the router); the router itself is told nothing.
    assert await serving_services(d, "llama") == {f"llama-{r}-{old}" for r in ("prefill", "decode")}
    router_before = (await d.get(DEPLOY, "llama-router"))["spec"]["template"]
    assert "--revision" not in router_before["spec"]["containers"][0]["args"]

    # The router's Deployment rolls out whatever the spec change did to it (its controller's part).
    await d.make_ready("Deployment", "llama-router")
    # Only the new prefill ready: still no switch.
    await d.make_ready("StatefulSet", f"llama-prefill-{new}")
    await asyncio.sleep(0.3)
    assert (await status_of(d, "llama"))["revision"] == old
    await d.make_ready("StatefulSet", f"llama-decode-{new}")
    st = await wait_status(d, "llama", lambda s: s["revision"] == new, "switch to the new revision")
    want_serving = {f"llama-{r}-{new}" for r in ("prefill", "decode")}
    for _ in range(100):
        if await serving_services(d, "llama") == want_serving:
            break
        await asyncio.sleep(0.05)
    assert await serving_services(d, "llama") == want_serving  # the old pair's label is gone
    assert {e["revision"] for e in st["endpoints"]["prefill"]} == {new}
    # No router restart on the switch: its pod template is the same, byte for byte. (The spec change
    # itself rolled the router once, at RollingOut: the router hashes prompts with the new block size.)
    router_after = (await d.get(DEPLOY, "llama-router"))["spec"]["template"]
    assert json.dumps(router_after, sort_keys=True) == json.dumps(router_before, sort_keys=True)

    await d.make_ready("Deployment", "llama-router")  # the Deployment controller rolled it for the block size

    # After the drain period the old pair and its config are gone.
    want = names_by_kind(expected_children(new_cr, d.namespace))
    await wait_children(d, "llama", want, timeout=drain_seconds + 10)
    st = await wait_status(d, "llama", lambda s: condition(s, "Progressing")["status"] == "False", "rollout done")
    assert st["revision"] == new and "previousRevision" not in st.get("rollout", {})
    return []


async def scenario_features_off(d: Driver) -> None:
    """Children the plan no longer has are deleted (found by labels): router, PDBs, NetworkPolicy."""
    await scenario_create(d)
    await d.patch_cr("llama", {"spec": {"router": {"enabled": False}, "disruption": {"enabled": False},
                                        "network": {"networkPolicy": False}}})
    cr = await d.get(CR_RESOURCE, "llama")
    await wait_children(d, "llama", names_by_kind(expected_children(cr, d.namespace)))
    kinds = set((await fleet_children(d, "llama")))
    assert kinds == {"StatefulSet", "Service", "ConfigMap"}
