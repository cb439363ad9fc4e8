"""Why a pod is not running, from its status as the watch delivered it (pure).

One cause per pod, the first of: the scheduler's (PodScheduled=False, Unschedulable), then each init
container's, then each container's waiting reason: ImagePullBackOff or ErrImagePull (one cause: the
kubelet alternates them while it retries), CreateContainerConfigError, CrashLoopBackOff. Anything else
(ContainerCreating, a model still loading) is no cause: the pod is on its way.

``subject`` says what the cause is about and stays the same while it lasts (the image, the scheduler's
short message, the missing Secret or key, the container's exit): Warning events are de-duplicated on
it. ``detail`` may change at each restart (the last termination message) and is only shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pdfleet.operator.api import conditions as condition

MAX_TEXT = 200  # characters of a scheduler's, kubelet's or container's message kept in a cause
_PULL_REASONS = {"ImagePullBackOff", "ErrImagePull"}


@dataclass(frozen=True)
class PodCause:
    reason: str        # one of api/conditions.POD_CAUSES
    subject: str       # stable while the cause lasts (the events' de-duplication key)
    detail: str = ""   # may change between restarts; shown, not part of the key

    def text(self) -> str:
        return f"{self.subject}: {self.detail}" if self.detail else self.subject


def clip(text: Any, *, tail: bool = False, limit: int = MAX_TEXT) -> str:
    """One line of at most ``limit`` characters: the head, or with ``tail`` the end (a log's last
    lines say why a process died)."""
    line = " ".join(str(text or "").split())
    if len(line) <= limit:
        return line
    return "…" + line[-(limit - 1):] if tail else line[:limit - 1] + "…"


def scheduler_summary(message: Any) -> str:
    """The scheduler's first sentence: '0/3 nodes are available: 3 Insufficient rdma/ib' (the part
    about preemption that follows says nothing the user can act on)."""
    first = str(message or "").split(". ", 1)[0].rstrip(".")
    return clip(first) or "no node fits the pod"


def _unschedulable(status: Mapping[str, Any]) -> Optional[PodCause]:
    for c in status.get("conditions") or []:
        if (isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"):
            return PodCause(condition.UNSCHEDULABLE, scheduler_summary(c.get("message")))
    return None


def _image(cs: Mapping[str, Any], message: str) -> str:
    if cs.get("image"):
        return str(cs["image"])
    quoted = message.split('"')
    return quoted[1] if len(quoted) > 2 else "(unknown)"


def _container_cause(cs: Mapping[str, Any]) -> Optional[PodCause]:
    waiting = ((cs.get("state") or {}).get("waiting") or {}) if isinstance(cs.get("state"), Mapping) else {}
    reason, message = waiting.get("reason"), str(waiting.get("message") or "")
    name = cs.get("name") or "?"
    if reason in _PULL_REASONS:
        return PodCause(condition.IMAGE_PULL_BACK_OFF, f"image {_image(cs, message)}")
    if reason == condition.CREATE_CONTAINER_CONFIG_ERROR:
        return PodCause(condition.CREATE_CONTAINER_CONFIG_ERROR, f"container {name}: {clip(message) or 'no message'}")
    if reason == condition.CRASH_LOOP_BACK_OFF:
        last = ((cs.get("lastState") or {}).get("terminated") or {}) if isinstance(cs.get("lastState"), Mapping) else {}
        exit_code = last.get("exitCode")
        how = f" exited {exit_code}" if exit_code is not None else " keeps exiting"
        why = f" ({last['reason']})" if last.get("reason") else ""
        return PodCause(condition.CRASH_LOOP_BACK_OFF, f"container {name}{how}{why}",
                        clip(last.get("message"), tail=True))
    return None


def pod_cause(status: Optional[Mapping[str, Any]]) -> Optional[PodCause]:
    """The cause of a pod's status, or None (running, or on its way)."""
    if not isinstance(status, Mapping):
        return None
    found = _unschedulable(status)
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            if found is None and isinstance(cs, Mapping):
                found = _container_cause(cs)
    return found
