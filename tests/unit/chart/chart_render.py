"""Render the pdfleet chart offline (helm-python-sdk) and pick objects out of it."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "pdfleet"
RELEASE = "pdfleet"
NAMESPACE = "pdfleet-system"

# Named value sets the tests render; each exercises a different branch of the templates.
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "peering": {"replicaCount": 2, "peering": {"enabled": True, "name": "pdfleet-ha"}},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "namespaced-peering": {"watchNamespaces": ["team-a"], "replicaCount": 3, "peering": {"enabled": True}},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}}}},
    "observability": {
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}}},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
    },
    "custom": {
        "image": {"repository": "registry.example.com/ml/pdfleet-operator", "tag": "0.1.0-rc1",
                  "pullPolicy": "Always"},
        "runtimeImage": {"repository": "registry.example.com/ml/pdfleet-runtime",
                         "digest": "sha256:" + "ab" * 32},
        "imagePullSecrets": [{"name": "regcred"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
        "serviceAccount": {"create": False, "name": "existing-operator"},
        "extraEnv": [{"name": "PDFLEET_LOG_LEVEL", "value": "debug"}],
        "logFormat": "json",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "ml"},
        "podLabels": {"example.com/tier": "control"},
        "priorityClassName": "platform-critical",
        "livenessProbe": {"port": 18080},
        "metrics": {"port": 19090, "service": {"port": 9100}},
        "argocdHealthConfigMap": {"enabled": True},
    },
}


@lru_cache(maxsize=None)
def _chart():
    import helm_python

    return helm_python.Chart.load(str(CHART))


def chart():
    return _chart()


def render_docs(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every object the chart renders (NOTES.txt and empty documents left out)."""
    manifests = chart().render(values or {}, name=RELEASE, namespace=namespace)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def operator_container(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "operator"]
    return container


def env_value(container: dict[str, Any], name: str) -> Any:
    for item in container.get("env", []):
        if item["name"] == name:
            return item.get("value", item.get("valueFrom"))
    raise KeyError(name)
