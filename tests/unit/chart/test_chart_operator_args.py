"""The operator container's command line, as the chart renders it, is one the real `pdfleet` CLI accepts."""

from __future__ import annotations

import argparse

import pytest

from chart_render import REPO, SCENARIOS, env_value, operator_container, render_docs
from pdfleet.operator import cli


def entrypoint() -> list[str]:
    # The operator image's ENTRYPOINT (Dockerfile target `operator`); the chart supplies only args.
    from dockerfile_model import parse

    stage = parse((REPO / "Dockerfile").read_text()).stage("operator")
    return stage.last("ENTRYPOINT").exec_form


def parse_container(container: dict, monkeypatch) -> argparse.Namespace:
    assert "command" not in container  # the image's entrypoint runs
    assert entrypoint() == ["pdfleet"]
    monkeypatch.setenv("PDFLEET_DEFAULT_IMAGE", env_value(container, "PDFLEET_DEFAULT_IMAGE"))
    argv = list(container["args"])
    parser, module = cli.build_parser(argv)
    assert module is not None and module.__name__ == "pdfleet.operator.reconcile.command"
    return parser.parse_args(argv)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_args_parse(scenario, monkeypatch):
    values = SCENARIOS[scenario]
    container = operator_container(render_docs(values))
    args = parse_container(container, monkeypatch)
    peering = values.get("peering", {}).get("enabled", False)
    namespaces = values.get("watchNamespaces", [])
    assert args.command == "operator"
    assert args.standalone is (not peering)
    assert args.peering == (values["peering"].get("name", "pdfleet") if peering else None)
    assert args.namespace == namespaces
    assert args.all_namespaces is (not namespaces)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.metrics_port == ports["metrics"]
    assert args.liveness == f"http://0.0.0.0:{ports['healthz']}/healthz"
    assert args.default_image == env_value(container, "PDFLEET_DEFAULT_IMAGE")
    assert args.log_format == values.get("logFormat", "plain")


def test_a_wrong_flag_is_refused(monkeypatch):
    # Negative control: the parser is strict, so a renamed flag would fail the test above.
    container = operator_container(render_docs({}))
    container["args"] = [*container["args"], "--metrics-address=0.0.0.0"]
    with pytest.raises(SystemExit):
        parse_container(container, monkeypatch)


def test_peered_replicas_get_distinct_kopf_priorities(monkeypatch):
    import kopf

    from pdfleet.operator.reconcile import command, logs

    seen = []
    monkeypatch.setattr(logs, "configure", lambda *a, **k: None)  # it would replace pytest's log handlers

    async def fake_operator(**kwargs):
        seen.append(kwargs.get("priority"))

    monkeypatch.setattr(kopf, "operator", fake_operator)
    container = operator_container(render_docs(SCENARIOS["peering"]))
    for pod in ("pdfleet-6f9c7d-abcde", "pdfleet-6f9c7d-fghij"):
        monkeypatch.setenv("POD_ID", pod)
        assert command.run(parse_container(container, monkeypatch)) == 0
    assert len(seen) == 2 and None not in seen and seen[0] != seen[1], seen
