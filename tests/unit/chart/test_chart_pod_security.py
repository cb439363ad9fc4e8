"""The rendered operator pod meets Pod Security "restricted", and the check itself can fail."""

from __future__ import annotations

import copy

import pytest

from chart_render import SCENARIOS, one, render_docs
from pod_security import hardening_violations, restricted_violations, violated_controls


def operator_pod_spec(values):
    return one(render_docs(values), "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_operator_pod_is_restricted(scenario):
    spec = operator_pod_spec(SCENARIOS[scenario])
    assert restricted_violations(spec) == []
    assert hardening_violations(spec) == []


@pytest.fixture(scope="module")
def good_spec():
    return operator_pod_spec({})


def _container(spec):
    return spec["containers"][0]


# Each mutation breaks one control; the check must name that control (and only it).
MUTATIONS = {
    "hostNamespaces": lambda s: s.update(hostNetwork=True),
    "hostPathVolumes": lambda s: s["volumes"].append({"name": "host", "hostPath": {"path": "/var/run"}}),
    "volumeTypes": lambda s: s["volumes"].append({"name": "nfs", "nfs": {"server": "nfs.example", "path": "/"}}),
    "privileged": lambda s: _container(s)["securityContext"].update(privileged=True),
    "hostPorts": lambda s: _container(s)["ports"][0].update(hostPort=8080),
    "procMount": lambda s: _container(s)["securityContext"].update(procMount="Unmasked"),
    "sysctls": lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    "seLinux": lambda s: s["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
    "appArmor": lambda s: s["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
    "allowPrivilegeEscalation": lambda s: _container(s)["securityContext"].pop("allowPrivilegeEscalation"),
    "runAsNonRoot": lambda s: _container(s)["securityContext"].update(runAsNonRoot=False),
    "runAsUser": lambda s: _container(s)["securityContext"].update(runAsUser=0),
    "seccompProfile": lambda s: (
        s["securityContext"].pop("seccompProfile"),
        _container(s)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    ),
    "capabilities.add": lambda s: _container(s)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "capabilities.drop": lambda s: _container(s)["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
}


@pytest.mark.parametrize("control", sorted(MUTATIONS))
def test_each_restricted_control_flags_its_violation(good_spec, control):
    spec = copy.deepcopy(good_spec)
    MUTATIONS[control](spec)
    problems = restricted_violations(spec)
    assert problems, f"{control} violation went unnoticed"
    # hostPath is also outside the restricted volume types: both controls fire.
    expected = {control, "volumeTypes"} if control == "hostPathVolumes" else {control}
    assert violated_controls(spec) == expected, problems


def test_missing_pod_and_container_settings_are_flagged(good_spec):
    spec = copy.deepcopy(good_spec)
    spec["securityContext"] = {}
    spec["containers"][0]["securityContext"] = {}
    assert violated_controls(spec) == {"allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile", "capabilities.drop"}
    assert {p.split(":")[0] for p in hardening_violations(spec)} == {"readOnlyRootFilesystem", "runAsUser"}


def test_init_containers_are_checked_too(good_spec):
    spec = copy.deepcopy(good_spec)
    spec["initContainers"] = [{"name": "setup", "image": "busybox:1.36", "securityContext": {}}]
    assert any(p.startswith("allowPrivilegeEscalation: initContainers[setup]") for p in restricted_violations(spec))


def test_pod_level_settings_cover_containers(good_spec):
    # runAsNonRoot and seccomp may be set once for the pod instead of per container.
    spec = copy.deepcopy(good_spec)
    sc = spec["containers"][0]["securityContext"]
    sc.pop("runAsNonRoot")
    sc.pop("seccompProfile")
    assert restricted_violations(spec) == []
