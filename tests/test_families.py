"""The model families of 2026: hybrid Mamba-2 / attention stacks (Nemotron 3), sliding-window attention with sinks
(GPT-OSS) and DeepSeek-V3's MTP layer.

Independent truth: Megatron-Bridge's published "Model TFLOP/s/GPU" over "Tokens/s/GPU" of the Blackwell rows
(data/published_runs/blackwell_dev.jsonl, B1) is the model FLOPs per token its run counted; the published totals
of the model cards; megatron-core's own split rules (MambaMixer, MambaContextParallel).
"""
from __future__ import annotations

import dataclasses
import json
import re
import statistics
from pathlib import Path

import pytest
import torch

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.explain import explain_gpu
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.ops_graph import EXPERT_BIAS_PASSES, GLU_CLAMP_PASSES, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model

B1 = Path(__file__).resolve().parents[1] / "data" / "published_runs" / "blackwell_dev.jsonl"


def _ratios(model: str, containers: tuple[str, ...] = ()) -> list[float]:
    """Published model FLOPs per token (TFLOP/s/GPU over tokens/s/GPU) of the B1 rows of ``model``."""
    out = []
    for line in B1.read_text().splitlines():
        r = json.loads(line)
        p = r["published"]
        if r["model"] != model or r["source_id"] != "B1" or not p.get("tflops_per_gpu_model"):
            continue
        if containers and not r["container"].startswith(containers):
            continue
        out.append(p["tflops_per_gpu_model"] * 1e12 / p["tokens_per_s_per_gpu"])
    assert out, model
    return out


def test_nemotron_3_super_flops_match_published_ratio():
    """Super: 40 M, 40 E, 8 * layers; Megatron-Bridge runs its MTP module twice (mtp_num_layers 2, repeated layer,
    configs/PROVENANCE.md). Its d_inner (128 heads x 64) equals the FLOP formula's 2 x hidden."""
    spec = dataclasses.replace(load_model("nemotron-3-super-120b-a12b"), num_mtp_layers=2)
    published = statistics.median(_ratios("Nemotron_3_Super"))
    assert spec.model_flops_per_token(8192) == pytest.approx(published, rel=0.01)
    assert spec.mtp_params == load_model("nemotron-3-super-120b-a12b", mtp=True).mtp_params  # one module's weights
    without = load_model("nemotron-3-super-120b-a12b").model_flops_per_token(8192)
    assert without < 0.93 * published  # MTP off does not match


def test_nemotron_3_nano_flops_match_published_ratio_with_the_formulas_mamba_width():
    """Nano's Mamba mixers are 64 heads x 64 = 4096 wide (Megatron-Bridge recipe: mamba_num_heads 64, mamba_head_dim
    64); Megatron-Bridge's FLOP formula (flop_utils.mamba_layer_flops) takes d_in = 2 x hidden = 5376. meshplan counts
    the real width; with the formula's width it reproduces the published ratio, and the real count is lower by the
    in_proj and out_proj columns that width adds (3 x 2 x h x 3 x (5376 - 4096) per Mamba layer and token)."""
    spec = load_model("nemotron-3-nano-30b-a3b")
    published = statistics.median(_ratios("Nemotron_3_Nano"))
    as_formula = dataclasses.replace(spec, mamba_head_dim=2 * spec.hidden_size // spec.mamba_heads)
    assert as_formula.model_flops_per_token(8192) == pytest.approx(published, rel=0.01)
    extra = 6 * spec.hidden_size * 3 * (as_formula.mamba_inner - spec.mamba_inner) * spec.layer_pattern.count("M")
    gap = as_formula.model_flops_per_token(8192) - spec.model_flops_per_token(8192)
    assert extra <= gap <= 1.05 * extra  # the rest: conv1d and the SSD scan at the wider width


def test_gpt_oss_window_flops_match_published_ratio():
    """26.06 and later count the 128-token window on every other layer (README B1: ~32.6 GFLOP/token); a count with
    full attention on every layer misses it by ~5%."""
    spec = load_model("gpt-oss-120b")
    published = statistics.median(_ratios("GPT OSS 120B", ("NeMo 26.06",)))
    assert spec.model_flops_per_token(4096) == pytest.approx(published, rel=0.005)
    full = dataclasses.replace(spec, sliding_window=0, window_layers=())
    assert full.model_flops_per_token(4096) > 1.04 * published


def test_deepseek_v3_flops_match_only_with_one_mtp_layer():
    with_mtp = load_model("deepseek-v3", mtp=True).model_flops_per_token(4096)
    without = load_model("deepseek-v3").model_flops_per_token(4096)
    mtp_rows = _ratios("DeepSeekV3", ("NeMo 26",))
    assert statistics.median(mtp_rows) == pytest.approx(with_mtp, rel=0.005)
    assert statistics.median(mtp_rows) > 1.03 * without
    nomtp = [r for r in (json.loads(x) for x in B1.read_text().splitlines()) if r["name"].endswith("-nomtp")]
    for r in nomtp:
        p = r["published"]
        assert p["tflops_per_gpu_model"] * 1e12 / p["tokens_per_s_per_gpu"] == pytest.approx(without, rel=0.005)


def test_published_parameter_counts():
    """gpt-oss model card: 116.8B total / 5.1B active (120b), 20.9B / 3.6B (20b), active without the input
    embedding; Nemotron 3 names: 30B-A3B, 120B-A12B."""
    for name, total, active in (("gpt-oss-120b", 116.8e9, 5.1e9), ("gpt-oss-20b", 20.9e9, 3.6e9)):
        spec = load_model(name)
        assert spec.num_params == pytest.approx(total, rel=0.001)
        assert spec.active_params - spec.embedding_params == pytest.approx(active, rel=0.01)
    nano, sup = load_model("nemotron-3-nano"), load_model("nemotron-3-super")
    assert 30e9 < nano.num_params < 32e9 and 3e9 < nano.active_params < 4e9
    assert 120e9 < sup.num_params < 121e9 and 12e9 < sup.active_params < 13e9


def test_mamba_ops_split_over_tp_and_cp_as_megatron_core():
    spec = load_model("nemotron-3-nano-30b-a3b")
    mamba = spec.layer_pattern.index("M")
    lo = layer_ops(spec, mamba, Layout(tp=2, cp=2, sequence_parallel=True), 8192)
    ssd = [o for o in lo.compute if o.kind == "ssd"]
    assert len(ssd) == 1
    b, heads, seq, p_dim, n, groups, q = ssd[0].shape
    assert (heads, seq, groups) == (64 // 4, 8192, 8 // 4)  # H/(tp cp) heads over the whole sequence
    in_proj = [o for o in lo.compute if o.kind == "matmul"][0]
    assert in_proj.shape[1] == (2 * 4096 + 2 * 8 * 128 + 64) // 2
    assert [k for k, _ in lo.cp_comm] == ["alltoall", "alltoall"]  # MambaContextParallel cp2hp / hp2cp
    with pytest.raises(MeshplanError, match="Mamba heads"):
        layer_ops(spec, mamba, Layout(tp=16), 8192)
    assert spec.mamba_split_problem(1, 16) == ""  # 64 heads, 8 groups repeated twice
    assert "MambaContextParallel" in spec.mamba_split_problem(2, 64)


def test_mamba_scan_layout_copies_only_above_micro_batch_one():
    """Megatron-Core's ``_ssm_training`` takes ``rearrange(zxBCdt, "l b d -> b l d").contiguous()`` and the same for y
    back: torch copies only where the micro-batch exceeds 1 (its own ``contiguous`` is the truth), and the price holds
    one copy of both widths on this rank (in_proj's 2 d_inner + 2 G N + H, out_proj's d_inner, over TP)."""
    for b, copied in ((1, False), (2, True)):
        x = torch.empty(16, b, 8)
        assert (x.permute(1, 0, 2).contiguous().data_ptr() != x.data_ptr()) is copied
    spec = load_model("nemotron-3-nano-30b-a3b")
    mamba = spec.layer_pattern.index("M")
    for mbs, want in ((1, []), (2, [2 * 8192 * ((2 * 4096 + 2 * 8 * 128 + 64) // 2 + 4096 // 2)])):
        lo = layer_ops(spec, mamba, Layout(tp=2, micro_batch=mbs, sequence_parallel=True), 8192)
        assert [o.shape[0] for o in lo.compute if o.kind == "copy"] == want
    # batch-first model code (NeMo AutoModel's NemotronV3 mixer, its profile says so) feeds the kernel as it is
    lay = Layout(tp=2, micro_batch=2, sequence_parallel=True, sequence_first=False)
    assert not [o for o in layer_ops(spec, mamba, lay, 8192).compute if o.kind == "copy"]
    from meshplan.planner.layout.stacks import load_stacks
    assert load_stacks().get("automodel").defaults("bf16", True, "", "pretrain")["sequence_first"] == "false"


def test_one_estimator_prices_both_activation_orders_as_two_fresh_ones():
    """The layer caches key on ``sequence_first``: both orders on one estimator give what two fresh ones give, and
    the sequence-first one (Megatron-Core's copies at micro-batch 2) is the slower."""
    work = Workload(load_model("nemotron-3-nano-30b-a3b"), load_cluster("2x4xGB300-NVL72"), 64, 8192, "bf16")

    def step(est, first):
        return est.estimate(work, Layout(dp_shard=8, ep=8, zero_stage=1, micro_batch=2, sequence_first=first))

    shared = GpuEstimator(Pricer.shipped())
    both = [step(shared, first).step_time_s for first in (True, False)]
    assert both == [step(GpuEstimator(Pricer.shipped()), first).step_time_s for first in (True, False)]
    assert both[0] > both[1]


def test_sliding_window_layers_price_the_window():
    spec = load_model("gpt-oss-20b")
    lay = Layout(ep=1)
    attn = [[o for o in layer_ops(spec, i, lay, 4096).compute if o.kind == "attention"][0] for i in (0, 1)]
    assert spec.layer_kind(0) == "SE" and spec.layer_kind(1) == "*E"
    assert attn[1].flops / attn[0].flops > 15  # 4096 / 2 keys against ~128


def test_gpt_oss_eager_passes_are_megatron_cores():
    """GPT-OSS under Megatron-Core (core r0.15-r0.17, the dev set's releases) runs two eager chains the other MoE
    models do not: the clamped GLU (``weighted_bias_quick_geglu_impl`` with ``activation_func_clamp_value`` 7.0:
    two clamps over the halves of the fc1 output and a ``torch.cat``, each reading and writing all of it once) and
    the fc2 bias (``TEGroupedMLP._apply_bias``: ``t + b * p`` in fp32, ``torch.cat``, ``.to(bf16)``). Worked from
    that code per element of the rows x 2880 fc2 output: forward 4 (b*p) + 10 (add) + 8 (cat) + 6 (cast) = 28
    bytes, backward 6 (grad up) + 6 (grad down) + 12 + 12 (the two product-sums) = 36. The clamp is part of the
    recomputed ``moe_act``; the bias is not; a stack whose code was not read (torchtitan) gets neither. The clamp's
    passes are as many as its measured H200 time is worth (``ops_graph.GLU_CLAMP_PASSES``, tests/test_gpu_rope.py)."""
    from meshplan.costmodel.ops import op_bytes

    spec = load_model("gpt-oss-120b")
    assert spec.glu_clamp == 7.0 and spec.expert_bias
    tokens, lay = 4 * 4096, Layout(ep=8, micro_batch=4, stack="megatron")
    lo = layer_ops(spec, 0, lay, 4096)
    rows = tokens * spec.experts_per_token  # balanced routing: every token copy on some rank, EP 8 of them here
    fc2_out = rows * spec.hidden_size
    fp32 = [o for o in lo.experts if o.dtype == "fp32"]
    assert {o.shape[0] for o in fp32} == {fc2_out}
    priced_bytes = 3 * sum(op_bytes(o) for o in fp32)  # the estimator prices a memory-bound backward at 2x
    assert priced_bytes == pytest.approx((28 + 36) * fc2_out, rel=0.07)
    fc1_out = 2 * rows * spec.moe_ffn_hidden_size  # gate and linear halves
    clamp = [o for o in lo.experts if o.kind == "activation" and o.shape[0] == fc1_out]
    # bf16 read + write a pass, as many passes as the chain's H200 time is worth (tests/test_gpu_rope.py)
    assert len(clamp) == GLU_CLAMP_PASSES and sum(op_bytes(o) for o in clamp) == GLU_CLAMP_PASSES * (2 + 2) * fc1_out
    moe_act = dict(lo.modules)["moe_act"]
    assert all(o in moe_act for o in clamp) and not any(o in moe_act for o in fp32)
    titan = layer_ops(spec, 0, dataclasses.replace(lay, stack="torchtitan"), 4096)
    assert not [o for o in titan.experts if o.dtype == "fp32"]
    assert len(titan.experts) == len(lo.experts) - GLU_CLAMP_PASSES - 2 * EXPERT_BIAS_PASSES
    qwen = load_model("qwen3-30b-a3b")
    assert qwen.glu_clamp == 0.0 and not [o for o in layer_ops(qwen, 0, lay, 4096).experts if o.dtype == "fp32"]


def test_swiglu_limit_must_be_a_positive_number(tmp_path):
    cfg = json.loads((Path(__file__).resolve().parents[1] / "planner" / "presets" / "models" /
                      "gpt-oss-20b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "swiglu_limit": 3.5}))
    assert load_model(str(path)).glu_clamp == 3.5
    path.write_text(json.dumps({**cfg, "swiglu_limit": -1}))
    with pytest.raises(MeshplanError, match="swiglu_limit") as err:
        load_model(str(path))
    assert "\n" not in str(err.value) and "positive" in str(err.value)


def _nano_work(cluster: str = "1x8xH100"):
    return Workload(load_model("nemotron-3-nano-30b-a3b"), load_cluster(cluster), global_batch=64, seq_len=8192)


def test_nano_plans_and_explain_names_the_ssd_source():
    est = GpuEstimator(Pricer.roofline())
    work = _nano_work()
    lay = Layout(dp_shard=8, ep=8, zero_stage=1)
    out = est.estimate(work, lay)
    assert out.step_time_s > 0 and out.memory.total_bytes > 0
    ex = explain_gpu(est, work, lay)
    assert "Dao & Gu 2024" in ex["unmeasured"]["ssd bf16"]


def test_mtp_costs_time_and_memory_on_the_last_stage():
    est = GpuEstimator(Pricer.roofline())
    cluster = load_cluster("4x8xH100")
    lay = Layout(dp_shard=8, pp=4, ep=8, zero_stage=1, recompute="full")
    base = load_model("deepseek-v3")
    plain = est.estimate(Workload(dataclasses.replace(base, num_layers=8, moe_layers=tuple(range(3, 8))),
                                  cluster, 64, 4096), lay)
    mtp_spec = dataclasses.replace(base, num_layers=8, moe_layers=tuple(range(3, 8)), num_mtp_layers=1)
    mtp = est.estimate(Workload(mtp_spec, cluster, 64, 4096), lay)
    assert mtp.step_time_s > plain.step_time_s
    assert mtp.memory.weights_bytes > plain.memory.weights_bytes


def test_a_bad_hybrid_config_is_one_line(tmp_path):
    cfg = json.loads((Path(__file__).resolve().parents[1] / "planner" / "presets" / "models" /
                      "nemotron-3-nano-30b-a3b.json").read_text())
    for key, value, says in (("hybrid_override_pattern", "MEM", "one per layer"),
                             ("hybrid_override_pattern", "M" * 51 + "X", "M, *, - and E"),
                             ("mamba_num_heads", 0, "mamba_num_heads"), ("ssm_state_size", "128", "integer")):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(MeshplanError, match=re.escape(says)) as err:
            load_model(str(path))
        assert "\n" not in str(err.value) and "config.json" in str(err.value)


@pytest.mark.parametrize("name,kind", [("nemotron-3-super", "M"), ("nemotron-3-super", "*"),
                                       ("nemotron-3-super", "E"), ("gpt-oss-120b", "SE"), ("gpt-oss-120b", "*E")])
def test_op_lists_carry_the_counted_flops(name, kind):
    """The GEMMs, attention and SSD ops one layer lists (tp = cp = 1, balanced routing) carry the FLOPs the model
    counter counts for its blocks: the priced work and the reported work are the same work. The counter leaves
    out the router (as Megatron's does) and counts the conv1d as its multiply-adds."""
    from meshplan.planner.estimate.ops_graph import kind_ops
    from meshplan.planner.model.flops import _block_macs

    spec = load_model(name)
    s = 4096
    lo = kind_ops(spec, kind, Layout(), s)
    ops = lo.weighted()
    priced = sum(n * o.flops for o, n in ops.items() if o.kind in ("matmul", "attention", "ssd")
                 and not (o.kind == "matmul" and o.shape[1] == spec.num_experts))
    counted = 2 * s * sum(_block_macs(spec, k, s) for k in kind)
    if kind == "M":
        counted -= 2 * s * spec.mamba_conv_kernel * (spec.mamba_inner + 2 * spec.mamba_groups * spec.mamba_state)
    assert priced == pytest.approx(counted, rel=0.002)


def test_plan_cli_end_to_end_names_the_ssd_source(runner, tmp_path):
    """`meshplan plan --model nemotron-3-nano-30b-a3b --cluster 1x8xH100 --explain` writes a plan and says how the
    SSD scan was priced."""
    from meshplan.cli.main import app
    from meshplan.planner.plan.schema import load_plan

    out = tmp_path / "nano.yaml"
    res = runner.invoke(app, ["plan", "--model", "nemotron-3-nano-30b-a3b", "--cluster", "1x8xH100",
                              "--global-batch", "64", "--seq-len", "8192", "--fix", "ep=8,cp=1", "--explain",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Dao & Gu 2024" in " ".join(res.output.split())
    plan = load_plan(out)
    assert plan.degrees.ep == 8


def test_a_batch_first_plan_launched_as_megatron_core_is_named():
    """A plan priced on batch-first model code (``sequence_first`` false) exported to a Megatron-Core target warns in
    one line (its Mamba copies are not in the price); the sequence-first default and torchtitan's target do not."""
    from meshplan.planner.export import bridge, megatron, torchtitan
    from tests.test_export_golden import _moe_variant

    plan = _moe_variant(sequence_first=False)
    for target, notes in (("megatron", megatron.unsupported(plan)), ("megatron-bridge", bridge.unsupported(plan))):
        assert sum(n.startswith(f"{target}: sequence_first=false:") for n in notes) == 1
    assert not any("sequence_first" in n for n in megatron.unsupported(_moe_variant()))
    assert not any("sequence_first" in n for n in torchtitan.unsupported(plan))


def test_explain_books_the_mtp_modules_on_the_last_stage_not_as_a_straggler():
    """The estimate prices Nemotron 3 Super's two MTP modules on the last stage (``ops_graph.mtp_ops``): --explain
    books them in that stage's compute, so its straggler row is ``straggler_slowdown`` of the 64 ranks times the
    stage's time per step, as without them."""
    from meshplan.planner.estimate.gpu import straggler_slowdown

    work = Workload(load_model("nemotron-3-super-120b-a12b"), load_cluster("8x8xB300"), 512, 8192, "bf16")
    est = GpuEstimator(Pricer.shipped())
    for mtp in (0, 2):
        step = explain_gpu(est, work, Layout(dp_shard=64, ep=8, zero_stage=1, mtp=mtp))["step_s"]
        stage = step["slowest stage compute"] + step["slowest stage exposed comm"]
        assert step["slowest of the ranks (straggler)"] == pytest.approx(stage * straggler_slowdown(64), rel=1e-3)


def test_gpt_oss_context_parallelism_is_all_to_all(runner, tmp_path):
    """Transformer Engine runs attention sinks under context parallelism only with the all-to-all exchange
    (context_parallel.py ``attn_forward_func_with_cp``; Megatron-Bridge's GPT-OSS recipe: "only a2a cp is supported
    for sink attention"): a free search at cp=4 takes a2a, a pinned all-gather is refused in one line."""
    from meshplan.cli.main import app
    args = ["plan", "-m", "gpt-oss-20b", "-c", "2x8xH100", "-b", "64", "-s", "32768", "--out", str(tmp_path / "g.yaml")]
    r = runner.invoke(app, [*args, "--fix", "cp=4", "--json", "--top", "10"])
    assert r.exit_code == 0, r.output
    assert {p["cp_kind"] for p in json.loads(r.output)["plans"]} == {"a2a"}
    r = runner.invoke(app, [*args, "--fix", "cp=4,cp_kind=allgather"])
    assert r.exit_code == 2 and "attention sinks" in r.output and r.output.count("\n") == 1
