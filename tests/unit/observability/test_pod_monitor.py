"""The chart's PodMonitor selects the pods the operator's plan makes, on the port that serves
/metrics, and turns the pod labels the dashboard groups by into series labels."""

from __future__ import annotations

import helm_python
import yaml
from observability_assets import CHART, REPO

from pdfleet.operator.api import parse
from pdfleet.operator.plan import PlanOptions, plan
from pdfleet.operator.plan.naming import FLEET_LABEL, REVISION_LABEL, ROLE_LABEL


def pod_monitor(values):
    manifests = helm_python.Chart.load(str(CHART)).render(values, name="pdfleet", namespace="pdfleet-system")
    docs = [d for p, t in manifests.items() if p.endswith("podmonitor.yaml") for d in yaml.safe_load_all(t) if d]
    return docs[0] if docs else None


def planned_pods():
    cr = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    cr["spec"]["gateway"] = {"inferencePool": {"enabled": True, "allowFrom": [{"namespaceSelector": {}}]}}  # the EPP too
    resource = parse(cr)
    for obj in plan(resource, PlanOptions(default_image="registry.example/runtime:1", namespace="team-a")):
        if obj["kind"] in ("StatefulSet", "Deployment"):
            yield obj["spec"]["template"]


def meta_label(label):
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def test_pod_monitor_selects_every_planned_pod_and_copies_the_labels():
    assert pod_monitor({}) is None  # off by default
    monitor = pod_monitor({"metrics": {"podMonitor": {"enabled": True}}})
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    roles = set()
    for pod in planned_pods():
        labels = pod["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports
        roles.add(labels[ROLE_LABEL])
    assert roles == {"prefill", "decode", "router", "epp"}
    copied = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert copied["fleet"] == [meta_label(FLEET_LABEL)]
    assert copied["role"] == [meta_label(ROLE_LABEL)]
    assert copied["revision"] == [meta_label(REVISION_LABEL)]


def test_pod_monitor_follows_watch_namespaces():
    monitor = pod_monitor({"metrics": {"podMonitor": {"enabled": True}}, "watchNamespaces": ["team-a"]})
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
