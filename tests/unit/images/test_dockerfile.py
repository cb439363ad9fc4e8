"""The Dockerfile's two targets, read without a Docker engine."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from dockerfile_model import ignored, parse, pin_problem, pip_installs, user_problem

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = parse((REPO / "Dockerfile").read_text())
IGNORE = (REPO / ".dockerignore").read_text().splitlines()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_targets_exist():
    names = DOCKERFILE.names()
    assert {"operator", "runtime"} <= set(names)
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("stage", DOCKERFILE.stages, ids=lambda s: s.name or s.base)
def test_every_base_is_pinned(stage):
    assert pin_problem(DOCKERFILE, stage) is None


def test_latest_appears_nowhere():
    assert not re.search(r":latest\b", (REPO / "Dockerfile").read_text())


@pytest.mark.parametrize(
    "text, problem",
    [
        ("FROM python\n", "no tag"),
        ("FROM python:latest\n", "latest"),
        ("FROM python:3.11-slim\n", "not an exact version"),
        ("ARG BASE\nFROM ${BASE}\n", "unresolved"),
    ],
)
def test_pin_check_flags_floating_bases(text, problem):
    # Negative controls for the pin check.
    dockerfile = parse(text)
    assert problem in (pin_problem(dockerfile, dockerfile.stages[0]) or "")


def test_pin_check_accepts_digests_args_and_stages():
    digest = "sha256:" + "0" * 64
    dockerfile = parse(f"ARG PY=python:3.11.13-slim\nFROM $PY AS a\nFROM a AS b\nFROM python@{digest}\n")
    assert [pin_problem(dockerfile, s) for s in dockerfile.stages] == [None, None, None]


def test_operator_target_runs_as_a_numeric_non_root_user():
    assert user_problem(DOCKERFILE.stage("operator")) is None


@pytest.mark.parametrize("user, problem", [(None, "no USER"), ("root", "not numeric"), ("0:0", "root"),
                                           ("app", "not numeric"), ("1000:app", "not numeric")])
def test_user_check_flags_root_and_names(user, problem):
    text = "FROM python:3.11.13-slim AS operator\n" + (f"USER {user}\n" if user else "")
    assert problem in (user_problem(parse(text).stage("operator")) or "")


def _stage_chain(name: str):
    """A target and the earlier stages it copies from."""
    stage = DOCKERFILE.stage(name)
    chain = [stage]
    for copy in stage.all("COPY"):
        source = re.search(r"--from=(\S+)", copy.value)
        if source:
            chain += _stage_chain(source.group(1))
    return chain


def test_operator_installs_only_the_operator_extra():
    installs = [args for stage in _stage_chain("operator") for args in pip_installs(stage)]
    assert installs, "no pip install found for the operator target"
    targets = [a for args in installs for a in args if not a.startswith("-")]
    assert targets == [".[operator]"]
    assert "operator" in PYPROJECT["project"]["optional-dependencies"]
    assert not any("vllm" in dep or "nixl" in dep for dep in PYPROJECT["project"]["optional-dependencies"]["operator"])


def test_operator_entrypoint_is_the_pdfleet_command():
    stage = DOCKERFILE.stage("operator")
    entrypoint = stage.last("ENTRYPOINT").exec_form
    assert entrypoint == ["pdfleet"]
    assert "pdfleet" in PYPROJECT["project"]["scripts"]
    cmd = stage.last("CMD").exec_form
    assert cmd and cmd[0] == "operator"


def test_runtime_is_the_vllm_image_of_the_pinned_vllm():
    runtime = DOCKERFILE.stage("runtime")
    assert runtime.base == "vllm/vllm-openai:v0.32.0"
    # The image's vLLM is the version the project tests against (the vllm extra's pin).
    pins = [d for d in PYPROJECT["project"]["optional-dependencies"]["vllm"] if d.startswith("vllm")]
    assert pins and all(d.endswith("==0.32.0") for d in pins), pins


def test_runtime_adds_the_connector_without_touching_vllm():
    runtime = DOCKERFILE.stage("runtime")
    installs = pip_installs(runtime)
    assert len(installs) == 1
    args = installs[0]
    assert [a for a in args if not a.startswith("-") and "constraint" not in a and not a.endswith(".txt")] == [
        ".[connector]"
    ]
    # Everything the base image ships is frozen into constraints: pip may add, never replace.
    assert "--constraint" in args or any(a.startswith("--constraint=") for a in args)
    assert not {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "--no-deps"} & set(args)
    connector_deps = PYPROJECT["project"]["optional-dependencies"]["connector"]
    assert not any(re.match(r"^(vllm|torch)\b", d) for d in connector_deps), connector_deps
    run = " ".join(r.value for r in runtime.all("RUN"))
    assert "base-constraints.txt" in run and "importlib.metadata" in run


def test_runtime_keeps_vllm_serve_as_its_entrypoint():
    assert DOCKERFILE.stage("runtime").last("ENTRYPOINT").exec_form == ["vllm", "serve"]
    assert user_problem(DOCKERFILE.stage("runtime")) is not None  # vLLM's image runs as root; pods set the user


def test_fleet_pod_commands_exist_in_the_runtime_image():
    # The operator starts engines with python3 -m <module> and the router with `pdfleet`.
    from pdfleet.operator.plan import plan

    resource = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                "metadata": {"name": "llama", "namespace": "ml"}, "spec": {"model": {"name": "m"}}}
    commands = {tuple(c["command"][:1]) for obj in plan(resource) if obj["kind"] in ("StatefulSet", "Deployment")
                for c in obj["spec"]["template"]["spec"]["containers"]}
    assert commands <= {("python3",), ("pdfleet",)}, commands
    assert "pdfleet" in PYPROJECT["project"]["scripts"]


@pytest.mark.parametrize("stage", ["operator-build", "runtime"])
def test_copied_sources_exist_and_reach_the_build_context(stage):
    for copy in DOCKERFILE.stage(stage).all("COPY"):
        if "--from=" in copy.value:
            continue
        words = [w for w in shlex.split(copy.value) if not w.startswith("--")]
        for source in words[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: missing from the repository"
            assert not ignored(source, IGNORE), f"COPY {source}: excluded by .dockerignore"
            if (REPO / source).is_dir():
                sample = next((REPO / source).rglob("*.py"))
                assert not ignored(str(sample.relative_to(REPO)), IGNORE), sample


def test_dockerignore_keeps_junk_out():
    for path in (".venv/bin/python", ".git/HEAD", "tests/unit/x.py", "bench/run.py",
                 "operator/__pycache__/cli.cpython-311.pyc", "charts/pdfleet/Chart.yaml"):
        assert ignored(path, IGNORE), path
    for path in ("pyproject.toml", "operator/cli.py", "connector/router/app.py"):
        assert not ignored(path, IGNORE), path


def test_parser_handles_continuations_and_comments():
    dockerfile = parse(
        "# syntax=docker/dockerfile:1\nFROM python:3.11.13-slim AS a\nRUN pip install \\\n"
        "    # a comment inside\n    --no-cache-dir x==1 && echo done\nCMD [\"a\", \"b\"]\nENTRYPOINT a b\n"
    )
    stage = dockerfile.stage("a")
    assert pip_installs(stage) == [["--no-cache-dir", "x==1"]]
    assert stage.last("CMD").exec_form == ["a", "b"]
    assert stage.last("ENTRYPOINT").exec_form is None
