"""The dev-set harness (bench/dev_set.py) maps each published run to meshplan's inputs correctly.

Checked against truths the harness does not compute itself: the source's own table row (the quoted cells), the
README's step-time convention as stored in dev_runs.jsonl, the sources' own FLOP counters reproducing their
published TFLOP/s and MFU from the shapes the harness loads, and published parameter counts. No accuracy
thresholds on meshplan's predictions here (issue 13 sets those).
"""
from __future__ import annotations

import json
import math
import statistics

import pytest

from meshplan.planner.model.config import load_model
from tests.helpers import data_path, jsonl_rows, load_dev_set

dev_set = load_dev_set()


@pytest.fixture(scope="module")
def runs_dir():
    return data_path("published_runs")


@pytest.fixture(scope="module")
def rows(runs_dir):
    return jsonl_rows(runs_dir / "dev_runs.jsonl")


def _by_name(rows):
    return {r["name"]: r for r in rows}


def test_step_time_follows_the_readme_convention(rows):
    """Published seconds per step where given, else gbs*seq/(tokens_per_s_per_gpu*n_gpus) (README, Conventions)."""
    for r in rows:
        got = dev_set.published_step_s(r)
        stored = r.get("step_time_s_published_or_derived")
        if stored is not None:  # the curator's figure, rounded to 4 decimals
            assert got == pytest.approx(stored, abs=6e-5), r["name"]
        if r.get("published", {}).get("step_time_s"):
            # both published: the throughput column (4 significant digits) agrees with the step-time column
            assert dev_set.derived_step_s(r) == pytest.approx(got, rel=5e-3), r["name"]


def test_torchtitan_gpu_counts_match_the_rows_degrees(rows):
    """The GPU count the source states (64 A100; 128 H100 for 405B; 8 and 128 H100 in the 2024-12 benchmark)
    equals the product of the row's own degrees, and the quoted throughput is the row's."""
    for name, facts in dev_set.TORCHTITAN_FACTS.items():
        r = _by_name(rows)[name]
        assert facts["n_gpus"] == r["tp"] * r["pp"] * r["dp"] * r["cp"], name
        cells = [c.strip() for c in facts["quote"].strip("|").split("|")]
        assert r["published"]["tokens_per_s_per_gpu"] in {float(c.replace(",", "")) for c in cells
                                                          if c.replace(",", "").isdigit()}, name


def _cells(quote: str) -> list[str]:
    return [c.strip().strip("*") for c in quote.strip().strip("|").split("|")]


# Column order of the sources' tables (the quoted rows keep it).
# S1: NeMo performance_summary.md pretraining header (dev_runs.jsonl notes of the first row);
# S1f: its finetuning header | Model | Task | #-GPUs | GBS | MBS | Packed Sequence Length | TP | PP | ...
S1_COLS = ("model", "gpus", "gbs", "mbs", "seq", "tp", "pp", "cp", "vp")
S1F_COLS = ("model", "task", "gpus", "gbs", "mbs", "seq", "tp", "pp")


def test_layout_matches_the_quoted_table_row(rows, runs_dir):
    """Every pinned degree, batch and length equals the source's own cell (not the row's derived fields)."""
    checked = 0
    for r in rows:
        inp = dev_set.row_needs(r, runs_dir)
        if inp.out_of_scope or r["source_id"] == "T":
            continue
        if r["source_id"] == "S5":
            header = _cells(r["published"]["location"].split("header", 1)[1])
            cell = dict(zip([h.lower() for h in header], _cells(r["published"]["quote"])))
            want = {"gpus": cell["#gpus"], "gbs": cell["gbs"], "mbs": cell["mbs"], "seq": cell["seq length"],
                    "tp": cell["tp"], "pp": cell["pp"], "cp": cell["cp"], "ep": cell["ep"], "vp": cell["vp"],
                    "fsdp": cell["fsdp"]}
            # gbs = local batch x data-parallel ranks x gradient accumulation
            assert int(cell["gbs"]) == int(cell["lbs"]) * inp.fix["dp"] * int(cell["ga"]), r["name"]
            assert int(want["fsdp"]) == inp.fix["dp_shard"], r["name"]  # FSDP2 shards over the FSDP size
        else:
            cols = S1_COLS if r["source_id"] == "S1" else S1F_COLS
            want = dict(zip(cols, _cells(r["published"]["quote"])))
        fix = inp.fix
        assert int(want["gpus"]) == inp.n_gpus == int(inp.cluster.split("x")[0]) * int(inp.cluster.split("x")[1])
        assert int(want["gbs"]) == inp.global_batch and int(want["seq"]) == inp.seq_len, r["name"]
        assert int(want["mbs"]) == fix["mbs"], r["name"]
        for k in ("tp", "pp", "cp", "ep"):
            if want.get(k, "-") != "-":
                assert int(want[k]) == fix[k], (r["name"], k)
        if want.get("vp", "-") != "-":
            assert int(want["vp"]) == fix["vpp"], r["name"]
        assert fix["dp"] * fix["tp"] * fix["pp"] * fix["cp"] == inp.n_gpus, r["name"]
        checked += 1
    assert checked == 15 + 10  # NeMo 12 + 3 SFT rows, AutoModel 10 rows


def _nemo_flops_per_token(m, seq: int) -> float:
    """NVIDIA/NeMo nemo/utils/flops_formulas.py (llama2/llama3/nemotron/gpt3 are one formula: 18*ffn/h for a gated
    MLP, 12*ffn/h otherwise; gpt3 = ffn 4h, no GQA): L*h^2*(12 + 12g/a + c*ffn/h + 12s/h + 6V/(Lh)) per token."""
    L, h, a, g = m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads
    ffn_term = (18 if m.gated_mlp else 12) * m.ffn_hidden_size / h
    return L * h * h * (12 + 12 * g / a + ffn_term + 12 * seq / h + 6 * m.vocab_size / (L * h))


def test_nemo_flops_of_the_mapped_configs_reproduce_the_published_tflops(rows, runs_dir):
    """Pre-training rows: tokens/s x NeMo's FLOP formula over the shapes the harness loads = the table's TFLOP/s.
    (README: LLAMA2-7B 16934 tok/s -> 780.4 TF.) The SFT table counts FLOPs its own way (packed documents)."""
    for r in rows:
        if r["source_id"] != "S1":
            continue
        m = load_model(dev_set.row_needs(r, runs_dir).model)
        tf = _nemo_flops_per_token(m, r["seq"]) * r["published"]["tokens_per_s_per_gpu"] / 1e12
        assert tf == pytest.approx(r["published"]["tflops_per_gpu_model"], rel=2e-3), r["name"]


def test_torchtitan_mfu_of_the_mapped_configs_reproduces_the_published_mfu(rows, runs_dir):
    """torchtitan's counter 6N + 12*l*h*q*t over the mapped config reproduces the MFU column: N counts every
    parameter in the April 2024 A100 runs (train.py @ df2dcc7) and excludes the token embedding from 2024-04-26
    (commit 0c6ca90; the 405B rows of 2024-08); peak 312 TF (A100) / 989 TF (H100 SXM), torchtitan utils.py."""
    for name, facts in dev_set.TORCHTITAN_FACTS.items():
        if facts["mfu"] is None:
            continue
        r = _by_name(rows)[name]
        m = load_model(dev_set.row_needs(r, runs_dir).model)
        n = m.num_params - (m.embedding_params if r["layers"] == 126 else 0)
        per_token = 6 * n + 12 * m.num_layers * m.num_heads * m.head_dim * r["seq"]
        peak = 312e12 if "A100" in r["gpu"] else 989e12
        mfu = per_token * r["published"]["tokens_per_s_per_gpu"] / peak
        assert mfu == pytest.approx(facts["mfu"], abs=2e-3), name


# Total parameters the model's publisher states; tolerance = half a unit of the stated figure's last digit.
PUBLISHED_PARAMS = [
    ("automodel-dsv3-256", 671e9, 0.5e9, "DeepSeek-V3 technical report, abstract: 671B total parameters"),
    ("automodel-kimik2-256", 1e12, 0.05e12, "moonshotai/Kimi-K2 model card: 1T total parameters"),
    ("automodel-qwen3-30b-8", 30.5e9, 0.05e9, "Qwen/Qwen3-30B-A3B model card: 30.5B in total"),
    ("automodel-gptoss-120b-64", 116.8e9, 0.05e9, "OpenAI gpt-oss model card: gpt-oss-120b 116.8B total"),
    ("automodel-gptoss-20b-8", 20.9e9, 0.05e9, "OpenAI gpt-oss model card: gpt-oss-20b 20.9B total"),
    ("nemo2407-gpt3-175b-128", 175.0e9, 0.5e9, "Brown et al. 2020, Table 2.1: GPT-3 175.0B"),
    # the family names its models by total and active parameters without the MTP module, rounded down (Nano 31.6B
    # "30B-A3B", Super 120.7B "120B-A12B"): Ultra's 549.3B "550B-A55B" is checked to the tens
    ("automodel-nemotronv3-ultra-128", 550e9, 5e9, "NVIDIA-Nemotron-3-Ultra-550B-A55B; AutoModel's guide: 'The model "
     "has 55B active parameters and 550B parameters in total'"),
]


def test_ultra_config_reproduces_its_tables_flops(rows, runs_dir):
    """The transcribed Nemotron 3 Ultra preset (planner/presets/models/PROVENANCE.md) against an independent figure, the
    table's 293 TFLOP/s per GPU at 815 tokens/s (359.5 G per token): Megatron's count over it with the run's two MTP
    depths lands within 1% (357.1 G; 332.6 G without them)."""
    from meshplan.planner.model.flops import megatron_flops_per_token

    r = _by_name(rows)["automodel-nemotronv3-ultra-128"]
    inp = dev_set.row_needs(r, runs_dir)
    m = load_model(inp.model, mtp=True).with_mtp(int(inp.fix["mtp"]))
    table = r["published"]["tflops_per_gpu_model"] * 1e12 / r["published"]["tokens_per_s_per_gpu"]
    assert megatron_flops_per_token(m, r["seq"]) == pytest.approx(table, rel=0.01)
    assert megatron_flops_per_token(m.with_mtp(0), r["seq"]) < 0.95 * table


def test_nemo_rows_load_the_shapes_their_rows_state(rows, runs_dir):
    """Every NeMo row's stated shapes (dev_runs.jsonl: layers, hidden, heads, KV heads, FFN width, gated or not, read
    from the performance tables' model and its paper) are the config the harness prices: Nemotron-4 340B as itself
    (two-matrix squared-ReLU MLP of 4 x hidden, 8 query groups), not the gated stand-in of equal FLOPs its row names,
    whose MLP holds the same parameters."""
    fields = (("layers", "num_layers"), ("hidden", "hidden_size"), ("heads", "num_heads"),
              ("kv_heads", "num_kv_heads"), ("ffn", "ffn_hidden_size"), ("gated_mlp", "gated_mlp"))
    checked = 0
    for r in rows:
        if r["source_id"] not in ("S1", "S1f"):
            continue
        inp = dev_set.row_needs(r, runs_dir)
        m = load_model(inp.model)
        stated = {ours: r[theirs] for theirs, ours in fields if r.get(theirs) is not None}
        assert {k: getattr(m, k) for k in stated} == stated, r["name"]
        assert not [nd for nd in inp.approximated if nd.key == "arch"], r["name"]  # (SFT's packing is its own)
        checked += 1
    assert checked == 15
    real = load_model(dev_set.REAL_MODEL_OF_STAND_IN["configs/nemotron4-340b-flopeq-approx.json"])
    stand_in = load_model(str(runs_dir / "configs" / "nemotron4-340b-flopeq-approx.json"))
    assert real.ffn_hidden_size * 2 == stand_in.ffn_hidden_size * 3 and not real.gated_mlp and stand_in.gated_mlp


def test_nemo_rows_take_their_launcher_confs_from_the_profile(rows, runs_dir):
    """What each NeMo row's launcher conf sets beyond NeMo's defaults (the harness's own reading of the confs,
    ``NEMO_CONF``: userbuffer TP overlap, Nemotron 8B / 22B's fp32 gradient reduction, Nemotron-4 340B's bf16
    optimizer and in-line pipeline sends) the nemo@24.07 profile sets for the model of the row's shapes: no row needs
    a setting of its own, and the plan a user asks of the profile alone carries them."""
    by_model = {}
    for r in rows:
        if r["source_id"] not in ("S1", "S1f"):
            continue
        inp = dev_set.row_needs(r, runs_dir)
        assert not inp.per_row, (r["name"], inp.per_row)
        conf, _, ub, optim_dtype, grad_dtype, p2p = dev_set.NEMO_CONF[r["model"].split(" (")[0]]
        if ub:
            assert "tp_overlap=true" in inp.from_profile, r["name"]
        if r["source_id"] == "S1":
            assert f"grad_dtype={grad_dtype}" in inp.from_profile and f"optim_dtype={optim_dtype}" in inp.from_profile
            if r["pp"] > 1 and (r.get("pp_interleave") or 1) > 1:
                assert inp.from_profile.count(f"pp_overlap={str(p2p).lower()}") == (not p2p), r["name"]
            by_model[conf] = inp
    from meshplan.planner.layout.stacks import load_stacks
    from meshplan.planner.search.workloads import model_values, stack_values

    prof = load_stacks().get("nemo@24.07")
    sets = model_values(prof, load_model("nemotron-4-340b"), "fp8")
    assert sets == {"optim_dtype": "bf16", "pp_overlap": "false"}
    pins = {"tp": 2, "sp": True}
    got, _, _ = stack_values(prof, load_model("nemotron-3-8b-base-4k"), "fp8", pins)
    assert got["tp_overlap"] == "true" and got["grad_dtype"] == "fp32"
    got, _, _ = stack_values(prof, load_model("nemotron-3-8b-base-4k"), "fp8", {"tp": 1})
    assert "tp_overlap" not in got  # userbuffers need tensor parallelism
    assert len(by_model) == 11


@pytest.mark.parametrize("name,total,tol,source", PUBLISHED_PARAMS, ids=[p[0] for p in PUBLISHED_PARAMS])
def test_parameter_counts_of_the_mapped_configs(rows, runs_dir, name, total, tol, source):
    m = load_model(dev_set.row_needs(_by_name(rows)[name], runs_dir).model)
    assert abs(m.num_params - total) <= tol, f"{name}: {m.num_params / 1e9:.3f}B vs {source}"


@pytest.fixture(scope="module")
def priced(runs_dir):
    """The Hopper dev set priced once (bench/dev_set.py's run: each row through plan_job with its layout pinned; the
    Blackwell rows of blackwell_dev.jsonl: tests/test_dev_set_blackwell.py)."""
    return dev_set.run(runs_dir, ("dev_runs.jsonl",))


def test_every_row_is_reported(runs_dir, rows, priced):
    """No row is dropped: a hybrid Mamba row without a config would be out of scope (none is since Nemotron V3
    Ultra's was transcribed); every other row is priced or refused with the miss in GiB, and none is inexpressible
    (issue 12 item 9:
    DeepSeek-V3 PP4 x VPP8 over 61 layers, Kimi-K2 PP8 x VPP4, Qwen3 / GPT-OSS expert meshes, torchtitan's op-level
    checkpointing are all written with --fix)."""
    results, summary = priced
    assert [r.name for r in results] == [r["name"] for r in rows]
    out = {r.name for r in results if r.status == "out of scope"}
    assert out == {r["name"] for r in rows if str(r.get("meshplan_can_express", "yes")).startswith("no")
                   and r["name"] not in dev_set.HYBRID_CONFIGS}
    for r in results:
        assert r.status in ("priced", "not expressible", "refused OOM", "out of scope"), r.name
        if r.status == "priced":
            assert math.isfinite(r.error) and r.predicted_step_s > 0, r.name
        if r.status == "refused OOM":
            assert r.memory_gib > r.memory_limit_gib, r.name
    missing = {r.name: r.detail for r in results if r.status == "not expressible"}
    assert not missing
    assert summary[-1]["rows"] == len(rows) - len(out)


# No row is refused as out of memory since the optimizer states follow what NeMo 24.07 ran (apex DistributedFusedAdam
# as NeMo r2.0.0rc1 sets it up; bench/dev_set.py NEMO_CONF): the two rows refused before (nemotron-340b by 1.9 GiB,
# sft-llama2-70b by 13.2 GiB) run ``optim.dtype: bf16`` confs. A row listed here is expected to be refused.
STILL_REFUSED: dict[str, str] = {}


@pytest.mark.parametrize("name", [
    pytest.param(r["name"], marks=pytest.mark.xfail(strict=True, reason=STILL_REFUSED[r["name"]]))
    if r["name"] in STILL_REFUSED else r["name"]
    for r in map(json.loads, data_path("published_runs", "dev_runs.jsonl").read_text().splitlines())
    if not str(r.get("meshplan_can_express", "yes")).startswith("no")])
def test_published_layout_is_expressed_and_fits(name, priced, rows):
    """Each published run, with the layout its source quotes (``published.quote`` of dev_runs.jsonl, checked cell by
    cell in test_layout_matches_the_quoted_table_row), is written with --fix and priced, not refused as out of
    memory (issue 12 item 9)."""
    results, _ = priced
    (r,) = [x for x in results if x.name == name]
    row = _by_name(rows)[name]
    quote = row["published"].get("quote") or dev_set.TORCHTITAN_FACTS[name]["quote"]  # torchtitan: the harness
    assert r.status == "priced", (name, r.status, r.detail, quote)  # priced = fits in the device's memory
    assert r.predicted_step_s > 0 and r.memory_gib > 0


# NeMo-Framework-Launcher 24.07, launcher_scripts/conf/config.yaml, env_vars (exported for every stage the launcher
# runs): "NVTE_FUSED_ATTN: 0 # Disable cudnn FA until we've tested it more". Transformer Engine 1.8's
# DotProductAttention then leaves cuDNN fused attention out and runs FlashAttention-2.
# FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608), Fig. 5 (forward, causal) and Fig. 6 (backward, no
# mask), H100 SXM5, head dim 128, sequence 2048: FlashAttention-2 298 / 291 TFLOP/s; its forward without the mask
# 362, so the causal backward runs at most 291 and at least 291 * 298 / 362 = 240.
FA2_H100_SEQ2048_TFLOPS = (240.0, 298.0)


def test_nemo_rows_run_flashattention2_as_the_launcher_sets(rows, runs_dir, tmp_path):
    for row in rows:
        if row["source_id"] in ("S1", "S1f"):
            inp = dev_set.row_needs(row, runs_dir)  # the NeMo 24.07 profile sets it; no row overrides it
            assert "attention=flash2" in inp.from_profile and "attention" not in inp.fix, row["name"]
    from meshplan.planner.search.job import PlanRequest, plan_job

    inp = dev_set.row_needs(_by_name(rows)["nemo2407-gpt3-5b"], runs_dir)  # seq 2048, head dim 128
    out = plan_job(PlanRequest.of(inp.model, inp.cluster, inp.global_batch, inp.seq_len, fix=inp.fix_string, top=1,
                                  stack=inp.profile, dtype=inp.dtype, name="devset", out=tmp_path / "plan.yaml",
                                  explain=True))
    eff = out.plan.explain["efficiency_stage0"]["attention bf16 (flash2)"]
    lo, hi = FA2_H100_SEQ2048_TFLOPS
    assert lo <= eff["achieved"] / 1e12 <= hi


# The dev set's accuracy, per source, as measured on 2026-11-26 after the pipeline-send and shared-expert overlaps,
# FSDP2's copy passes, the fp32 gradient reduction of torchtitan and AutoModel's MoE blocks, and the fused SwiGLU
# priced once over its outputs, in a cost-model class of its own (it was counted twice, and its measurements sat in
# the unary class; BENCHMARKS.md "Dev set": S1 5.9, S1f 4.5, S5 7.7, T 4.4%): a regression guard with a little room,
# not the target (issue 13 asks <= 8% per source): a ratchet, moved only with a physics change that says why (the
# S1 and T bounds rose with the SwiGLU fix, whose double count those rows had rested on; S5 fell from 8.5% to 6.5%
# with the MoE terms priced from kernel measurements: grouped GEMMs, token permutes, DeepEP's per-rank copies and
# DeepSeek-V3's group-limited routing, S5 7.7 -> 5.7%). Moved again by the sustained-load share (2026-11-27:
# tensor-core ops at 0.938 of their one-shot rate on H100, measured on an H100 and two H200s held at their 700 W cap,
# memory-bound ops at HBM speed; BENCHMARKS.md "Sustained load"): S1 5.9 -> 5.3% (its median error -4.5 -> +0.2%),
# S1f 4.5 -> 9.8%, S5 5.8 -> 8.0%; T is on 500 W H100s, which no measurement covers. The SFT rows and the MoE rows had
# rested on GEMMs priced at the rate of a cool GPU; S5's largest misses are the cross-node expert all-to-alls (issue
# 25), and its rows with busy fractions near 0.55 keep most of their boost (BENCHMARKS.md, the duty-cycle table),
# which the share does not model. Tightened 2026-11-27 when Transformer Engine's quantized sequence-parallel gathers
# were priced (S1 5.3 -> 4.8%, S1f 9.8 -> 9.6%). Raised for S5 the same day (8.0 -> 11.8%) when GPT-OSS's eager
# expert passes were priced (the fc2 bias added in fp32 per expert, as Megatron-Core and AutoModel both run it, and
# the clamp or fc1-bias passes around the fc1 output): the two AutoModel GPT-OSS rows, -3% and +5% while every
# other AutoModel MoE row on one or eight nodes stood at +17..+24%, had rested on those passes being free; they now
# stand with the rest (+16%, +17%), and that common over-price is AutoModel's, not GPT-OSS's (BENCHMARKS.md).
# Raised again for S5 (11.8 -> 12.0%, bound 12.5%) when head-dim-64 attention took the FlashAttention-3 paper's
# d64 curves: the same two GPT-OSS rows (head dim 64) go +16.4 -> +17.5% and +17.5 -> +18.2% on that common
# over-price, while 20 of the 23 Megatron-Bridge GPT-OSS rows, those priced too fast, move toward their published
# times (BENCHMARKS.md "Head dim 64"). Raised again for S5 (12.0 -> 13.0%, bound 13.5%) when Megatron-Core's unfused
# RoPE on YaRN models was priced (five passes over q and k, counted from its own code by tests/test_rope_passes.py):
# the same two rows go +17.5 -> +21.9% and +18.2 -> +21.2% (AutoModel runs its own eager RoPE, four passes' worth),
# while all 23 Megatron-Bridge GPT-OSS rows move up, 19 of them toward their published times (BENCHMARKS.md "YaRN").
# Raised again (13.0 -> 14.6%, bound 15%) when Megatron-Core's eager chains around GPT-OSS's kernels were priced at
# what they took on an H200 (bench/gpu_rope.py; tests/test_gpu_rope.py): RoPE at 7 elementwise passes, the fc1 clamp
# at 3 where 2 had stood. The two rows go to +28.7% and +25.7% (AutoModel's own chains are the same kind of broadcast
# multiplies and cats), and 19 of the 23 Megatron-Bridge rows move closer.
# Tightened for S5 (14.7 -> 12.3%, bound 13%) when AutoModel's fake balanced gate, which the table states, was priced
# as it routes (``moe_router=contiguous``: a token's copies on adjacent experts, so on one or two ranks; DeepEP sends
# one copy per rank and node): Qwen3-30B +16.9 -> +1.9%, GPT-OSS-120B +25.7 -> -0.6%, GPT-OSS-20B +28.7 -> +22.5%.
# The pipelined rows had rested on the over-priced dispatch: DeepSeek-V3 at 1024 GPUs +3.5 -> -21.9%, at 256 +18.6 ->
# -10.7%, Kimi K2 +1.8 -> -21.3% (BENCHMARKS.md "AutoModel's fake balanced gate").
# Error = (predicted - published) / published step time.
MEAN_ABS_ERROR_AT_MOST = {"S1": 0.055, "S1f": 0.10, "S5": 0.13, "T": 0.05}


# The hybrid Mamba rows (AutoModel Nemotron V3 Nano and Super), priced since 2026-11-26 with the Blackwell set's
# configs. Kept apart from the ratchet above, which was set on the other rows; this bound only guards them from
# getting worse. Moved once, by a physics change: the SSD scan priced from a published kernel timing (TileLang's
# chunk-scan on H800, 13.5% of peak, where an unmeasured 70% had stood; BENCHMARKS.md "Nemotron 3 Nano / Super")
# took Nano +8.1 -> +18.4% and Super +35.2 -> +44.1%: the SSD had been too fast and hid what is too slow on these
# rows, the expert all-to-all across nodes (Super: 1.68 s exposed + 0.77 s recomputed; its compute alone 7.44 s
# against 7.29 s published), while every Blackwell Nemotron row moved toward its published time. Moved a second time
# by the sustained-load share above: Nano +18.4 -> +23.6%, Super +44.1 -> +49.4%. Tightened when the fake balanced
# gate was priced as it routes (above): Nano +23.6 -> +15.7%, Super +49.4 -> +24.4%. Raised a little when their
# attention took the kernel their table names, "TorchSDPA" (PyTorch SDPA's first backend, FlashAttention-2, where the
# profile's cuDNN attention had stood): Nano +15.7 -> +17.8%, Super +24.4 -> +25.2%. Ultra joined on 2026-11-28, when
# its config was transcribed from Megatron-LM's ModelOpt example (planner/presets/models/PROVENANCE.md) and its run's
# fused linear cross-entropy priced (``linear_ce``): -16.9%, too fast as the other EP-64 rows across nodes are.
HYBRID_ABS_ERROR_AT_MOST = {"automodel-nemotronv3-nano-8": 0.185, "automodel-nemotronv3-super-64": 0.26,
                            "automodel-nemotronv3-ultra-128": 0.18}


def _mean_abs_error_by_source(results) -> dict[str, float]:
    """Mean |error| of each source's priced rows, the hybrid Mamba rows apart (``HYBRID_ABS_ERROR_AT_MOST``)."""
    errors: dict[str, list[float]] = {}
    for r in results:
        if r.status == "priced" and r.name not in dev_set.HYBRID_CONFIGS:
            errors.setdefault(r.source, []).append(abs(r.error))
    return {src: statistics.mean(v) for src, v in errors.items()}


def test_accuracy_per_source_does_not_regress(priced):
    results, _ = priced
    got = _mean_abs_error_by_source(results)
    for src, bound in MEAN_ABS_ERROR_AT_MOST.items():
        assert got[src] <= bound, (src, got[src], bound)
    hybrid = {r.name: r for r in results if r.name in dev_set.HYBRID_CONFIGS}
    for name, bound in HYBRID_ABS_ERROR_AT_MOST.items():
        assert hybrid[name].status == "priced" and abs(hybrid[name].error) <= bound, (name, hybrid[name].error)


# The same rows priced from their table's facts and their stack profile alone (``--profile-only``), as runs meshplan
# never saw, measured 2026-11-27 (BENCHMARKS.md "NeMo 24.07's profile"): S1 5.45, S1f 7.82, S5 16.67, T 4.37%. A
# ratchet with a little room. S1 reached it when the NeMo 24.07 profile took the gradient dtype its example scripts
# run (bf16, 33 of the 39 apex distributed-optimizer scripts) and left the interleaved pipeline's send overlap to
# Megatron-Core's own, as 16 of the 18 interleaved confs set it (13.17 -> 5.45%): with fp32 gradient buffers the
# search had to recompute to fit. S1f reached it (19.46 -> 7.82%) when the profile took what the launcher's
# fine-tuning confs run for a fine-tuning job (``--task sft``; optim.dtype bf16 in 4 of its 6 sft.yaml): with the
# pre-training fp32 optimizer the 70B row had to recompute (+36%). S5 tightened (its rows but the hybrid
# ones 10.9 -> 10.1%, bound 11%; with them 16.6 -> 12.3%, 12.6% once the TorchSDPA rows took FlashAttention-2) with
# the fake balanced gate priced as it routes (above). S1 tightened (5.13 -> 3.72%, bound 4.5%) when the profile took
# each launcher conf's own settings for the model of its shapes, Nemotron-4 340B priced as itself (its row +29 ->
# +5%: with the bf16 optimizer its conf runs, the search no longer has to recompute to fit).
PROFILE_ONLY_ABS_ERROR_AT_MOST = {"S1": 0.045, "S1f": 0.085, "S5": 0.11, "T": 0.05}


@pytest.fixture(scope="module")
def priced_from_profiles(runs_dir):
    return dev_set.run(runs_dir, ("dev_runs.jsonl",), profile_only=True)


def test_accuracy_from_profiles_alone_does_not_regress(priced_from_profiles):
    results, _ = priced_from_profiles
    got = _mean_abs_error_by_source(results)
    for src, bound in PROFILE_ONLY_ABS_ERROR_AT_MOST.items():
        assert got[src] <= bound, (src, got[src], bound)


def test_automodel_run_configs_are_the_table_rows_and_pin_full_recompute(rows, runs_dir):
    """Rows whose activation checkpointing comes from the run's own config (AutoModel 89e3a9fdd / bdb4dbc72, not
    e45812012): the batch the cited config states is the quoted table row's (GBS, LBS cells), and the row is
    priced with recompute=full (AutoModel's apply_ac wraps every decoder block whole)."""
    import re

    for name, (recompute, where) in dev_set.AUTOMODEL_RUN_AC.items():
        r = _by_name(rows)[name]
        assert r.get("recompute") is None, name  # only rows the dev set leaves open
        header = _cells(r["published"]["location"].split("header", 1)[1])
        cell = dict(zip([h.lower() for h in header], _cells(r["published"]["quote"])))
        for key, col in (("global_batch_size", "gbs"), ("local_batch_size", "lbs"), ("ep_size", "ep")):
            said = re.search(rf"{key} (\d+)", where)
            if said and cell[col] != "-":
                assert int(said.group(1)) == int(cell[col]), (name, key)
        inp = dev_set.row_needs(r, runs_dir)
        assert recompute == "full" and inp.fix["recompute"] == "full", name
        assert any(where in a for a in inp.assumptions), name


def test_automodel_pipelined_rows_run_one_schedule_per_accumulation_step(rows, runs_dir):
    """AutoModel's benchmark loop runs the pipeline schedule once per gradient-accumulation step: pp_runs = the
    table's GA cell, and each run's micro-batches x MBS = the table's LBS cell (local batch per run)."""
    seen = 0
    for r in rows:
        inp = dev_set.row_needs(r, runs_dir)
        if r["source_id"] != "S5" or inp.out_of_scope or inp.fix["pp"] == 1:
            continue
        header = _cells(r["published"]["location"].split("header", 1)[1])
        cell = dict(zip([h.lower() for h in header], _cells(r["published"]["quote"])))
        runs = int(inp.fix.get("pp_runs", 1))
        assert runs == int(cell["ga"]), r["name"]
        micro_batches = inp.global_batch // (inp.fix["mbs"] * inp.fix["dp"])
        assert micro_batches // runs * inp.fix["mbs"] == int(cell["lbs"]), r["name"]
        seen += 1
    assert seen == 3  # DeepSeek-V3 at 256 and 1024 GPUs, Kimi K2


def test_rows_are_priced_from_facts_and_their_stack_profile(rows, runs_dir):
    """Each in-scope row names its source's stack profile; what it needs beyond its table's facts and that profile
    is listed per row (bench/dev_set.py prints and counts it). Counted 2026-11-29: 2 settings over 33 rows, both
    Nemotron V3 Ultra's (S5), from its run's config, a commit past the AutoModel profile's: its two MTP depths and its
    fused linear cross-entropy. The NeMo launcher confs' own settings (userbuffer overlaps, Nemotron 8B / 22B's fp32
    gradients, 340B's bf16 optimizer and in-line pipeline sends: 10 until then) are the nemo@24.07 profile's values
    for those models, AutoModel's SDPA under context parallelism its profile's where cp > 1; AutoModel's uneven
    pipeline split is its profile's rule (``pp_split=front``), and the fine-tuning optimizer dtype and fp8 weights
    the NeMo profile's for ``--task sft``."""
    per_row = []
    for row in rows:
        inp = dev_set.row_needs(row, runs_dir)
        if inp.out_of_scope:
            continue
        assert inp.profile == dev_set.SOURCE_PROFILE[inp.source]
        assert not set(k.split("=")[0] for k in inp.from_profile) & set(inp.fix), row["name"]
        per_row.append(len(inp.per_row))
    assert len(per_row) == 33 and sum(per_row) <= 2 and statistics.median(per_row) == 0


def test_profile_only_leaves_a_counted_setting_free(runs_dir):
    """A per-row setting (a 25.11 DeepSeek-V3 row's pipeline split, which its source does not give) is pinned when
    the row is priced with its own settings and left to meshplan under ``--profile-only``, not replaced by a default
    of the harness's own."""
    row = next(r for r in jsonl_rows(runs_dir / "blackwell_dev.jsonl")
               if r["name"] == "mbridge25.11-deepseekv3-gb300-bf16-nomtp")
    own, alone = dev_set.row_needs(row, runs_dir), dev_set.row_needs(row, runs_dir, profile_only=True)
    assert own.per_row == alone.per_row and own.per_row[0].startswith("pp_layout=")
    assert own.fix["pp_layout"] == "7*2+8*5+7" and "pp_layout" not in alone.fix


def test_context_parallel_attention_is_the_automodel_profiles(rows, runs_dir):
    """AutoModel runs attention under context parallelism as PyTorch SDPA's FlashAttention-2 (its train context
    allows SDPA's flash and efficient backends only, cp_utils.py @ 89e3a9fdd): its profile says so where cp > 1, so the
    Llama 3 70B row (CP 2) takes it from the profile in both modes and carries no setting of its own."""
    from meshplan.planner.layout.stacks import load_stacks
    from meshplan.planner.search.workloads import stack_values

    row = next(r for r in rows if r["name"] == "automodel-llama3-70b-64")
    for alone in (False, True):
        inp = dev_set.row_needs(row, runs_dir, profile_only=alone)
        assert "attention=flash2" in inp.from_profile and not inp.per_row and "attention" not in inp.fix
    prof, spec = load_stacks().get("automodel@89e3a9fdd"), load_model("llama-3.1-70b-instruct")
    assert stack_values(prof, spec, "bf16", {"cp": 2})[0]["attention"] == "flash2"
    assert "attention" not in stack_values(prof, spec, "bf16", {"cp": 1})[0]


def test_a_table_naming_torch_sdpa_runs_its_flash_backend(rows, runs_dir):
    """The AutoModel rows whose Kernel Optimizations cell names TorchSDPA run PyTorch SDPA, which tries its
    FlashAttention-2 backend first (``torch._C._get_sdp_priority_order()``: flash, efficient, math, cuDNN, in the
    installed torch; the run's container torch is not stated, an assumption the harness names): the kernel is a
    stated fact, kept when the row is priced as never seen and not counted as a per-row setting."""
    import torch

    first = torch._C._SDPBackend(torch._C._get_sdp_priority_order()[0])
    assert first == torch._C._SDPBackend.FLASH_ATTENTION
    priced = set()
    for row in (r for r in rows if "TorchSDPA" in str(r["published"].get("quote", ""))):
        for profile_only in (False, True):
            inp = dev_set.row_needs(row, runs_dir, profile_only)
            if not inp.out_of_scope:
                assert inp.fix["attention"] == "flash2" and not inp.per_row, row["name"]
                priced.add(row["name"])
    assert len(priced) == 2  # Nemotron 3 Nano and Super (Ultra's cell names TE attention)
