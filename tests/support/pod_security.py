"""Pod Security Standards, "restricted" profile, as a pure check over a pod spec.

Follows https://kubernetes.io/docs/concepts/security/pod-security-standards/
(the baseline controls plus the restricted ones, as of Kubernetes 1.30-1.33).
Returns one message per violation, each starting with the control's name (Capabilities split
into capabilities.drop and capabilities.add), so a test can assert which control a bad pod breaks;
`violated_controls` gives the names alone. `hardening_violations` adds the
project's own rule on top (read-only root filesystem), which the standard does
not require.
"""

from __future__ import annotations

from typing import Any

# Baseline: the only sysctls a pod may set.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
# Restricted: the only volume sources allowed.
RESTRICTED_VOLUME_SOURCES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            out.append((f"{field}[{c.get('name', '?')}]", c))
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Violations of the restricted profile by a core/v1 PodSpec (empty: compliant)."""
    problems: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)

    # --- baseline ---------------------------------------------------------------
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            problems.append(f"hostNamespaces: spec.{field} is true")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("hostProcess: pod windowsOptions.hostProcess is true")
    for vol in spec.get("volumes") or []:
        if "hostPath" in vol:
            problems.append(f"hostPathVolumes: volume {vol.get('name')} is a hostPath")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"sysctls: {sysctl.get('name')} is not a safe sysctl")

    def check_selinux(where: str, sc: dict[str, Any]) -> None:
        opts = sc.get("seLinuxOptions") or {}
        if opts.get("type", "") not in SELINUX_TYPES:
            problems.append(f"seLinux: {where} type {opts.get('type')!r}")
        for key in ("user", "role"):
            if opts.get(key):
                problems.append(f"seLinux: {where} sets {key}")

    def check_apparmor(where: str, sc: dict[str, Any]) -> None:
        profile = sc.get("appArmorProfile")
        if profile is not None and profile.get("type") not in APPARMOR_TYPES:
            problems.append(f"appArmor: {where} profile {profile.get('type')!r}")

    check_selinux("pod", pod_sc)
    check_apparmor("pod", pod_sc)

    # --- restricted, pod level ----------------------------------------------------
    for vol in spec.get("volumes") or []:
        sources = set(vol) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            problems.append(f"volumeTypes: volume {vol.get('name')} uses {sorted(sources - RESTRICTED_VOLUME_SOURCES)}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("runAsUser: pod runAsUser is 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_ALLOWED:
        problems.append(f"seccompProfile: pod type {pod_seccomp!r}")

    # --- per container --------------------------------------------------------------
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"privileged: {where} is privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"hostProcess: {where} windowsOptions.hostProcess is true")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"hostPorts: {where} uses hostPort {port['hostPort']}")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"procMount: {where} procMount {sc['procMount']!r}")
        check_selinux(where, sc)
        check_apparmor(where, sc)

        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"allowPrivilegeEscalation: {where} does not set it to false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"runAsNonRoot: {where} is not required to run as non-root")
        if sc.get("runAsUser") == 0:
            problems.append(f"runAsUser: {where} runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in SECCOMP_ALLOWED:
            problems.append(f"seccompProfile: {where} type {seccomp!r} (must be RuntimeDefault or Localhost)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"capabilities.drop: {where} does not drop ALL")
        added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"capabilities.add: {where} adds {sorted(added)}")
    return problems


def violated_controls(spec: dict[str, Any]) -> set[str]:
    """The names of the restricted controls a PodSpec breaks (empty: compliant)."""
    return {p.split(":")[0] for p in restricted_violations(spec)}


def hardening_violations(spec: dict[str, Any]) -> list[str]:
    """pdfleet's own rules beyond the standard: read-only root filesystem, numeric non-root user."""
    problems = []
    pod_sc = spec.get("securityContext") or {}
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"readOnlyRootFilesystem: {where} has a writable root filesystem")
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if not isinstance(uid, int) or uid <= 0:
            problems.append(f"runAsUser: {where} has no non-zero numeric user")
    return problems
