"""Every condition type and reason the operator writes to a fleet's status, declared once
(`kubectl get`, `kubectl wait --for=condition=...`, kstatus, Flux and alerts match on them, so a
rename is an API change). The KV transport's and the InferencePool's condition types are declared
beside their readers: contract/fabric.py and kube/pool_status.py."""

from __future__ import annotations

# Types: Ready and Progressing / Degraded, with their kstatus spellings (kstatus reads only those).
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
RECONCILING = "Reconciling"  # kstatus's Progressing
STALLED = "Stalled"  # kstatus's Degraded
SCALING_LIMITED = "ScalingLimited"
SCALED_TO_ZERO = "ScaledToZero"  # spec.scaling.scaleToZero only: True while both roles are at 0 (also Ready's reason)
PREFIX_ROUTING = "PrefixRouting"  # whether the front ends hash prompts with the model's tokenizer (prefixAware)
ROLLOUT_PROGRESSING = "RolloutProgressing"  # strategy Canary only
ROLLOUT_ABORTED = "RolloutAborted"  # strategy Canary only

# Reasons (some are also Events' reasons: api/event_reasons.py spells those, and they are the same word)
SERVING = "Serving"  # Ready: pairs serve, children still settling
WAITING = "Waiting"  # not Ready: no ready pods yet for some role
KV_TRANSPORT_DEGRADED = "KVTransportDegraded"
COMPLETE = "Complete"  # Progressing False: every child rolled out and ready
AS_EXPECTED = "AsExpected"  # Degraded False
NO_CANARY = "NoCanary"
CANARY_STEP = "CanaryStep"
CANARY_WAITING = "CanaryWaiting"
ABORTED = "Aborted"
NOT_ABORTED = "NotAborted"
ACTIVATING = "Activating"  # ScaledToZero False: the pair is asked for and its pods are not all ready yet
ACTIVE = "Active"  # ScaledToZero False: the pair serves
NOT_READ = "NotRead"  # PrefixRouting Unknown: no front end answered (none ready yet, or none reachable)

# Why pods are not ready (issue 39): Ready's reason names the first cause of a role without a ready pod
# (the message names each role's causes); the same words are the Warning events' reasons.
UNSCHEDULABLE = "Unschedulable"  # PodScheduled=False: the scheduler's short message (e.g. Insufficient rdma/ib)
IMAGE_PULL_BACK_OFF = "ImagePullBackOff"  # ImagePullBackOff or ErrImagePull (they alternate): the image
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"  # a Secret or ConfigMap (key) the pod needs is missing
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"  # the last termination: exit code, reason, message (clipped)
POD_CAUSES = (UNSCHEDULABLE, IMAGE_PULL_BACK_OFF, CREATE_CONTAINER_CONFIG_ERROR, CRASH_LOOP_BACK_OFF)
SECRET_MISSING = "SecretMissing"  # Ready False, Progressing True: a Secret the spec names is absent or lacks its key
# Progressing False and Degraded (Stalled) True: spec.progressDeadlineSeconds passed without the fleet complete
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
