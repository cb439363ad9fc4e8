"""The local fleet plan (pure): CPU pinning, engine commands from the plan, local-only checks."""

from __future__ import annotations

import json

import pytest

from pdfleet.operator.api import parse
from pdfleet.operator.local.fleet import (
    EnginePorts, assign_cpus, awake_spec, local_errors, omp_bind, plan_local, shared_cpu_engines,
    spin_capped_engines, starts_at_zero,
)
from pdfleet.operator.plan.engine import ENGINE_MODULE, vllm_args


def resource(**spec_overrides):
    spec = {
        "model": {"name": "pdfleet/tiny-llama", "dtype": "float32", "maxModelLen": 4096},
        "engine": {"blockSize": 32},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "kvTransfer": {"bufferDevice": "cpu"},
    }
    for key, value in spec_overrides.items():
        spec[key] = value
    return parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                  "metadata": {"name": "tiny"}, "spec": spec})


def ports_for(spec):
    out, n = {}, 9000
    for role in ("prefill", "decode"):
        out[role] = []
        for _ in range(spec.role(role).replicas):
            out[role].append(EnginePorts(n, n + 100))
            n += 1
    return out


def test_two_engines_on_two_cpus_get_one_each():
    pinning, warnings = assign_cpus([0, 1], [1, 1])
    assert pinning == [[[0]], [[1]]]
    assert warnings == []


def test_cpus_split_evenly_and_contiguously():
    pinning, warnings = assign_cpus(range(8), [1, 1, 2])
    assert pinning == [[[0, 1]], [[2, 3]], [[4, 5], [6, 7]]]
    assert warnings == []
    pinning, _ = assign_cpus([0, 1, 2], [1, 1])
    assert pinning == [[[0, 1]], [[2]]]


def test_more_ranks_than_cpus_share_and_warn():
    pinning, warnings = assign_cpus([0, 1], [1, 1, 1])
    assert pinning == [[[0]], [[1]], [[0]]]
    assert len(warnings) == 1 and "3 engine ranks share 2 CPUs" in warnings[0]


@pytest.mark.parametrize("cpus, ranks, roles, pinning, shared", [
    # 2 prefill + 1 decode on 2 CPUs: decode alone on one, the prefills share the other
    ([0, 1], [1, 1, 1], ["prefill", "prefill", "decode"], [[[0]], [[0]], [[1]]], "2 prefill rank(s) on CPU(s) 0"),
    # 1 prefill + 2 decode: the decodes share, prefill keeps its CPU
    ([0, 1], [1, 1, 1], ["prefill", "decode", "decode"], [[[0]], [[1]], [[1]]], "2 decode rank(s) on CPU(s) 1"),
    # 3 + 3 on 4 CPUs: two CPUs per role, round robin inside the role
    (range(4), [1] * 6, ["prefill"] * 3 + ["decode"] * 3, [[[0]], [[1]], [[0]], [[2]], [[3]], [[2]]],
     "3 prefill rank(s) on CPU(s) 0,1, 3 decode rank(s) on CPU(s) 2,3"),
    # 3 + 1 on 3 CPUs: decode keeps one CPU of its own
    ([0, 1, 2], [1, 1, 1, 1], ["prefill"] * 3 + ["decode"], [[[0]], [[1]], [[0]], [[2]]],
     "3 prefill rank(s) on CPU(s) 0,1"),
    # a TP-2 decode and one prefill on 2 CPUs: the decode's ranks share its CPU
    ([0, 1], [1, 2], ["prefill", "decode"], [[[0]], [[1], [1]]], "2 decode rank(s) on CPU(s) 1"),
    # one CPU: nothing to separate
    ([0], [1, 1], ["prefill", "decode"], [[[0]], [[0]]], "1 prefill rank(s) on CPU(s) 0, 1 decode rank(s) on CPU(s) 0"),
])
def test_roles_never_share_a_cpu_when_engines_must_share(cpus, ranks, roles, pinning, shared):
    got, warnings = assign_cpus(cpus, ranks, roles)
    assert got == pinning
    assert len(warnings) == 1 and f"({shared})" in warnings[0] and "slow each other down" in warnings[0]
    if len(list(cpus)) > 1:  # no CPU holds ranks of both roles
        by_role = {}
        for role, engine in zip(roles, got):
            by_role.setdefault(role, set()).update(c for rank in engine for c in rank)
        assert not by_role["prefill"] & by_role["decode"]


def test_roles_must_match_ranks():
    with pytest.raises(ValueError, match="same length"):
        assign_cpus([0, 1], [1, 1], ["prefill"])


def test_omp_bind_joins_ranks_with_bars():
    assert omp_bind([[0, 1], [2]]) == "0,1|2"
    assert omp_bind([[3]]) == "3"


def test_engine_command_is_the_plans_with_local_host_ports_and_model():
    spec = resource().spec
    plan = plan_local(spec, revision="abc", model_path="/cache/tiny", cpus=[0, 1], ports=ports_for(spec),
                      base_env={}, python="/py")
    prefill, decode = plan.engines
    assert prefill.name == "prefill-0" and decode.name == "decode-0"
    expected = vllm_args(spec, "prefill", "abc", model="/cache/tiny", host="127.0.0.1", port=9000)
    assert prefill.argv == ("/py", "-m", ENGINE_MODULE, *expected)
    kv = json.loads(decode.argv[decode.argv.index("--kv-transfer-config") + 1])
    assert kv["kv_role"] == "kv_consumer" and kv["kv_connector"] == "PdfleetConnector"
    assert kv["kv_connector_module_path"] == "pdfleet.connector"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "9100"
    assert decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "9101"
    assert prefill.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert decode.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert prefill.url == "http://127.0.0.1:9000"
    assert plan.warnings == ()


def test_kv_cache_space_defaults_small_but_spec_and_user_win():
    spec = resource().spec
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1], ports=ports_for(spec), base_env={})
    assert plan.engines[0].env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1], ports=ports_for(spec),
                      base_env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.engines[0].env  # inherited from the runner
    spec = resource(engine={"blockSize": 32, "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "2"}]}).spec
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1], ports=ports_for(spec), base_env={})
    assert plan.engines[0].env["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_replicas_beyond_the_cpus_warn_and_share():
    spec = resource(prefill={"replicas": 2}, decode={"replicas": 1}).spec
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1], ports=ports_for(spec), base_env={})
    assert [e.name for e in plan.engines] == ["prefill-0", "prefill-1", "decode-0"]
    # the prefills share a CPU, decode has its own
    assert [e.env["VLLM_CPU_OMP_THREADS_BIND"] for e in plan.engines] == ["0", "0", "1"]
    # and every engine bounds vLLM's lost wake-ups (connector/adapter/vllm_workarounds.py)
    assert {e.env["PDFLEET_VLLM_SHM_RECHECK_MS"] for e in plan.engines} == {"50"}
    # every CPU is an engine's: all spin at most 5 ms after a read (the router and API servers need them too)
    assert [e.env.get("PDFLEET_VLLM_SHM_SPIN_MS") for e in plan.engines] == ["5", "5", "5"]
    # ... and poll inside that window with a 1 ms sleep, not sched_yield
    assert [e.env.get("PDFLEET_VLLM_SHM_SPIN_NAP_US") for e in plan.engines] == ["1000", "1000", "1000"]
    assert plan.warnings and "share" in plan.warnings[0]


def test_engines_with_cpus_to_spare_spin_as_vllm_does():
    spec = resource(prefill={"replicas": 1}, decode={"replicas": 1}).spec
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1, 2, 3], ports=ports_for(spec), base_env={})
    assert [e.env["VLLM_CPU_OMP_THREADS_BIND"] for e in plan.engines] == ["0,1", "2,3"]
    assert all("PDFLEET_VLLM_SHM_SPIN_MS" not in e.env and "PDFLEET_VLLM_SHM_SPIN_NAP_US" not in e.env
               for e in plan.engines)
    # one CPU each: the router and API servers run on them too, so both are capped
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1], ports=ports_for(spec), base_env={})
    assert [e.env.get("PDFLEET_VLLM_SHM_SPIN_MS") for e in plan.engines] == ["5", "5"]


def test_a_spec_env_sets_the_spin_either_way():
    spec = resource(prefill={"replicas": 1}, decode={"replicas": 1},
                    engine={"blockSize": 32, "env": [{"name": "PDFLEET_VLLM_SHM_SPIN_MS", "value": "1000"},
                                                     {"name": "PDFLEET_VLLM_SHM_SPIN_NAP_US", "value": "0"}]}).spec
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1], ports=ports_for(spec), base_env={})
    assert [e.env["PDFLEET_VLLM_SHM_SPIN_MS"] for e in plan.engines] == ["1000", "1000"]
    assert [e.env["PDFLEET_VLLM_SHM_SPIN_NAP_US"] for e in plan.engines] == ["0", "0"]


@pytest.mark.parametrize("pinning, shared", [
    ([[[0]], [[1]]], set()),
    ([[[0]], [[0]], [[1]]], {0, 1}),
    ([[[0], [1]], [[2]]], set()),  # one engine's two ranks on two CPUs share nothing with others
    ([[[0], [0]], [[1]]], set()),  # its own ranks sharing a CPU is not another engine's
    ([[[0, 1]], [[1, 2]], [[3]]], {0, 1}),
    ([[[0]], [[0]], [[0]]], {0, 1, 2}),
])
def test_shared_cpu_engines_table(pinning, shared):
    assert shared_cpu_engines(pinning) == shared


@pytest.mark.parametrize("pinning, capped", [
    ([[[0]], [[1]]], {0, 1}),                  # one CPU each: nothing beside the spinning reader
    ([[[0, 1]], [[2]]], {1}),
    ([[[0, 1]], [[2, 3]]], set()),             # CPUs to spare: spin as vLLM does
    ([[[0]], [[0]], [[1, 2]]], {0, 1}),
    ([[[0, 1]], [[0, 1]], [[2, 3]]], {0, 1}),  # shared with another engine: capped anyway
    ([[[0, 1], [2]], [[3, 4]]], {0}),          # any rank on a single CPU
    ([], set()),
])
def test_spin_capped_engines_table(pinning, capped):
    assert spin_capped_engines(pinning) == capped


def test_tensor_parallel_engine_gets_one_cpu_list_per_rank():
    spec = resource(decode={"replicas": 1, "tensorParallelSize": 2}).spec
    plan = plan_local(spec, revision="r", model_path=None, cpus=[0, 1, 2, 3], ports=ports_for(spec), base_env={})
    assert plan.role("prefill")[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert plan.role("decode")[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "2|3"


@pytest.mark.parametrize("overrides, field", [
    ({"kvTransfer": {"bufferDevice": "cuda"}}, "spec.kvTransfer.bufferDevice"),
    ({"engine": {"blockSize": 16}}, "spec.engine.blockSize"),
    ({"decode": {"replicas": 0}}, "spec.decode.replicas"),
])
def test_local_errors_name_the_field(overrides, field):
    errors = local_errors(resource(**overrides).spec, has_gpu=False)
    assert [e.field for e in errors] == [field]


def test_valid_cpu_resource_has_no_local_errors():
    assert local_errors(resource().spec, has_gpu=False) == []
    # With a GPU, a cuda buffer and any block size are fine.
    assert local_errors(resource(kvTransfer={"bufferDevice": "cuda"}, engine={"blockSize": 16}).spec,
                        has_gpu=True) == []


def _stz(prefill: int, decode: int, enabled: bool = True):
    scaling = {"minReplicas": 0, "maxReplicas": 1}
    return resource(prefill={"replicas": prefill, "autoscaling": scaling},
                    decode={"replicas": decode, "autoscaling": scaling}, router={"replicas": 1},
                    scaling={"scaleToZero": {"enabled": enabled}}).spec


@pytest.mark.parametrize("prefill, decode, enabled, asleep, errors", [
    (0, 0, True, True, []),  # the pair starts asleep
    (1, 1, True, False, []),  # starts up, sleeps when idle
    (0, 1, True, False, ["spec.prefill.replicas"]),  # half a pair at zero: no such start
    (1, 0, True, False, ["spec.decode.replicas"]),
    (0, 0, False, False, ["spec.prefill.replicas", "spec.decode.replicas"]),  # negative control: nothing wakes it
])
def test_a_pair_at_zero_replicas_starts_asleep_only_with_scale_to_zero(prefill, decode, enabled, asleep, errors):
    spec = _stz(prefill, decode, enabled)
    assert starts_at_zero(spec) is asleep
    assert [e.field for e in local_errors(spec, has_gpu=False)] == errors
    awake = awake_spec(spec)
    # a wake starts one of each role; any spec that does not start asleep is planned as it is
    assert [awake.role(r).replicas for r in ("prefill", "decode")] == ([1, 1] if asleep else [prefill, decode])
    assert spec.prefill.replicas == prefill  # the resource itself is left alone
