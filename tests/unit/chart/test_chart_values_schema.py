"""values.schema.json refuses bad values with a message naming the field, and is closed at every level."""

from __future__ import annotations

import json

import helm_python
import pytest

from chart_render import CHART, NAMESPACE, SCENARIOS, chart

# (values, the JSON pointer the error must name, a fragment of the constraint)
BAD_VALUES = {
    "unknown top-level key": ({"replicas": 2}, "at ''", "replicas"),
    "unknown nested key": ({"image": {"repo": "x"}}, "/image", "repo"),
    "unknown key in a list item": ({"tolerations": [{"key": "a", "effects": "NoSchedule"}]}, "/tolerations/0", "effects"),
    "wrong type": ({"replicaCount": "2"}, "/replicaCount", "want integer"),
    "wrong type, boolean": ({"peering": {"enabled": "yes"}}, "/peering/enabled", "want boolean"),
    "negative replicas": ({"replicaCount": -1}, "/replicaCount", "minimum"),
    "latest operator tag": ({"image": {"tag": "latest"}}, "/image/tag", "not"),
    "latest runtime tag": ({"runtimeImage": {"tag": "latest"}}, "/runtimeImage/tag", "not"),
    "malformed digest": ({"image": {"digest": "sha256:abc"}}, "/image/digest", "pattern"),
    "root user": ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser", "minimum"),
    "replicas without peering": ({"replicaCount": 2}, "/replicaCount", "maximum"),
    "bad namespace name": ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0", "pattern"),
    "duplicate namespaces": ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces", "are equal"),
    "unknown resource name": ({"resources": {"limits": {"nvidia.com/gpu": 1}}}, "/resources/limits", "nvidia.com/gpu"),
    "bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", "must be one of"),
    "bad port": ({"metrics": {"port": 70000}}, "/metrics/port", "maximum"),
    "unknown log format": ({"logFormat": "yaml"}, "/logFormat", "must be one of"),
    "non-string annotation": ({"podAnnotations": {"a": 1}}, "/podAnnotations/a", "want string"),
    "fallback share above 1": ({"metrics": {"prometheusRule": {"fallbackShare": 5}}},
                               "/metrics/prometheusRule/fallbackShare", "maximum"),
    "bad alert duration": ({"metrics": {"prometheusRule": {"notReadyFor": "ten minutes"}}},
                           "/metrics/prometheusRule/notReadyFor", "pattern"),
    "numeric dashboard label": ({"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}},
                                "/grafanaDashboard/labels/grafana_dashboard", "want string"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_refused_with_the_field_named(case):
    values, pointer, constraint = BAD_VALUES[case]
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart().render(values, name="pdfleet", namespace=NAMESPACE)
    message = str(err.value)
    assert pointer in message and constraint in message, message
    # validate_schema (what `helm lint` and install run) agrees with render.
    with pytest.raises(helm_python.HelmValuesError):
        chart().validate_schema(chart().merge_values(values))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_good_values_pass(scenario):
    # Positive control: the scenarios the other tests render are all valid.
    chart().validate_schema(chart().merge_values(SCENARIOS[scenario]))


def test_replicas_with_peering_are_allowed():
    chart().validate_schema(chart().merge_values({"replicaCount": 3, "peering": {"enabled": True}}))


# Free-form maps whose keys the user chooses (labels, annotations, selectors): their
# values are typed, but their keys cannot be listed.
STRING_MAPS = {
    "/serviceAccount/annotations", "/metrics/serviceMonitor/labels",
    "/metrics/podMonitor/labels", "/metrics/prometheusRule/labels",
    "/grafanaDashboard/labels", "/grafanaDashboard/annotations",
    "/podAnnotations", "/podLabels", "/nodeSelector",
}


def _objects(schema, pointer=""):
    if schema.get("type") == "object" or "properties" in schema:
        yield pointer, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from _objects(sub, f"{pointer}/{key}")
    if isinstance(schema.get("items"), dict):
        yield from _objects(schema["items"], f"{pointer}/*")


def test_schema_is_closed_at_every_level():
    schema = json.loads((CHART / "values.schema.json").read_text())
    seen = set()
    for pointer, node in _objects(schema):
        seen.add(pointer)
        if pointer in STRING_MAPS:
            assert node["additionalProperties"] == {"type": "string"}, pointer
        else:
            assert node.get("additionalProperties") is False, f"{pointer or '/'} is open"
    assert STRING_MAPS <= seen


def test_every_default_value_is_described_by_the_schema():
    # Every default is a key the schema knows, and every top-level section has a default.
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(chart().values) == set(schema["properties"])

    def keys(values, node, pointer=""):
        props = node.get("properties")
        if props is None:
            return
        assert set(values) <= set(props), f"{pointer or '/'}: values {sorted(values)} vs schema {sorted(props)}"
        for key, value in values.items():
            if isinstance(value, dict) and value:
                keys(value, props[key], f"{pointer}/{key}")

    keys(chart().values, schema)


def test_install_guide_mentions_every_top_level_value():
    guide = (CHART.parents[1] / "docs" / "install.md").read_text()
    undocumented = [key for key in chart().values if f"`{key}" not in guide]
    assert undocumented == []
