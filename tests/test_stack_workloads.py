"""Workload presets: the ``megatron-bridge-perf`` profiles carry what Megatron-Bridge's performance scripts set for
each (model, task, GPU, precision), read from the scripts' own preset files (``planner.search.workloads``)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from meshplan.cli.main import app
from meshplan.planner.layout.stacks import load_stacks
from meshplan.planner.model.config import load_model
from meshplan.planner.search.workloads import (
    PRECISIONS,
    JobFacts,
    check_workloads,
    choose_preset,
    load_workloads,
    model_values,
    preset_pins,
)
from meshplan.planner.search.workloads_extract import (
    TAGS,
    parse_name,
    read_dispatcher_types,
    read_perf_matrix,
    read_presets,
)
from tests.helpers import data_path, jsonl_rows, load_dev_set

dev_set = load_dev_set()
RUNS = data_path("published_runs")


def test_a_preset_file_is_read_as_its_assignments_set_it():
    """``replace`` chains accumulate and a later field replaces an earlier one; a base preset is kept but its name
    parses to nothing; an alias line is the same preset (golden, by hand)."""
    src = (
        "from dataclasses import replace\nfrom utils.utils import WorkloadBaseConfig\n"
        "BASE_X_CONFIG = WorkloadBaseConfig(expert_tensor_parallel_size=1)\n"
        "X_PRETRAIN_CONFIG_GB300_V1 = replace(BASE_X_CONFIG, num_gpus=256, micro_batch_size=2, "
        "recompute_modules=['mla_up_proj'])\n"
        "X_PRETRAIN_CONFIG_GB300_FP8_MX_V1 = replace(X_PRETRAIN_CONFIG_GB300_V1, micro_batch_size=1, "
        "cuda_graph_impl='full_iteration', recompute_modules=[])\n"
        "X_PRETRAIN_CONFIG_GB300_NVFP4_V1 = X_PRETRAIN_CONFIG_GB300_V1\n")
    got = read_presets(src)
    assert got["X_PRETRAIN_CONFIG_GB300_FP8_MX_V1"] == ({
        "expert_tensor_parallel_size": 1, "num_gpus": 256, "micro_batch_size": 1,
        "cuda_graph_impl": "full_iteration", "recompute_modules": []}, 5)
    assert got["X_PRETRAIN_CONFIG_GB300_NVFP4_V1"][0] == {
        "expert_tensor_parallel_size": 1, "num_gpus": 256, "micro_batch_size": 2, "recompute_modules": ["mla_up_proj"]}
    assert parse_name("X_PRETRAIN_CONFIG_GB300_V1") is None and parse_name("BASE_X_CONFIG") is None


@pytest.mark.parametrize("name, parsed", [
    # v0.3.0 on: {model_recipe_name}_{task}_config_{gpu}_{compute_dtype}_{variant} (utils/utils.py)
    ("DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2", ("DEEPSEEK_V3", "pretrain", "GB300", "fp8_mx", "v2")),
    ("QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_MX_LARGE_SCALE",
     ("QWEN3_235B_A22B", "pretrain", "B200", "fp8_mx", "large_scale")),
    ("LLAMA3_70B_LORA_CONFIG_GB200_FP8_CS_V1", ("LLAMA3_70B", "lora", "GB200", "fp8_cs", "v1")),
    # v0.2.0: {model_name}_{model_size}_{gpu}[_{task}]_{compute_dtype}_BASE_CONFIG
    ("LLAMA3_70B_GB200_SFT_BF16_BASE_CONFIG", ("LLAMA3_70B", "sft", "GB200", "bf16", "")),
    ("QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG", ("QWEN3_30B_A3B", "pretrain", "H100", "fp8_cs", "")),
])
def test_preset_names_parse_in_both_naming_schemes(name, parsed):
    p = parse_name(name)
    assert (p["model"], p["task"], p["gpu"], p["dtype"], p["variant"]) == parsed


def test_an_r010_perf_matrix_merges_each_precision_over_common():
    """r0.1.0's launcher deep-merges a precision's block over ``common`` (utils/helpers.py
    apply_perf_matrix_overrides) and takes every precision, present or not; keys become WorkloadBaseConfig's (golden,
    by hand)."""
    src = ("perf_matrix:\n  gb200:\n    num_gpus_8:\n      common:\n        tp: 2\n        mbs: 4\n"
           "        cuda_graphs: true\n      fp8_mx:\n        mbs: 2\n")
    got = {name: (fields, line, gpu, dtype) for name, fields, line, gpu, dtype in read_perf_matrix(src)}
    assert set(got) == {f"perf_matrix.gb200.num_gpus_8.{d}" for d in ("bf16", "fp8_ds", "fp8_cs", "fp8_mx", "fp8_ss")}
    assert got["perf_matrix.gb200.num_gpus_8.fp8_mx"] == ({"num_gpus": 8, "tensor_model_parallel_size": 2,
                                                          "micro_batch_size": 2, "cuda_graphs": True}, 3, "GB200",
                                                         "fp8_mx")
    assert got["perf_matrix.gb200.num_gpus_8.bf16"][0]["micro_batch_size"] == 4


def test_every_perf_profile_carries_its_tags_presets():
    """Each ``megatron-bridge-perf`` profile has its presets (r0.1.0's perf matrices, the later tags' workload
    configs), read at the tag its own ``source`` names, each of a bundled model."""
    stacks = load_stacks()
    for version, tag in TAGS.items():
        ref = f"megatron-bridge-perf@{version}"
        wl = load_workloads(ref)
        assert wl is not None and wl.presets, ref
        assert f"@ {tag} " in wl.source and f"@ {tag} " in stacks.get(ref).source, ref
        check_workloads(ref)
    assert load_workloads("megatron-bridge@26.06.01") is None  # the library has no launcher


def test_the_preset_chosen_from_a_table_row_is_the_one_its_provenance_quotes():
    """Independent truth: each Blackwell dev-set row records the preset its run matched (``recipe.workload_config``,
    or for 25.09 the r0.1.0 perf-matrix entry, ``recipe.perf_matrix_entry``), found by the row's builder comparing the
    table's layout with every preset of the release. Chosen from the table's facts alone (model, GPUs, precision,
    task, degrees, batch, GPU count), the profile's preset is that one on every row, the "closest" matches included
    (a 25.09 entry's precision block is the table's precision, which the builder did not tell apart)."""
    rows = [r for r in jsonl_rows(RUNS / "blackwell_dev.jsonl") if r.get("recipe")]
    assert len(rows) == 228
    for row in rows:
        inp = dev_set.row_needs(row, RUNS, profile_only=True)
        said = [a.removeprefix(f"profile {inp.profile}: workload preset ") for a in inp.assumptions
                if "workload preset" in a]
        rec = row["recipe"]
        if rec.get("workload_config"):
            assert said == [rec["workload_config"]], row["name"]
        else:  # perf_matrix.<gpu>.num_gpus_<N>.<dtype>
            assert len(said) == 1 and said[0].rsplit(".", 1)[0] == rec["perf_matrix_entry"].rsplit(".", 1)[0], \
                row["name"]


def test_a_preset_sets_what_its_file_says():
    """DeepSeek-V3 on GB300 in MXFP8, 26.06.01 (v0.5.1 deepseek_workload_base_configs.py, the FP8_MX_V2 preset on
    top of FP8_MX_V1: full-iteration graphs, all-to-all overlap, the CuTe DSL fused grouped MLP, fp8 attention, an
    empty recompute list, Hybrid-EP, pp_layout 'Et*4|(t*4|)*14tmL', and its base's expert_tensor_parallel_size 1), on
    the preset's own mesh (pp 2 x vpp 8)."""
    spec = load_model("deepseek-v3")
    job = JobFacts("GB300", 4096, 256)
    pinned = {"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "mbs": 1}
    p = choose_preset("megatron-bridge-perf@26.06.01", spec, "fp8", "mxfp8", "pretrain", pinned, job)
    assert p.name == "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2"
    assert preset_pins(p, True, pinned, spec.num_layers) == {
        "cp": "1", "etp": "1", "recompute": "none", "cuda_graphs": "iteration", "moe_dispatcher": "hybridep",
        "moe_overlap": "true", "moe_fused_mlp": "true", "attention_dtype": "fp8", "pp_layout": "4*15+1",
        "schedule": "interleaved"}
    # another mesh: the preset's pipeline layout does not fit it, and a pin keeps its own value
    other = preset_pins(p, True, {**pinned, "pp": 4, "vpp": 4, "cuda_graphs": "none"}, spec.num_layers)
    assert "pp_layout" not in other and "cuda_graphs" not in other
    # nothing pinned: the launcher runs the preset's own mesh (FP8_MX_V1, whose degrees V2 keeps: pp 2, vpp 8, ep 32,
    # micro-batch 1)
    free = preset_pins(p, True, {}, spec.num_layers)
    assert {k: free[k] for k in ("tp", "pp", "vpp", "cp", "ep", "mbs", "pp_layout")} == {
        "tp": "1", "pp": "2", "vpp": "8", "cp": "1", "ep": "32", "mbs": "1", "pp_layout": "4*15+1"}
    # nothing for a model the presets do not cover, a GPU they do not name, or a precision without a preset
    assert choose_preset("megatron-bridge-perf@26.06.01", load_model("gpt2"), "bf16", "none", "pretrain", {},
                         job) is None
    assert choose_preset("megatron-bridge-perf@26.06.01", spec, "fp8", "mxfp8", "pretrain", {},
                         JobFacts("H200", 4096, 256)) is None
    assert ("fp8", "delayed") in PRECISIONS.values()


def test_free_degrees_take_the_launchers_default_variant():
    """With nothing pinned but the batch and GPU count of a V1 preset, V1 is chosen; with V2's, V2: the launcher's
    ``--config_variant`` (v2 by default) is what the job's stated batch selects."""
    spec = load_model("deepseek-v3")
    ref = "megatron-bridge-perf@26.06.01"
    v2 = choose_preset(ref, spec, "fp8", "mxfp8", "pretrain", {}, JobFacts("GB300", 4096, 256))
    v1 = choose_preset(ref, spec, "fp8", "mxfp8", "pretrain", {}, JobFacts("GB300", 2048, 256))
    assert (v1.variant, v2.variant) == ("v1", "v2")


def test_plan_names_the_preset_and_prices_with_it(tmp_path):
    """``meshplan plan --stack megatron-bridge-perf@26.06.01`` on the preset's job names the preset in its notes
    and plans with its settings; the library profile (no launcher) has no preset."""
    args = ["plan", "-m", "deepseek-v3", "-c", "64x4xGB300-NVL72", "-b", "4096", "-s", "4096", "--dtype", "fp8",
            "--fix", "fp8=mxfp8,tp=1,pp=2,vpp=8,ep=32,mbs=1,zero=1,mtp=1", "--json"]
    res = CliRunner().invoke(app, [*args, "--stack", "megatron-bridge-perf@26.06.01", "--out",
                                   str(tmp_path / "a.yaml")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert any("workload preset DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2" in n for n in out["warnings"])
    row = out["plans"][0]
    assert (row["cuda_graphs"], row["moe_overlap"]) == ("iteration", True), row
    res = CliRunner().invoke(app, [*args, "--stack", "megatron-bridge@26.06.01", "--out", str(tmp_path / "b.yaml")])
    assert res.exit_code == 0, res.output
    assert not any("workload preset" in n for n in json.loads(res.output)["warnings"])


def test_stacks_lists_each_profiles_presets():
    """``meshplan stacks --json`` counts each profile's workload presets and names where they were read; the library
    profiles have none."""
    res = CliRunner().invoke(app, ["stacks", "--json"])
    assert res.exit_code == 0, res.output
    by_ref = {p["ref"]: p for p in json.loads(res.output)}
    for version, tag in TAGS.items():
        perf = by_ref[f"megatron-bridge-perf@{version}"]
        assert perf["workload_presets"] == len(load_workloads(perf["ref"]).presets) > 0
        assert f"@ {tag} " in perf["workload_presets_source"]
        assert by_ref[f"megatron-bridge@{version}"]["workload_presets"] == 0


def test_a_refusal_under_a_preset_names_the_preset_in_one_line(tmp_path):
    """The user pinned pp=1 only; the preset's vpp 8 is what Megatron refuses beside it: the one line names the
    preset's values, so the user sees what to override (and nothing in brackets is swallowed as rich markup)."""
    res = CliRunner().invoke(app, ["plan", "-m", "deepseek-v3", "-c", "64x4xGB300-NVL72", "-b", "4096", "-s", "4096",
                                   "--dtype", "fp8", "--fix", "fp8=mxfp8,mtp=1,pp=1", "--stack",
                                   "megatron-bridge-perf@26.06.01", "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "vpp=8 needs pipeline parallelism" in lines[0], res.output
    assert "workload preset DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2" in lines[0] and "--fix any" in lines[0]


def test_a_preset_for_another_gpu_count_says_so(tmp_path):
    """Qwen3-235B on 64 H100s: the launcher's H100 preset lays out 256 GPUs (qwen3_workload_base_configs.py: the V1
    preset's num_gpus=256, which V2 keeps), whose EP 32 cannot fold over 64; the refusal says whose layout it is."""
    res = CliRunner().invoke(app, ["plan", "-m", "qwen3-235b-a22b", "-c", "8x8xH100", "-b", "512", "-s", "4096",
                                   "--stack", "megatron-bridge-perf@26.06.01", "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "a layout for 256 GPUs (this job has 64)" in lines[0], res.output


def test_the_perf_launcher_lays_a_job_over_racks_in_segments_of_at_most_18_nodes():
    """``sbatch --segment``, the largest divisor of the job's nodes up to 18, on 4-GPU trays (executors.py): 256 GPUs
    (64 nodes) in racks of 64, 160 GPUs (40 nodes) in racks of 40, a job of one rack or of 8-GPU nodes unsegmented
    (golden, by hand); every multi-rack Blackwell row is laid out so, none by a per-row assumption."""
    place = load_stacks().get("megatron-bridge-perf@26.06.01").placement
    assert (place.rack_gpus(256, 4), place.rack_gpus(160, 4), place.rack_gpus(72, 4), place.rack_gpus(256, 8)) == (
        64, 40, None, None)
    for row in jsonl_rows(RUNS / "blackwell_dev.jsonl"):
        inp = dev_set.row_needs(row, RUNS)
        assert not any(p.startswith("cluster=") for p in inp.per_row), row["name"]


def test_a_models_library_recipe_is_its_profile_value():
    """What the library's recipe for one model sets holds for that model (and one of its shapes) alone: DeepSeek-V3's
    one MTP layer (recipes/deepseek/deepseek_v3.py), Qwen3-235B-A22B's account-for-embedding/loss split
    (recipes/qwen/qwen3_moe.py), Nemotron 3 Super's two MTP passes from v0.4.0 only (its recipe arrived there); the
    perf profiles keep them from their library base and add their scripts' fused router (``moe_router_fusion``). Each
    MoE model's load-balancing loss is its model bridge's (DeepSeek-V3 seq_aux_loss, Qwen3 aux_loss). A row whose
    table says '(w/o MTP)' states mtp=0 over it."""
    stacks = load_stacks()
    lib, perf = stacks.get("megatron-bridge@26.06.01"), stacks.get("megatron-bridge-perf@26.06.01")
    dsv3, qwen = load_model("deepseek-v3"), load_model("qwen3-235b-a22b")
    for prof, more in ((lib, {}), (perf, {"moe_router_fusion": "true"})):
        assert model_values(prof, dsv3, "fp8") == {"mtp": "1", "moe_aux_loss": "seq_aux_loss", **more}
        assert model_values(prof, qwen, "bf16") == {"pp_split": "megatron", "moe_aux_loss": "aux_loss", **more}
        assert model_values(prof, load_model("llama-3.1-8b-instruct"), "bf16") == {}
    nomtp = load_model(str(RUNS / "configs" / "deepseek-v3-nomtp.json"))  # DeepSeek-V3's shapes, no MTP module
    # a config that describes no MTP module trains none
    assert model_values(lib, nomtp, "fp8") == {"moe_aux_loss": "seq_aux_loss"}
    assert "nemotron-3-super-120b-a12b" in lib.models
    assert "nemotron-3-super-120b-a12b" not in stacks.get("megatron-bridge@26.02.01").models
    assert "mtp=1" not in lib.defaults("fp8", True).items()  # no other model gets it
    nomtp = [r for r in jsonl_rows(RUNS / "blackwell_dev.jsonl") if "(w/o MTP)" in r["model"]]
    assert nomtp
    for row in nomtp:
        assert dev_set.row_needs(row, RUNS).fix.get("mtp") == "0", row["name"]


# Qwen3 235B's recipe functions as Megatron-Bridge v0.3.1 writes them (scripts/performance/configs/qwen/
# qwen3_llm_pretrain.py lines 89-138, bodies cut to the dispatcher's lines), and Kimi K2's, whose flex call comes last
RECIPE_FUNCTIONS = """
def qwen3_235b_a22b_pretrain_config_gb200(precision="bf16", mock=True, config_variant="v1"):
    cfg = qwen3_235b_a22b_pretrain_config()
    cfg.model.moe_flex_dispatcher_backend = base_cfg.moe_flex_dispatcher_backend
    cfg.model.moe_token_dispatcher_type = "flex"
    return cfg


def qwen3_235b_a22b_pretrain_config_b300(precision="bf16", mock=True, config_variant="v1"):
    cfg = qwen3_235b_a22b_pretrain_config()
    cfg.model.moe_flex_dispatcher_backend = base_cfg.moe_flex_dispatcher_backend
    cfg.model.moe_token_dispatcher_type = "alltoall"
    set_qwen3_common_configs(cfg)
    return cfg


def kimi_k2_pretrain_config_b200(precision="bf16", mock=True, config_variant="v1"):
    cfg.model.moe_token_dispatcher_type = "alltoall"
    apply_flex_dispatcher_backend(cfg.model, cfg.model.moe_flex_dispatcher_backend)
    return cfg


def set_qwen3_common_configs(cfg):
    cfg.model.moe_token_dispatcher_type = "alltoall"
"""


def test_a_recipe_functions_last_dispatcher_type_is_read():
    """The last literal dispatcher type each recipe function sets, unless a flex call follows it (Kimi K2's); helpers
    that are not recipe functions are not read."""
    assert read_dispatcher_types(RECIPE_FUNCTIONS) == {("QWEN3_235B_A22B", "pretrain", "GB200"): ("flex", 5),
                                                      ("QWEN3_235B_A22B", "pretrain", "B300"): ("alltoall", 12)}


def test_the_recipe_functions_all_to_all_overrides_the_presets_flex_backend():
    """Qwen3 235B on B300 in 26.02.01: the preset names DeepEP (QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_FP8_MX_V2), but
    the B300 recipe function sets moe_token_dispatcher_type = "alltoall" after it (qwen3_llm_pretrain.py @ v0.3.1
    line 133), so Megatron-Core runs its all-to-all dispatcher; on GB200 the function sets "flex" and the preset's
    Hybrid-EP runs."""
    spec = load_model("qwen3-235b-a22b")
    pinned = {"tp": 1, "pp": 8, "ep": 8, "mbs": 1}
    b300 = choose_preset("megatron-bridge-perf@26.02.01", spec, "fp8", "mxfp8", "pretrain", pinned,
                         JobFacts("B300", 4096, 256))
    assert b300.settings["moe_flex_dispatcher_backend"] == "deepep"
    assert (b300.recipe_dispatcher.type, b300.recipe_dispatcher.line) == ("alltoall", 133)
    assert preset_pins(b300, True, pinned, spec.num_layers)["moe_dispatcher"] == "alltoall"
    gb200 = choose_preset("megatron-bridge-perf@26.02.01", spec, "fp8", "mxfp8", "pretrain",
                          {**pinned, "ep": 32}, JobFacts("GB200", 4096, 256))
    assert preset_pins(gb200, True, pinned, spec.num_layers)["moe_dispatcher"] == "hybridep"


def test_under_whole_iteration_graphs_the_presized_all_to_all_takes_the_presets_backend():
    """26.06.01's Qwen3 235B on B200 graphs the whole iteration and its recipe function sets the all-to-all
    (qwen3_llm_pretrain.py @ v0.5.1 line 188), pre-sized by set_full_iter_cg_configs (lines 48-56): a sync-free mode
    meshplan's dispatchers do not name, priced as the preset's own sync-free flex backend; the same job priced as a
    dropless all-to-all would be refused under whole-iteration graphs."""
    spec = load_model("qwen3-235b-a22b")
    p = choose_preset("megatron-bridge-perf@26.06.01", spec, "fp8", "mxfp8", "pretrain", {},
                      JobFacts("B200", 4096, 256))
    assert p.recipe_dispatcher.type == "alltoall" and p.settings["cuda_graph_impl"] == "full_iteration"
    pins = preset_pins(p, True, {}, spec.num_layers)
    assert pins["cuda_graphs"] == "iteration"
    assert pins["moe_dispatcher"] == p.settings["moe_flex_dispatcher_backend"] != "alltoall"
