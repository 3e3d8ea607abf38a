"""The dev set's Blackwell rows (Megatron-Bridge's performance-summary archive, B1/B2 of blackwell_dev.jsonl) map
to meshplan's inputs as their sources say.

Checked against truths the harness does not compute: each row's quoted table cells (``published.quote`` under the
column header ``published.location`` names), the README's conventions for FSDP, NVL72 racks and the container's
release, meshplan's own cluster parser, and Megatron-Core's pipeline-layout notation expanded by hand. One accuracy
ratchet, on B2 (eight rows, priced in seconds), the first Blackwell source within issue 26's 8%; BENCHMARKS.md reports
where the B1 rows stand.
"""
from __future__ import annotations

import re
import statistics

import pytest

from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.layout.splits import megatron_layout_stages
from meshplan.planner.layout.stacks import load_stacks
from tests.helpers import data_path, jsonl_rows, load_dev_set

dev_set = load_dev_set()


@pytest.fixture(scope="module")
def runs_dir():
    return data_path("published_runs")


@pytest.fixture(scope="module")
def rows(runs_dir):
    return jsonl_rows(runs_dir / "blackwell_dev.jsonl")


def _handed(inp) -> dict:
    """What ``plan_job`` is handed for a row: its ``--fix`` over its stack profile's values, the workload preset's
    included (``search.job.profile_pins``, the code path ``plan_job`` takes)."""
    from meshplan.planner.layout.space import parse_fix
    from meshplan.planner.model.config import load_model
    from meshplan.planner.search.job import profile_pins
    from meshplan.planner.search.workloads import JobFacts

    clus = load_cluster(inp.cluster)
    pins, _, _ = profile_pins(inp.profile, inp.dtype, load_model(inp.model), parse_fix(inp.fix_string), inp.task,
                              JobFacts(clus.device.name, inp.global_batch, clus.world_size, bool(inp.lora)))
    return pins.pinned()


def _cells(row: dict) -> dict[str, str]:
    """The quoted table row by its column header (the header is named in ``published.location``), each cell as
    the run the row is (``a (b)``: ``a`` for the main value, ``b`` for the parenthesized one)."""
    header = re.search(r"\(columns ([^)]*)\)", row["published"]["location"]).group(1).split("|")
    cells = [c.strip() for c in row["published"]["quote"].strip().strip("|").split("|")]
    assert len(header) == len(cells), row["name"]
    out = {}
    for h, c in zip(header, cells):
        m = re.fullmatch(r"(.+?) \((.+)\)", c)
        out[h] = (m.group(2) if row["published"]["value_used"] == "parenthesized" else m.group(1)) if m else c
    return out


def _num(cell: str) -> int:
    return 1 if cell in ("n/a", "-", "") else int(cell.replace(",", ""))


def test_every_jsonl_of_the_folder_is_read_with_its_source(runs_dir, rows):
    every = dev_set.load_rows(runs_dir)
    hopper = dev_set.load_rows(runs_dir, ("dev_runs.jsonl",))
    assert len(every) == len(hopper) + len(rows) == 33 + 228
    assert {r["source_id"] for r in rows} == {"B1", "B2"}
    assert sum(r["source_id"] == "B1" for r in rows) == 220  # the README: 220 pre-training, 8 SFT/LoRA


def test_layout_batch_and_zero_are_the_quoted_cells(rows, runs_dir):
    """Each B row's fix string pins the quoted row's TP, PP, CP, VP, EP, MBS, GBS and sequence; FSDP > 0 is
    Megatron-FSDP (zero=3), else the distributed optimizer (zero=1), as the README's convention says. A VP of 'n/a'
    on a pipelined row states no virtual stages: the fix leaves them to the launcher's preset (26.02.01's Llama 3 70B
    on GB300 quotes PP 4, VP n/a where its release's preset and the 26.02 table run VP 5)."""
    for row in rows:
        cell, inp = _cells(row), dev_set.row_needs(row, runs_dir)
        fix = dict(kv.split("=", 1) for kv in inp.fix_string.split(","))
        assert inp.n_gpus == int(cell["#-GPUs"]), row["name"]
        assert (inp.global_batch, inp.seq_len) == (int(cell["GBS"]), int(cell["Sequence Length"])), row["name"]
        for key, col in (("tp", "TP"), ("pp", "PP"), ("cp", "CP"), ("vpp", "VP"), ("ep", "EP")):
            if key == "vpp" and cell[col] == "n/a" and int(cell["PP"]) > 1:
                assert "vpp" not in fix, row["name"]
                continue
            assert int(fix[key]) == _num(cell[col]), (row["name"], key)
        stated_mbs = int(cell["MBS"])
        # the one row whose GA cell contradicts its MBS cell (README: the preset with its layout has mbs 1)
        assert int(fix["mbs"]) == (row.get("layout_assumptions") or {}).get("mbs", stated_mbs), row["name"]
        fsdp = _num(cell.get("FSDP", "0")) if cell.get("FSDP", "0") not in ("n/a", "-") else 0
        assert int(fix["zero"]) == (3 if fsdp > 0 else 1), row["name"]
        assert int(fix["dp"]) * int(fix["tp"]) * int(fix["pp"]) * int(fix["cp"]) == inp.n_gpus, row["name"]


def test_gb_systems_are_nvl72_racks_of_trays(rows, runs_dir):
    """GB200 / GB300: 4 GPUs per tray in NVL72 racks (a job over several racks laid out as the profile's launcher
    lays it, which the profile says, not the row); B200 / B300: 8-GPU nodes. meshplan's own parser reads the cluster
    back."""
    for row in rows:
        inp = dev_set.row_needs(row, runs_dir)
        cluster = load_cluster(inp.cluster)
        assert cluster.world_size == inp.n_gpus, row["name"]
        group = cluster.groups[0]
        if row["system"] in ("DGX-GB200", "DGX-GB300"):
            assert group.devices_per_node == 4 and row["nvlink_domain"] == 72
            racks = -(-inp.n_gpus // 72)
            assert group.domain_size == min(72, inp.n_gpus // racks if racks > 1 else 72), row["name"]
            assert (racks > 1) == any(p.startswith("cluster=") for p in inp.from_profile), row["name"]
        else:
            assert group.devices_per_node == 8 and group.domain_size == 8, row["name"]
        assert row["system"].removeprefix("DGX-") in inp.cluster


def test_each_row_takes_the_profile_of_its_container(rows, runs_dir):
    """The container of the table section names the Megatron-Bridge release (README: 25.09 -> r0.1.0 ... 26.06.01 ->
    v0.5.1); the profile priced is that release's performance scripts (which launched the runs), and cites it."""
    stacks = load_stacks()
    for row in rows:
        inp = dev_set.row_needs(row, runs_dir)
        version = row["container"].removeprefix("NeMo ")
        assert inp.profile == "megatron-bridge-perf@" + version, row["name"]
        assert f"@ {row['recipe']['release']} " in stacks.get(inp.profile).source, row["name"]
        if version != "25.09":  # every perf-scripts model config reduces gradients in bf16: the profile says so
            assert "grad_dtype=bf16" in inp.from_profile and not any(
                p.startswith("grad_dtype") for p in inp.per_row), row["name"]


def test_per_row_settings_stay_within_their_ratchet(rows, runs_dir):
    """Issue 25: a row is priced from its table's facts and its stack profile; what it needs beyond both is counted,
    with a goal of none. B2 needs nothing beyond the perf-scripts profile; B1's count may only fall (433 on
    2026-11-27, when the perf-scripts profiles took the bf16 gradient reduction every model config sets), except by a
    fact the rows ran and meshplan had left out: 459 since Nemotron 3 Super's two MTP passes (its recipe's
    ``mtp_num_layers = 2``, which the table's TFLOP/s confirm) are priced, one more setting on each of its 26 rows,
    472 since its NVFP4 rows keep their last 14 layers in bf16 (``bf16_last_layers``), one more on 13 rows, 498
    since the Llama 3 70B / 3.1 405B rows at TP > 1 keep their library recipe's ``tp_comm_overlap=True`` (the perf
    recipe functions inherit it for every precision but NVFP4; ``LIBRARY_TP_COMM_OVERLAP``), one more on 26 rows,
    505 since the seven 25.09 rows at TP > 1 keep r0.1.0 run_script.py's TP overlap (``R010_TP_COMM_OVERLAP``), and
    560 (median 2.5) since the MoE rows' CUDA graphs are a decision meshplan prices (``cuda_graphs``: each MoE
    layer's host wait after its token-count sync), one more on the 55 MoE rows whose preset captures none or the
    whole iteration (per-layer graphs are meshplan's own free choice: ``space.free_cuda_graphs``), and 276 (median
    1) since the perf-scripts profiles carry the launcher's own workload presets (``planner.search.workloads``: r0.1.0's
    perf matrices, the later tags' workload configs): what a row's preset sets is its profile's, chosen from the
    table's facts; 205 since a job over several racks is laid out as the perf launcher's own sbatch --segment rule
    lays it (``StackProfile.placement``), where each row had assumed it; 96 (median 0) since the library profiles
    hold what a model's recipe sets (``ProfileValue.model``: DeepSeek-V3's and Nemotron 3 Super's MTP layers, the
    account-for-embedding/loss split of Llama 3.1 405B and Qwen3-235B-A22B); 23 since they also hold what a recipe
    sets only on some mesh or in one precision (``ProfileValue.mesh``, ``when``): DeepSeek-V3's and Kimi-K2's
    pipeline layouts by (pp, vp), the Llama recipes' TP overlap at TP > 1 with sequence parallelism (off under
    NVFP4), r0.1.0's TP overlap for Qwen3-235B-A22B, Nemotron 3 Super's 14 bf16 layers under NVFP4 and Kimi-K2's
    fp8_param_gather off under MXFP8. What stays counted is r0.1.0's per-GPU run_script choices for DeepSeek-V3
    (shared-expert overlap and recompute modules differ on H100), 25.09's token dropping and the uneven splits.
    An uneven split the table leaves unsaid stays counted: left free, meshplan balances the stages by priced time,
    not as Megatron splits them."""
    counts = {"B1": [], "B2": []}
    for row in rows:
        counts[row["source_id"]].append(len(dev_set.row_needs(row, runs_dir).per_row))
    assert len(counts["B1"]) == 220 and sum(counts["B1"]) <= 23 and statistics.median(counts["B1"]) == 0
    assert counts["B2"] == [0] * 8


@pytest.mark.parametrize("word, dtype, fix, from_profile", [
    ("MXFP8", "fp8", "fp8=mxfp8", None), ("FP8-MX", "fp8", "fp8=mxfp8", None),
    ("FP8-CS", "fp8", None, "fp8=tensorwise"), ("FP8 (current", "fp8", None, "fp8=tensorwise"),
    ("NVFP4", "nvfp4", None, None), ("BF16", "bf16", None, None)])
def test_precision_words_map_to_the_perf_scripts_recipes(rows, runs_dir, word, dtype, fix, from_profile):
    """scripts/performance/utils/precision.py: fp8_cs -> current scaling (the profile's fp8 default), fp8_mx ->
    MXFP8 (stated per row), nvfp4 -> NVFP4 (the dtype's own recipe), bf16 -> bf16."""
    seen = [r for r in rows if r["precision_recipe"].startswith(word)]
    assert seen
    for row in seen:
        inp = dev_set.row_needs(row, runs_dir)
        assert inp.dtype == dtype, row["name"]
        assert fix is None or fix in inp.fix_string.split(","), row["name"]
        assert from_profile is None or from_profile in inp.from_profile, row["name"]
        assert ("fp8_params=true" in inp.from_profile) == (dtype == "fp8" and "Kimi" not in row["model"]), row["name"]


def test_megatron_pipeline_layouts_count_the_decoder_layers():
    """Megatron-Core ``pipeline_model_parallel_layout``: '|' splits virtual stages, 't' is a decoder layer, E / m / L
    the embedding, MTP and loss. The DeepSeek-V3 preset's layout written out by hand: E + 4 layers, 14 stages of 4,
    1 layer + MTP + loss (61 decoder layers on 16 virtual stages)."""
    by_hand = "Ettt" + "t|" + "tttt|" * 14 + "tmL"
    assert megatron_layout_stages("Et*4|(t*4|)*14tmL") == megatron_layout_stages(by_hand)
    assert megatron_layout_stages(by_hand) == (4,) * 15 + (1,)
    for stages in dev_set.DEEPSEEK_V3_LAYOUTS.values():
        assert sum(stages) == 61


def test_uneven_splits_the_source_leaves_unsaid(rows, runs_dir):
    """Llama 3.1 405B's 126 layers on pp x vpp = 32 virtual stages: Megatron's account-for-embedding/loss split
    (128 = 32 x 4 slots: E+3 | 4 x 30 | 3+L); on 128 virtual stages one slot each: the first virtual stage holds
    the embedding alone and the last the loss alone (E | 1 x 126 | L)."""
    by = {r["name"]: r for r in rows}
    from meshplan.planner.layout.space import Pins, stage_split
    from meshplan.planner.layout.splits import format_pp_layout

    def split(name: str) -> str:  # what plan_job splits: the recipe's own rule, its profile's pp_split (no pin)
        inp = dev_set.row_needs(by[name], runs_dir)
        handed = _handed(inp)
        assert not inp.missing and "pp_layout" not in handed and handed["pp_split"] == "megatron", name
        return format_pp_layout(stage_split(126, handed["pp"], handed["vpp"], Pins(**handed)))

    assert split("mbridge26.06-llama31-405b-gb300-fp8") == "3+4*30+3"
    assert split("mbridge26.06-llama31-405b-gb200-mxfp8") == "0+1*126+0"  # pp 16 x vp 8


def test_kimi_k2_rows_take_their_library_layout(rows, runs_dir):
    """Kimi-K2's perf presets set no pp_layout; the perf scripts take ``_get_kimi_k2_pipeline_layout(pp, vp)`` from
    the library recipe, whose (4, 4) entry is [embedding + 4 decoders], 14 x [4 decoders], [decoder + loss]: 4, 14
    x 4, 1 layers over the 16 virtual stages (written by hand from recipes/kimi/kimi_k2.py line 37). The library
    profile holds that map (``ProfileValue.mesh``), so the layout is the profile's, not a per-row setting, and
    ``plan_job`` is handed it; so is the perf scripts' ``fp8_param_gather = False`` under Muon with MXFP8."""
    kimi = [r for r in rows if r["model"].startswith("Kimi")]
    assert kimi
    for row in kimi:
        inp = dev_set.row_needs(row, runs_dir)
        assert (row["pp"], row["pp_interleave"]) == (4, 4), row["name"]
        assert "pp_layout=4*15+1" in inp.from_profile and "fp8_params=false" in inp.from_profile, row["name"]
        assert not any(p.startswith(("pp_layout", "fp8_params")) for p in inp.per_row), row["name"]
        handed = _handed(inp)
        assert tuple(handed["pp_layout"]) == (4,) * 15 + (1,) and handed["fp8_params"] is False, row["name"]


def test_lora_and_offload_rows_are_expressed(rows, runs_dir):
    """LoRA is the task's (``--lora``: rank 16 of llama3_70b_peft_config on the recipe's linear_qkv); the recipes'
    cpu_offloading_num_layers is ``offload_layers``, except where the table's layout is pipelined (Megatron-Core
    refuses CPU offloading with pp > 1: the recipe matched only closest). Hybrid Mamba rows are not skipped by
    name: they go to meshplan like the others."""
    by = {r["name"]: r for r in rows}
    lora = dev_set.row_needs(by["mbridge26.06-llama3-70b-lora-gb300-fp8"], runs_dir)
    assert not lora.missing and lora.lora == "16:qkv"
    offload = [r for r in rows if "CPU offloading" in str(r.get("recompute"))]
    assert offload
    for r in offload:
        inp = dev_set.row_needs(r, runs_dir)
        n = re.search(r"CPU offloading of (\d+) layers", r["recompute"]).group(1)
        assert not inp.missing
        assert (_handed(inp).get("offload_layers") == int(n)) == (r["pp"] == 1), r["name"]
    hybrid = [r for r in rows if r["meshplan_can_express"] == "hybrid Mamba"]
    assert len(hybrid) == 41
    assert all(not dev_set.row_needs(r, runs_dir).out_of_scope for r in hybrid)


def test_a_dense_a_moe_and_a_hybrid_row_price(rows, runs_dir, tmp_path):
    """The hybrid Mamba rows go to meshplan like the others (not skipped by name) and price now that the model side
    loads ``nemotron_h`` configs (the row's own config, its Mamba layers counted: tests/test_families.py)."""
    by = {r["name"]: r for r in rows}
    for name in ("mbridge25.11-llama3-8b-gb300-fp8mx", "mbridge26.06-qwen3-30b-a3b-gb300-mxfp8"):
        res = dev_set.price_row(by[name], runs_dir, tmp_path)
        assert res.status == "priced" and res.predicted_step_s > 0 and res.memory_gib > 0, (name, res.detail)
    nano = next(r for r in rows if r["meshplan_can_express"] == "hybrid Mamba" and r["model"] == "Nemotron_3_Nano")
    res = dev_set.price_row(nano, runs_dir, tmp_path)
    assert res.status == "priced" and res.predicted_step_s > 0, (nano["name"], res.status, res.detail)


def test_a_table_layout_no_gpu_holds_is_priced_at_its_release_recipe(rows, runs_dir, tmp_path):
    """26.02.01's Llama 3 70B NVFP4 on GB300 lists TP1 PP1 at MBS 2 without FSDP or recomputation: 131 GiB of bf16
    weights and as much gradient, then 80 layers' activations at 2 x 8192 tokens, on a 276 GiB GPU (607 GiB in all by
    meshplan's count, its memory model checked against Megatron's formula), so the layout as stated is refused. The
    row is priced at its release's recipe (v0.3.1 LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2), approximated and said
    so; the truth it must land on is the layout the 26.02 table quotes for the same model, system and precision."""
    by = {r["name"]: r for r in rows}
    name, earlier = "mbridge26.02.01-llama3-70b-gb300-nvfp4", "mbridge26.02-llama3-70b-gb300-nvfp4"
    as_stated = dev_set._price_as_stated(by[name], runs_dir, tmp_path, False)
    assert as_stated.status == "refused OOM" and as_stated.memory_gib > as_stated.memory_limit_gib
    res = dev_set.price_row(by[name], runs_dir, tmp_path)
    quoted = _cells(by[earlier])
    assert (quoted["TP"], quoted["PP"], quoted["VP"], quoted["MBS"]) == ("1", "4", "5", "1")
    assert res.status == "priced" and res.inputs["fix"] == dev_set.row_needs(by[earlier], runs_dir).fix_string
    assert res.inputs["approximated"][0].startswith("layout=recipe: v0.3.1 LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2")
    assert "refused OOM" in res.detail
    # a row whose table is its recipe has nothing to fall back to
    assert dev_set.recipe_layout_row(by[earlier]) is None
    # --profile-only reads no recipe of the row's (a run never seen comes with none): the launcher its profile names
    # runs its own preset for the job the table states, which lands on the same layout the 26.02 table quotes
    alone = dev_set.price_row(by[name], runs_dir, tmp_path, profile_only=True)
    assert alone.status == "priced" and alone.inputs["approximated"][0].startswith("layout=preset: ")
    assert "tp=1 pp=4 vpp=5 mbs=1" in alone.detail and "LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2" in alone.detail
    assert "refused OOM" in alone.detail


def test_a_table_expert_mesh_megatron_refuses_is_priced_at_its_recipe(rows, runs_dir, tmp_path):
    """25.09's DeepSeek-V3 GB200 row lists EP 64 at PP 8 over 256 GPUs: 32 ranks a stage, which Megatron-Core's
    expert mesh (EP x ETP divides a stage's TP x CP x DP) cannot hold. Its release's perf matrix runs PP 4 x VP 4."""
    by = {r["name"]: r for r in rows}
    res = dev_set.price_row(by["mbridge25.09-deepseekv3-gb200-fp8-32x32-tokendrop"], runs_dir, tmp_path)
    fix = dict(kv.split("=") for kv in res.inputs["fix"].split(","))
    assert res.status == "priced" and (fix["pp"], fix["vpp"], fix["ep"], fix["dp"]) == ("4", "4", "64", "64")
    assert "must divide" in res.detail and res.inputs["approximated"][0].startswith("layout=recipe: r0.1.0")
    # from the profile alone, the launcher's preset for 256 GB200s in MXFP8 (perf_matrix.gb200.num_gpus_256.fp8_mx)
    alone = dev_set.price_row(by["mbridge25.09-deepseekv3-gb200-fp8-32x32-tokendrop"], runs_dir, tmp_path, True)
    assert alone.status == "priced" and "pp=4(4*15+1) vpp=4 ep=64" in alone.detail
    assert "perf_matrix.gb200.num_gpus_256.fp8_mx" in alone.inputs["approximated"][0]


# B2's mean |error| on 2026-11-27 after the Blackwell GEMM level (OpenXLA's measured B200/H100 table), the MXFP8
# grouped share and GB300 speed (cuDNN frontend's MoE benchmark) and fp8 attention: 12.9 -> 6.0% (BENCHMARKS.md
# "Blackwell GEMMs against OpenXLA's measured B200/H100 table"), then 6.0 -> 4.9% with the MXFP8 GEMM's time over
# tensor-wise that Transformer Engine's B300 benchmark measured (``costmodel.te_gemm``), 3.9% by 2026-11-29, then
# 5.8% with the GB200 priced at its GEMMs' share held at the power limit (AIConfigurator's sweeps,
# ``costmodel.sustained``): its four GB200 rows go from -3% to +6% median where B1's 85 go from -7% to +1%, and the
# one GB200 / GB300 pair of one layout (LoRA, fp8) prices 1.22 against 1.205 published (``bench/part_pairs.py``).
# A guard with a little room, moved only with a physics change that says why.
B2_MEAN_ABS_ERROR_AT_MOST = 0.06


def test_b2_stays_within_its_ratchet(rows, runs_dir, tmp_path):
    b2 = [r for r in rows if r["source_id"] == "B2"]
    results = [dev_set.price_row(r, runs_dir, tmp_path) for r in b2]
    assert len(b2) == 8 and all(res.status == "priced" for res in results), [res.detail for res in results]
    assert statistics.mean(abs(res.error) for res in results) <= B2_MEAN_ABS_ERROR_AT_MOST


# B1's mean |error| (11.42% on 2026-11-27, once GPT-OSS's eager expert passes are priced; 10.31% on 2026-11-28 with
# Megatron-Core's Mamba layout copies and the router's measured eager top-k; 10.09% on 2026-11-29 with the routers'
# load-balancing loss; 10.69% on 2026-11-29 once each fp8 GEMM's backward quantizes its output gradient as
# Transformer Engine does, not twice its forward input, which had stood in for time meshplan still misses; 9.99% on
# 2026-11-29 with memory-bound ops floored at the streaming rate measured on their part and NVLink collectives at
# nccl-tests' times; 9.16% on 2026-11-29 with an x86 host's eager stretch at PyTorch's op-call ratio to Grace's;
# 8.95% once the GPU starts the routed experts no earlier than the host launches their grouped GEMMs; 8.44% with the
# GB200's GEMM share held at its power limit, AIConfigurator's sweeps): it may only
# fall, except by a fact the rows ran that meshplan had left out or counted wrong;
# BENCHMARKS.md records each step and what moved it. Pricing the 220 rows takes about 40 s, so this runs with the slow
# tests (`pytest -m slow`).
B1_MEAN_ABS_ERROR_AT_MOST = 0.087


@pytest.mark.slow
def test_b1_stays_within_its_ratchet(rows, runs_dir, tmp_path):
    b1 = [r for r in rows if r["source_id"] == "B1"]
    results = [dev_set.price_row(r, runs_dir, tmp_path) for r in b1]
    priced = [res for res in results if res.status == "priced"]
    assert len(b1) == 220 and len(priced) == 220, [res.detail for res in results if res.status != "priced"]
    # only the three tables whose layout cannot run price at their recipe's (a meshplan regression that refused
    # another row would otherwise hide behind the fallback)
    swapped = {res.name for res in results if any(a.startswith("layout=recipe") for a in res.inputs["approximated"])}
    assert swapped == {"mbridge26.02.01-llama3-70b-gb300-nvfp4", "mbridge26.02.01-llama3-70b-gb300-mxfp8",
                       "mbridge25.09-deepseekv3-gb200-fp8-32x32-tokendrop"}
    assert statistics.mean(abs(res.error) for res in priced) <= B1_MEAN_ABS_ERROR_AT_MOST


# B1 priced from its table's facts and its stack profile alone (``--profile-only``): 14.63% on 2026-11-28 once a free
# search tried what the presets run (activation offloading on Grace, the MoE recompute module lists), 10.92% once the
# perf-scripts profiles carry the launcher's workload presets (BENCHMARKS.md, "The perf-scripts profiles carry their
# launcher's presets"), 10.52% on 2026-11-28 over all 220 rows (the unrunnable tables at their launcher's preset, the
# Mamba layout copies, the eager top-k), 10.29% on 2026-11-29 with the load-balancing loss, 10.90% with the fp8
# backward's quantize of the output gradient (the ratchet above says why), 10.21% on 2026-11-29 with the two
# measurements the ratchet above names, 9.37% with the x86 host's op-call ratio, 9.16% with the experts' launch order,
# 8.62% with the GB200's GEMM share held at its power limit.
# Issue 26 asks 8%; a guard with a little room, moved only with a change that says why. Slow, as the ratchet above.
B1_PROFILE_ONLY_ABS_ERROR_AT_MOST = 0.089


@pytest.mark.slow
def test_b1_profile_only_stays_within_its_ratchet(rows, runs_dir, tmp_path):
    b1 = [r for r in rows if r["source_id"] == "B1"]
    results = [dev_set.price_row(r, runs_dir, tmp_path, profile_only=True) for r in b1]
    priced = [res for res in results if res.status == "priced"]
    assert len(priced) == 220, [res.detail for res in results if res.status != "priced"]
    # only the two tables whose layout cannot run under any recomputation price at their launcher's preset
    swapped = {res.name for res in results if any(a.startswith("layout=preset") for a in res.inputs["approximated"])}
    assert swapped == {"mbridge26.02.01-llama3-70b-gb300-nvfp4", "mbridge25.09-deepseekv3-gb200-fp8-32x32-tokendrop"}
    assert statistics.mean(abs(res.error) for res in priced) <= B1_PROFILE_ONLY_ABS_ERROR_AT_MOST


def test_summary_splits_b1_by_system_and_precision(rows, runs_dir):
    """The summary's groups (no pricing: the rows' inputs only)."""
    results = [dev_set.RowResult(r["name"], r["source_id"], 1.0, "priced", error=0.0,
                                 inputs=dev_set._inputs_dict(dev_set.row_needs(r, runs_dir))) for r in rows]
    names = [s["source"] for s in dev_set.summarize(results)]
    assert {"B1", "B2", "B1 DGX-GB300", "B1 DGX-B200", "B1 MXFP8", "B1 NVFP4", "B1 FP8-CS", "B1 BF16"} <= set(names)
    assert names[-1] == "all"


def test_token_drop_runs_route_at_capacity_one(rows, runs_dir):
    """25.09's '(tokendrop)' rows (the table's model label) ran Megatron-Bridge r0.1.0's apply_moe_token_drop:
    capacity factor 1.0, padded to capacity (the Qwen3 runs from their profile, whose launcher applies it to every
    Qwen3 run; DeepSeek-V3's from the row, whose launcher applies it on a flag); every other MoE row is dropless (the
    page's footnote)."""
    for row in rows:
        inp = dev_set.row_needs(row, runs_dir)
        held = inp.fix_string.split(",") + list(inp.from_profile)
        model_cell = row["published"]["quote"].strip().strip("|").split("|")[0]  # 25.09 / 25.11: the Model column
        assert ("moe_capacity=1" in held) == ("(tokendrop)" in model_cell), row["name"]
        if row["model"].startswith("Qwen3") and "(tokendrop)" in model_cell:
            assert "moe_capacity=1" in inp.from_profile and not inp.per_row, row["name"]


def test_recipe_module_lists_and_mtp_are_pinned_not_approximated(rows, runs_dir):
    """A recipe's ``recompute_modules=[...]`` is pinned as meshplan's ``recompute_modules`` with selective
    recomputation, and DeepSeek-V3's MTP layer (the recipe's ``mtp_num_layers = 1``; "(w/o MTP)" in the model label
    turns it off) as ``mtp=1``, Nemotron 3 Super's repeated module as ``mtp=2``: neither is an approximation any
    more."""
    from meshplan.planner.layout.decisions import RECOMPUTE_MODULES

    listed = 0
    for row in rows:
        inp = dev_set.row_needs(row, runs_dir)
        assert not {n.key for n in inp.approximated} & {"recompute_modules", "mtp"}, row["name"]
        said = re.search(r"recompute_modules=\[([^\]]*)\]", str(row.get("recompute") or ""))
        names = set(re.findall(r"'(\w+)'", said.group(1))) if said else set()
        if names and names != {"core_attn"} and not inp.missing:
            listed += 1
            handed = _handed(inp)  # the module list in the registry's order
            assert handed["recompute"] == "selective", row["name"]
            assert handed["recompute_modules"] == "+".join(m for m in RECOMPUTE_MODULES if m in names), row["name"]
        mtp = row["model"].startswith("DeepSeekV3") and "(w/o MTP)" not in row["model"]
        want = 2 if row["model"].startswith("Nemotron_3_Super") else 1 if mtp else 0
        assert _handed(inp).get("mtp", 0) == want, row["name"]
    assert listed >= 40


def test_nemotron_3_super_table_tflops_count_its_two_mtp_passes(rows, runs_dir):
    """The table's Model TFLOP/s per GPU over its tokens/s per GPU is the FLOPs it counts per token: 85.0-85.4 G for
    every Nemotron 3 Super row. Megatron-Core's count over the model's config matches that with the two MTP passes
    the recipe runs (``mtp=2``) within 1%, and misses it by 6-12% with none or one."""
    from meshplan.planner.model.config import load_model
    from meshplan.planner.model.flops import megatron_flops_per_token

    supers = [r for r in rows if r["model"].startswith("Nemotron_3_Super")]
    assert len(supers) == 26
    for row in supers:
        inp = dev_set.row_needs(row, runs_dir)
        model = load_model(inp.model)
        table_per_token = row["published"]["tflops_per_gpu_model"] * 1e12 / row["published"]["tokens_per_s_per_gpu"]
        counted = {k: megatron_flops_per_token(model.with_mtp(k), row["seq"]) for k in (0, 1, 2)}
        assert counted[int(_handed(inp)["mtp"])] == pytest.approx(table_per_token, rel=0.01), row["name"]
        assert all(abs(counted[k] / table_per_token - 1) > 0.05 for k in (0, 1)), row["name"]


def test_a_footnoted_kernel_regression_is_said_not_priced(rows, runs_dir):
    """26.06.01's GPT-OSS rows carry the page's footnote naming cudnn-frontend#256 (the fused expert MLP's
    grouped_gemm_dglu kernel 10x slower from cudnn-frontend 1.24.0): their inputs say so; the 26.06 rows of the same
    preset, without the footnote, do not."""
    for row in rows:
        if not row["name"].split("-")[0].endswith(("26.06", "26.06.01")) or "gptoss" not in row["name"]:
            continue
        said = [a for a in dev_set.row_needs(row, runs_dir).assumptions if "cudnn-frontend issue 256" in a]
        assert bool(said) == ("cudnn-frontend#256" in row["notes"]) == row["name"].startswith("mbridge26.06.01"), \
            row["name"]


def test_moe_all_to_alls_run_in_line_unless_the_preset_overlaps_them(rows, runs_dir):
    """Megatron-Bridge's CommOverlapConfig turns overlap_moe_expert_parallel_comm off unless a preset's moe_a2a_overlap
    turns it on (profile ``moe_overlap``): a MoE row prices the preset's choice, never a searched one."""
    seen = set()
    for row in rows:
        if not row.get("num_experts") or row["ep"] <= 1 or row.get("meshplan_can_express") != "yes":
            continue
        inp = dev_set.row_needs(row, runs_dir)
        pinned = _handed(inp).get("moe_overlap") is True
        assert pinned == bool((row["recipe"].get("workload_settings") or {}).get("moe_a2a_overlap")), row["name"]
        defaults = load_stacks().get(inp.profile).defaults(inp.dtype, True)
        assert defaults["moe_overlap"] == "false", inp.profile
        seen.add(pinned)
    assert seen == {True, False}


def test_cuda_graph_modes_come_from_the_presets(rows, runs_dir):
    """Each row's CUDA-graph mode, read from its preset (the workload settings quoted in blackwell_dev.jsonl): a
    whole-iteration graph (Qwen3-30B-A3B's 26.06 GB300 preset, cuda_graph_impl full_iteration), Transformer Engine
    graphs of the router and the dispatch preprocessing only (its 26.04.01 preset), none where the impl says none
    even though the scope names full_iteration (Llama 3 70B's NVFP4 presets); for the 25.09 rows, launched by
    r0.1.0's run_script.py, the perf matrix's cuda_graphs flag: Megatron-Core's per-layer graphs where it is true
    (Qwen3-30B-A3B's B200 entry), none where false (DeepSeek-V3's)."""
    by = {r["name"]: r for r in rows}
    expect = {"mbridge26.06-qwen3-30b-a3b-gb300-mxfp8": "whole iteration",
              "mbridge26.04.01-qwen3-30b-a3b-gb300-mxfp8": "partial",
              "mbridge26.04-llama3-70b-gb300-nvfp4": "none",
              "mbridge25.09-qwen3-30b-a3b-b200-fp8-unstated-tokendrop": "partial",
              "mbridge25.09-deepseekv3-b200-fp8-unstated-tokendrop": "none"}
    for name, mode in expect.items():
        inp = dev_set.row_needs(by[name], runs_dir)
        assert inp.cuda_graphs == mode, name
    ws = by["mbridge26.04-llama3-70b-gb300-nvfp4"]["recipe"]["workload_settings"]
    assert (ws["cuda_graph_impl"], ws["cuda_graph_scope"]) == ("none", "full_iteration")
    assert by["mbridge25.09-qwen3-30b-a3b-b200-fp8-unstated-tokendrop"]["recipe"]["settings"]["cuda_graphs"] is True


def test_moe_rows_are_summarized_by_cuda_graph_mode(rows, runs_dir):
    """The CUDA-graph groups split B1's MoE rows between them, each row once (the summary's counts, no pricing
    needed: a row's group is its inputs'; a group no row falls in, such as graphs of the mixers alone, is left out)."""
    results = [dev_set.RowResult(r["name"], "B1", 1.0, "priced", predicted_step_s=1.0, error=0.0,
                                 inputs=dev_set._inputs_dict(dev_set.row_needs(r, runs_dir)))
               for r in rows if r["source_id"] == "B1"]
    groups = dict(dev_set.summary_groups(results))
    moe = [r for r in rows if r["source_id"] == "B1" and r.get("num_experts")]
    names = [x.name for label, _ in dev_set.GRAPH_GROUPS for x in groups.get(f"B1 MoE, CUDA graphs: {label}", [])]
    assert sorted(names) == sorted(r["name"] for r in moe) and len(set(names)) == len(names)


def test_profile_only_leaves_every_per_row_setting_to_meshplan(rows, runs_dir):
    """``--profile-only`` prices a row as a run meshplan never saw: the table's facts and the stack profile pinned,
    each per-row layout setting left to the search (and still listed), the allocation kept, and recomputation,
    which the Megatron-Bridge tables never state, left free too. On Llama 3.1 405B's 26.06 GB300 FP8 row nothing is
    needed beyond the profile: the library recipe's TP overlap at TP > 1 and its uneven split of 126 layers (the
    account-for-embedding/loss rule) are the profile's. DeepSeek-V3's 25.11 GB300 row (no MTP) leaves its uneven
    split of 61 layers over pp 2 x vp 4 unsaid: a per-row setting, left to the search. On Nemotron 3 Super's the
    two MTP passes are the job's (its recipe's mtp_num_layers, the profile's), kept."""
    by = {r["name"]: r for r in rows}
    for name, per_row, left in (("mbridge26.06-llama31-405b-gb300-fp8", 0, {"recompute"}),
                                ("mbridge25.11-deepseekv3-gb300-bf16-nomtp", 1, {"pp_layout"})):
        full, free = dev_set.row_needs(by[name], runs_dir), dev_set.row_needs(by[name], runs_dir, profile_only=True)
        assert free.per_row == full.per_row and len(full.per_row) == per_row and free.cluster == full.cluster
        assert {k for k in full.fix if k not in free.fix} == left, name
        assert {k: v for k, v in full.fix.items() if k not in left} == free.fix, name
    llama = dev_set.row_needs(by["mbridge26.06-llama31-405b-gb300-fp8"], runs_dir, profile_only=True)
    assert "tp_overlap=true" in llama.from_profile and _handed(llama)["tp_overlap"] is True
    super_row = by["mbridge26.06-nemotron3-super-gb300-mxfp8"]
    assert _handed(dev_set.row_needs(super_row, runs_dir, profile_only=True))["mtp"] == 2


def test_the_host_band_counts_rows_whose_published_step_it_holds():
    """A row's band runs from its price to its price at the other published x86 host speed: a published step inside
    it is held, one outside is not, a row the other speed moves by 1% or less has no band, and a row without one is
    not counted."""
    def row(name, published, priced, other):
        return dev_set.RowResult(name, "B1", published, "priced", predicted_step_s=priced,
                                 error=priced / published - 1, host_speed_step_s=other)
    results = [row("inside", 11.0, 10.0, 12.0), row("above", 13.0, 10.0, 12.0), row("below", 9.0, 10.0, 12.0),
               row("flat", 11.0, 10.0, 10.05), row("none", 11.0, 10.0, None)]
    (b1, *_), = [[s for s in dev_set.summarize(results) if s["source"] == "B1"]]
    assert b1["host_band_rows"] == 3 and b1["host_band_holds_published"] == 1
    assert [dev_set.in_band(r, r.host_speed_step_s) for r in results[:3]] == [True, False, False]


def test_rows_a_footnote_marks_as_a_known_regression_are_counted_apart():
    """A row whose page footnote names a known kernel regression stays in the source's mean |error|; the summary
    also gives the mean over the other rows and the median |error|: two rows at +10% and -20% and a footnoted one at
    -50% give a mean of 26.7%, 15% outside it, and a median of 20%."""
    flagged = ["page footnote names a known regression: " + dev_set.KNOWN_REGRESSIONS["cudnn-frontend#256"]]

    def row(name, error, assumptions=()):
        return dev_set.RowResult(name, "B1", 10.0, "priced", predicted_step_s=10.0 * (1 + error), error=error,
                                 inputs={"assumptions": list(assumptions)})
    (b1, *_), = [[s for s in dev_set.summarize([row("a", 0.1), row("b", -0.2), row("c", -0.5, flagged)])
                  if s["source"] == "B1"]]
    assert b1["known_regression_rows"] == 1
    assert b1["mean_abs_error"] == pytest.approx(0.8 / 3)
    assert b1["mean_abs_error_outside_known_regressions"] == pytest.approx(0.15)
    assert b1["median_abs_error"] == pytest.approx(0.2)


def test_the_page_footnote_of_the_gpt_oss_regression_is_read_off_its_rows(rows):
    """Megatron-Bridge's 26.06.01 table footnotes its GPT-OSS 120B MXFP8 rows: 'Performance regression in GPT-OSS
    120B pre-training is a known issue (cudnn-frontend#256)'; no other B1 row carries a known-regression footnote."""
    named = {r["name"] for r in rows if r["source_id"] == "B1" and dev_set.known_regressions(r)}
    assert named == {"mbridge26.06.01-gptoss120b-gb200-mxfp8", "mbridge26.06.01-gptoss120b-gb300-mxfp8"}


def test_a_recipe_functions_all_to_all_is_the_rows_dispatcher(rows, runs_dir):
    """26.02.01's Qwen3 235B on B300: its preset names DeepEP, but the recipe function the row quotes sets
    moe_token_dispatcher_type = 'alltoall' after it, so the row runs the all-to-all, which its profile sets too (no
    per-row setting); the GB200 row, whose function sets 'flex', keeps the preset's Hybrid-EP."""
    by_name = {r["name"]: r for r in rows}
    b300 = dev_set.row_needs(by_name["mbridge26.02.01-qwen3-235b-a22b-b300-mxfp8"], runs_dir, True)
    assert "moe_dispatcher=alltoall" in b300.from_profile and not b300.per_row
    gb200 = dev_set.row_needs(by_name["mbridge26.02.01-qwen3-235b-a22b-gb200-mxfp8"], runs_dir, True)
    assert "moe_dispatcher=hybridep" in gb200.from_profile
