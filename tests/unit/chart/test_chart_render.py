"""The chart lints clean, renders valid Kubernetes objects, and each value does what it says."""

from __future__ import annotations

import copy
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from chart_render import (
    CHART, NAMESPACE, REPO, SCENARIOS, by_kind, chart, env_value, one, operator_container, render_docs,
)

KUBE_VERSIONS = ["1.30.0", "1.33.0"]
# Kinds that are not built into Kubernetes, so kubernetes-validate has no schema for them;
# their shape is checked by the dedicated tests below instead.
CUSTOM_API_VERSIONS = {"monitoring.coreos.com/v1", "kopf.dev/v1"}


@pytest.fixture(scope="module")
def rendered():
    return {name: render_docs(values) for name, values in SCENARIOS.items()}


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_lint_is_clean(scenario, kube):
    report = helm_python.lint(str(CHART), SCENARIOS[scenario], strict=True, kube_version=f"v{kube}")
    assert report["errors"] == []
    # Severity 1 is informational (e.g. "icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_a_broken_chart(tmp_path):
    # Negative control: the same lint call does flag a chart whose template does not parse.
    broken = Path(helm_python.Chart.load(str(CHART)).save_dir(tmp_path))
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata: {{ .Values.nope.deeper }}\n")
    report = helm_python.lint(str(broken), {}, strict=True, kube_version="v1.30.0")
    assert [m for m in report["messages"] if m["severity"] >= 2] or report["errors"]


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_built_in_object_validates(rendered, scenario, kube):
    docs = rendered[scenario]
    assert docs
    for doc in docs:
        if doc["apiVersion"] in CUSTOM_API_VERSIONS:
            continue
        kubernetes_validate.validate(doc, kube, strict=True)


def test_validator_rejects_an_unknown_field(rendered):
    # Negative control for the test above.
    deployment = copy.deepcopy(one(rendered["default"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.33.0", strict=True)


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_chart_crds_validate(kube):
    crds = chart().crds
    names = set()
    for entry in crds:
        for doc in yaml.safe_load_all(entry["data"]):
            kubernetes_validate.validate(doc, kube, strict=True)
            names.add(doc["metadata"]["name"])
    assert names == {"disaggregatedinferences.pdfleet.io", "disaggregatedinferencescalers.pdfleet.io",
                     "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def test_chart_crd_is_the_generated_one():
    generated = REPO / "crds" / "pdfleet.io_disaggregatedinferences.yaml"
    copied = CHART / "crds" / "pdfleet.io_disaggregatedinferences.yaml"
    assert copied.read_bytes() == generated.read_bytes(), "run `make crds` to refresh the chart's copy"


def test_names_and_namespaces(rendered):
    for doc in rendered["default"]:
        if doc["kind"] in {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}:
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pdfleet"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_selectors_match_the_operator_pod(rendered, scenario):
    docs = rendered[scenario]
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container = operator_container(docs)
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert container["livenessProbe"]["httpGet"]["port"] in port_names
    for service in by_kind(docs, "Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    for monitor in by_kind(docs, "ServiceMonitor"):
        service = one(docs, "Service")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


def test_default_is_one_standalone_operator_for_all_namespaces(rendered):
    docs = rendered["default"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = operator_container(docs)["args"]
    assert args[0] == "operator"
    assert "--standalone" in args and "--all-namespaces" in args
    assert not [a for a in args if a.startswith(("--peering", "--namespace"))]
    assert "--liveness=http://0.0.0.0:8080/healthz" in args and "--metrics-port=9090" in args
    assert by_kind(docs, "ClusterKopfPeering") == [] and by_kind(docs, "Role") == []
    assert by_kind(docs, "ServiceMonitor") == [] and by_kind(docs, "ConfigMap") == []


def test_images_default_to_app_version(rendered):
    app_version = chart().metadata["appVersion"]
    container = operator_container(rendered["default"])
    assert container["image"] == f"ghcr.io/pdfleet/pdfleet-operator:{app_version}"
    assert env_value(container, "PDFLEET_DEFAULT_IMAGE") == f"ghcr.io/pdfleet/pdfleet-runtime:{app_version}"
    assert "latest" not in container["image"]


def test_image_overrides_and_digests(rendered):
    container = operator_container(rendered["custom"])
    assert container["image"] == "registry.example.com/ml/pdfleet-operator:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert env_value(container, "PDFLEET_DEFAULT_IMAGE") == "registry.example.com/ml/pdfleet-runtime@sha256:" + "ab" * 32


def test_peering_runs_replicas_that_hand_over(rendered):
    docs = rendered["peering"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = operator_container(docs)["args"]
    assert "--standalone" not in args and "--peering=pdfleet-ha" in args
    assert env_value(operator_container(docs), "POD_ID") == {"fieldRef": {"fieldPath": "metadata.name"}}
    peering = one(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "pdfleet-ha"


def test_watch_namespaces_gives_roles_and_flags(rendered):
    docs = rendered["namespaced"]
    args = operator_container(docs)["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": roles[0]["metadata"]["name"]}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "pdfleet", "namespace": NAMESPACE}]
    # The cluster role keeps only what kopf needs cluster-wide.
    cluster_resources = {r for rule in one(docs, "ClusterRole")["rules"] for r in rule["resources"]}
    assert cluster_resources == {"customresourcedefinitions"}


def test_namespaced_peering_objects(rendered):
    docs = rendered["namespaced-peering"]
    peerings = by_kind(docs, "KopfPeering")
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings] == [("team-a", "pdfleet")]
    assert by_kind(docs, "ClusterKopfPeering") == []


def test_service_monitor(rendered):
    monitor = one(rendered["servicemonitor"], "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "honorLabels": True,
                                             "interval": "30s", "scrapeTimeout": "10s"}]


def test_custom_values_reach_the_pod(rendered):
    docs = rendered["custom"]
    pod = one(docs, "Deployment")["spec"]["template"]
    container = operator_container(docs)
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}}
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert pod["spec"]["serviceAccountName"] == "existing-operator"
    assert by_kind(docs, "ServiceAccount") == []
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "existing-operator"
    assert env_value(container, "PDFLEET_LOG_LEVEL") == "debug"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert pod["metadata"]["annotations"] == {"example.com/team": "ml"}
    assert pod["metadata"]["labels"]["example.com/tier"] == "control"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["priorityClassName"] == "platform-critical"
    assert "--liveness=http://0.0.0.0:18080/healthz" in container["args"]
    assert "--metrics-port=19090" in container["args"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 18080, "metrics": 19090}
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == 9100


def test_argocd_health_configmap_carries_the_script(rendered):
    cm = one(rendered["custom"], "ConfigMap")
    script = (CHART / "files" / "argocd-health.lua").read_text()
    assert cm["data"]["resource.customizations.health.pdfleet.io_DisaggregatedInference"].strip() == script.strip()


def test_no_rule_uses_wildcards(rendered):
    for docs in rendered.values():
        for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], rule
                assert "resourceNames" not in rule and "nonResourceURLs" not in rule


def test_more_replicas_without_peering_fail_even_without_the_schema(tmp_path):
    # The template refuses it with a clear message, also where schema validation is skipped.
    copy_dir = Path(chart().save_dir(tmp_path))
    (copy_dir / "values.schema.json").unlink()
    with helm_python.Chart.load(str(copy_dir)) as unchecked:
        with pytest.raises(helm_python.HelmError, match="peering.enabled"):
            unchecked.render({"replicaCount": 2}, name="pdfleet", namespace=NAMESPACE)
        with pytest.raises(helm_python.HelmError, match="latest"):
            unchecked.render({"image": {"tag": "latest"}}, name="pdfleet", namespace=NAMESPACE)


def test_versions_agree_across_chart_package_and_operator():
    import tomllib

    from pdfleet.operator.plan import DEFAULT_IMAGE

    app_version = chart().metadata["appVersion"]
    assert app_version == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    # With no values, the operator gets the same runtime image it would pick without the chart.
    assert env_value(operator_container(render_docs({})), "PDFLEET_DEFAULT_IMAGE") == DEFAULT_IMAGE
