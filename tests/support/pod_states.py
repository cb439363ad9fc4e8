"""Pod statuses as the kubelet and the scheduler write them, one per failing state (issue 39), for the
table tests of kube/pod_causes.py and the kopf-loop tests that put them on a fleet's pods."""

from __future__ import annotations

from typing import Any

IMAGE = "registry.example/pdfleet-runtime:missing"
SCHEDULER = ("0/3 nodes are available: 3 Insufficient rdma/ib. preemption: 0/3 nodes are available: "
             "3 No preemption victims found for incoming pod.")
CRASH_LOG = "Traceback (most recent call last):\n  ...\nValueError: max_model_len 131072 exceeds the KV cache"


def _waiting(reason: str, message: str, *, image: str = IMAGE, last: dict[str, Any] | None = None,
             name: str = "vllm") -> dict[str, Any]:
    cs: dict[str, Any] = {"name": name, "image": image, "ready": False, "restartCount": 3 if last else 0,
                          "state": {"waiting": {"reason": reason, "message": message}}}
    if last:
        cs["lastState"] = {"terminated": last}
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"},
                                               {"type": "Ready", "status": "False"}],
            "containerStatuses": [cs]}


def unschedulable(message: str = SCHEDULER) -> dict[str, Any]:
    return {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}


def image_pull_back_off(image: str = IMAGE) -> dict[str, Any]:
    return _waiting("ImagePullBackOff", f'Back-off pulling image "{image}"', image=image)


def err_image_pull(image: str = IMAGE) -> dict[str, Any]:
    return _waiting("ErrImagePull", f'failed to pull and unpack image "{image}": not found', image=image)


def missing_secret(name: str = "hf-token") -> dict[str, Any]:
    return _waiting("CreateContainerConfigError", f'secret "{name}" not found')


def missing_key(name: str = "hf-token", key: str = "token", namespace: str = "team-a") -> dict[str, Any]:
    return _waiting("CreateContainerConfigError", f"couldn't find key {key} in Secret {namespace}/{name}")


def crash_loop(message: str = CRASH_LOG, exit_code: int = 1, reason: str = "Error") -> dict[str, Any]:
    return _waiting("CrashLoopBackOff", "back-off 5m0s restarting failed container=vllm",
                    last={"exitCode": exit_code, "reason": reason, "message": message})


def starting() -> dict[str, Any]:
    """Negative control: scheduled, the container being created (the image pulls, a model loads)."""
    return _waiting("ContainerCreating", "")


def running_not_ready() -> dict[str, Any]:
    return {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                               {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "vllm", "image": IMAGE, "ready": False, "restartCount": 0,
                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}


FAILING = {"Unschedulable": unschedulable, "ImagePullBackOff": image_pull_back_off,
           "CreateContainerConfigError": missing_secret, "CrashLoopBackOff": crash_loop}
