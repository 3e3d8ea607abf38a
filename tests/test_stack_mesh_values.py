"""Stack profile values that hold only on some mesh or in one precision (``ProfileValue.mesh``, ``when``).

Truths written by hand from Megatron-Bridge's own files: DeepSeek-V3's ``layout_map`` (recipes/deepseek/deepseek_v3.py
@ v0.4.0 lines 37-45: (4, 4) puts the embedding and 4 decoder layers first, 14 stages of 4, 1 layer with MTP and
loss last; (8, 1) 8, 6 x 8, 5; no entry for (2, 1)); ``CommOverlapConfig._get_model_comm_overlap_cfgs``
(training/comm_overlap.py @ v0.4.0 lines 442-448: TP overlap off at TP < 2 or without sequence parallelism); the
Llama perf configs' ``tp_comm_overlap = False if precision == "nvfp4"`` (scripts/performance/configs/llama/
llama31_llm_pretrain.py @ v0.4.0 line 75).
"""
from __future__ import annotations

import pytest
import yaml

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.layout.stacks import mesh_holds
from meshplan.planner.model.config import load_model
from meshplan.planner.search.job import PlanRequest, plan_job, profile_pins
from tests.test_stacks import _catalogue_in


@pytest.mark.parametrize("mesh, pinned, holds", [
    ("pp=4,vpp=4", {"pp": 4, "vpp": 4}, True),
    ("pp=4,vpp=4", {"pp": 4, "vpp": 2}, False),
    ("pp=4,vpp=4", {"pp": 4}, False),  # a degree left free: the value does not hold
    ("tp>1,sp!=false", {"tp": 2}, True),
    ("tp>1,sp!=false", {"tp": 2, "sp": True}, True),
    ("tp>1,sp!=false", {"tp": 2, "sp": False}, False),
    ("tp>1,sp!=false", {"tp": 1}, False),
    ("tp>1,sp!=false", {}, False),
    ("gpu=gb200", {"gpu": "gb200"}, True),
    ("gpu=gb200", {"gpu": "b200"}, False),
    ("gpu=gb200", {}, False),  # a job on no one GPU part
    ("moe_capacity=1", {"moe_capacity": 1.0}, True),  # numbers compare as numbers
    ("moe_capacity>0", {"moe_capacity": "1.25"}, True),
])
def test_a_mesh_condition_holds_only_on_the_pins_it_names(mesh, pinned, holds) -> None:
    assert mesh_holds(mesh, pinned) is holds


def _pins(stack: str, model: str, fix: str, dtype: str = "fp8") -> dict:
    return profile_pins(stack, dtype, load_model(model), parse_fix(fix))[0].pinned()


@pytest.mark.parametrize("pp, vpp, stages", [(4, 4, (4,) * 15 + (1,)), (8, 1, (8,) * 7 + (5,)), (2, 1, None)])
def test_deepseek_v3_takes_its_recipes_layout_on_the_recipes_meshes(pp, vpp, stages) -> None:
    got = _pins("megatron-bridge@26.04", "deepseek-v3", f"pp={pp},vpp={vpp}")
    assert (tuple(got["pp_layout"]) if "pp_layout" in got else None) == stages
    if stages:  # the user's own layout is the user's
        mine = "+".join(["1"] + [str(s) for s in stages[1:-1]] + [str(stages[-1] + stages[0] - 1)])
        assert tuple(_pins("megatron-bridge@26.04", "deepseek-v3", f"pp={pp},vpp={vpp},pp_layout={mine}")[
            "pp_layout"]) != stages


@pytest.mark.parametrize("dtype, fix, overlap", [
    ("fp8", "tp=8", True), ("bf16", "tp=8", True), ("nvfp4", "tp=8", False),
    ("fp8", "tp=1", None), ("fp8", "tp=8,sp=false", None), ("fp8", "", None)])
def test_llama_tp_overlap_holds_where_bridge_turns_it_on(dtype, fix, overlap) -> None:
    got = _pins("megatron-bridge-perf@26.04", "llama-3.1-405b", fix, dtype)
    assert got.get("tp_overlap") is overlap
    assert _pins("megatron-bridge@26.04", "llama-3.1-405b", fix, dtype).get("tp_overlap") is (
        None if overlap is None else True)  # the library recipe's, in every precision


def test_a_plan_on_the_recipes_mesh_prices_its_layout(tmp_path) -> None:
    """``plan_job`` with DeepSeek-V3 on the (4, 4) mesh: the plan's layout is the recipe's, not the search's split."""
    out = plan_job(PlanRequest.of("deepseek-v3", "64x4xGB200-NVL72", 8192, 4096, dtype="fp8", top=1,
                                  fix="tp=1,pp=4,vpp=4,ep=64,cp=1", stack="megatron-bridge@26.04",
                                  out=tmp_path / "p.yaml"))
    assert out.rows[0]["pp_layout"] == "4*15+1" and "pp=4(4*15+1)" in out.rows[0]["layout"]


def test_a_malformed_mesh_condition_is_refused_by_name(tmp_path, monkeypatch) -> None:
    body = {"name": "x", "version": "1", "title": "t", "source": "somewhere @ v1",
            "values": [{"key": "tp_overlap", "value": "true", "mesh": "tp>>1", "source": "somewhere @ v1"}]}
    load = _catalogue_in(tmp_path, monkeypatch, {"x@1.yaml": body})
    with pytest.raises(MeshplanError, match="x@1.yaml: not a stack profile"):
        load()
    (tmp_path / "x@1.yaml").write_text(yaml.safe_dump({**body, "values": [
        {"key": "pp_layout", "value": "4*15+1", "source": "somewhere @ v1"}]}))
    with pytest.raises(MeshplanError, match="'pp_layout' is the search's to choose"):
        load()  # a layout decision only with the mesh it belongs to


def test_a_models_own_mesh_value_replaces_the_one_for_every_model(tmp_path, monkeypatch) -> None:
    body = {"name": "x", "version": "1", "title": "t", "source": "somewhere @ v1", "values": [
        {"key": "tp_overlap", "value": "true", "model": "llama-3.1-405b", "mesh": "tp>1", "source": "recipe @ v1"},
        {"key": "tp_overlap", "value": "false", "mesh": "tp>1", "source": "somewhere @ v1"}]}
    prof = _catalogue_in(tmp_path, monkeypatch, {"x@1.yaml": body})().get("x@1")
    assert prof.mesh_defaults("llama-3.1-405b", "bf16", False, {"tp": 8}) == {"tp_overlap": "true"}
    assert prof.mesh_defaults(None, "bf16", False, {"tp": 8}) == {"tp_overlap": "false"}
    assert prof.mesh_defaults("llama-3.1-405b", "bf16", False, {"tp": 1}) == {}


@pytest.mark.parametrize("device, want", [
    ("B200", {"moe_capacity": "1", "shared_overlap": "true", "recompute": "selective",
              "recompute_modules": "mla_up_proj"}),
    ("GB200", {"moe_capacity": "1", "shared_overlap": "true", "recompute": "selective",
               "recompute_modules": "mla_up_proj"}),
    ("H100-SXM", {"shared_overlap": "false", "recompute": "selective", "recompute_modules": "mla_up_proj+mlp"}),
    ("GB300", {})])
def test_r010_run_script_sets_deepseek_v3_by_the_gpu(device, want) -> None:
    """Megatron-Bridge r0.1.0's scripts/performance/run_script.py (lines 56-98) keys DeepSeek-V3 on ``--gpu``:
    token dropping, the shared-expert overlap and ['mla_up_proj'] recomputation on B200 and GB200 (token dropping
    being their default); no shared-expert overlap (the 1F1B all-to-all overlap takes its place) and
    ['mla_up_proj', 'mlp'] on H100; nothing for a GPU it does not name."""
    from meshplan.planner.layout.stacks import load_stacks
    from meshplan.planner.search.workloads import JobFacts, stack_values

    keys = ("moe_capacity", "shared_overlap", "recompute", "recompute_modules")
    prof, spec = load_stacks().get("megatron-bridge-perf@25.09"), load_model("deepseek-v3")
    sets = stack_values(prof, spec, "fp8", {"pp": 16, "ep": 8}, "pretrain", JobFacts(device, 2048, 256))[0]
    got = {k: v for k, v in sets.items() if k in keys and k in want}
    assert got == want
    if not want:  # the launcher's DeepSeek-V3 branch sets none of these off its three GPUs
        assert not any(k in sets for k in ("moe_capacity", "shared_overlap", "recompute_modules"))
    assert "moe_capacity" not in stack_values(prof, spec, "fp8", {}, "pretrain", None)[0]  # no GPU said
