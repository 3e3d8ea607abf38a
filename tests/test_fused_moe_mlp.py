"""Megatron-Core's fused grouped MLP (``moe_fused_mlp``): priced as the grouped GEMMs alone, refused where its kernels
do not run, exported to Megatron-LM and refused by name where a target cannot run it.

Truths: the times NVIDIA/cudnn-frontend publishes for its CuTe DSL fused grouped GEMM + activation kernels
(``benchmark/cutedsl_fusion_kernels/results/*/output_verbose.txt``, packaged as
``costmodel/data/published/cudnn_moe_grouped_blackwell.json``: two GB200 and two GB300 runs, 8 experts x 4096 tokens,
K 8192), the conditions in Megatron-Core's ``TEGroupedMLP._is_fused_impl_supported`` (d0b3b77, NeMo 26.06's) and
Transformer Engine's ``ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8`` / ``validate_grouped_mlp_dims`` (4220403), and the
Megatron-LM field names ``use_transformer_engine_op_fuser`` / ``moe_mlp_glu_interleave_size`` (d98e8a64ddf3).
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.costmodel import blackwell_grouped as bg
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload, bf16_time_key
from meshplan.planner.estimate.gpu import GpuEstimator, check_fused_moe_mlp
from meshplan.planner.estimate.ops_graph import expert_ops, kind_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model


@pytest.fixture(scope="module")
def pricer():
    return Pricer.shipped()


@pytest.mark.parametrize("act", ["swiglu", "dswiglu", "geglu", "dgeglu", "srelu", "dsrelu"])
def test_the_fused_kernel_runs_at_the_grouped_gemms_price(pricer, act: str) -> None:
    """Every published run (GB200 and GB300, two each): cuDNN frontend's fused kernel, which also does the
    activation (forward) or its gradient (backward), the probability scale and the MXFP8 quantize, takes 0.90-1.09x
    what meshplan prices the grouped GEMM alone at; the unfused path's memory-bound ops are what the fusion
    removes (the unfused Transformer Engine path measured 1.22-1.34x the GEMM's price backward)."""
    for run in bg.runs():
        dev = catalogue()[run["device"]]
        gemm = OpSpec("matmul", (bg.TOKENS, bg.gemm_n(act), bg.K), "fp8", impl="mxfp8", groups=bg.EXPERTS)
        fused_s = run["cudnn_fused_ms"][act] * 1e-3
        assert 0.90 <= fused_s / pricer.predict(gemm, dev) <= 1.10, (run["folder"], act)
        assert fused_s < run["te_ms"][act] * 1e-3


def _layout(**changes) -> Layout:
    base = dict(dp_shard=8, ep=8, zero_stage=1, fp8="mxfp8", moe_dispatcher="hybridep")
    return Layout(**{**base, **changes})


def test_fused_experts_keep_their_gemms_and_fc1s_input_quantize() -> None:
    """Qwen3-30B-A3B at EP 8 (16 local experts, 8192 routed rows): unfused, fc1's input quantize, fc1's grouped
    GEMM, the SwiGLU, fc2's input quantize and fc2's grouped GEMM; fused, the same but the SwiGLU and fc2's quantize,
    which fc1's epilogue does. fc1's input quantize stays its own kernel (the fused op quantizes its input first); in
    the backward the fused kernels quantize fc2's output gradient alone."""
    model = load_model("qwen3-30b-a3b")
    unfused = expert_ops(model, _layout(), 8192, "fp8")
    fused = expert_ops(model, _layout(moe_fused_mlp=True), 8192, "fp8")
    assert [op.kind for op in unfused] == ["cast", "matmul", "swiglu", "cast", "matmul"]
    assert fused[1:] == [unfused[1], unfused[4]]
    # forward, fc1's input quantize; backward, fc2's output gradient's (fc1's is the dGLU epilogue's): unfused, the
    # quantize fc2's input cast carries backward
    assert fused[0] == dataclasses.replace(unfused[0], shape=(unfused[0].shape[0], unfused[3].shape[1]))


def test_one_estimator_prices_fused_and_unfused_as_two_fresh_ones() -> None:
    """Every cache that holds an MoE layer's ops or prices keys on the decision: one estimator asked for both gives
    what two fresh ones give, and the fused step is the faster."""
    work = Workload(load_model("qwen3-30b-a3b"), load_cluster("1x8xB200"), 64, 4096, "fp8")
    lays = [_layout(micro_batch=2, moe_fused_mlp=f) for f in (False, True)]
    shared = GpuEstimator(Pricer.shipped())
    both = [shared.estimate(work, lay).step_time_s for lay in lays]
    apart = [GpuEstimator(Pricer.shipped()).estimate(work, lay).step_time_s for lay in lays]
    assert both == apart and both[1] < both[0]


def test_layers_kept_in_bf16_run_their_experts_unfused() -> None:
    """Transformer Engine's op fuser fuses the grouped MLP only under the MXFP8 recipe: a layer Megatron-Core keeps
    in bf16 runs the SwiGLU as its own kernel."""
    model = load_model("qwen3-30b-a3b")
    kept = bf16_time_key(_layout(moe_fused_mlp=True))
    assert [op.kind for op in expert_ops(model, kept, 8192, "bf16")] == ["matmul", "swiglu", "matmul"]


def test_weights_not_held_quantized_are_cast_again_every_micro_batch() -> None:
    """Without fp8_params the fused op quantizes every expert weight on every forward: 8 micro-batches cost 14
    more casts of the routed experts' weights (row- and column-wise, 7 micro-batches past the first) than 8
    micro-batches with the weights held in MXFP8, whose step is otherwise the same."""
    work = Workload(load_model("qwen3-30b-a3b"), load_cluster("1x8xB200"), 64, 4096, "fp8")
    est = GpuEstimator(Pricer.shipped())
    held = est.estimate(work, _layout(moe_fused_mlp=True, fp8_params=True))
    cast = est.estimate(work, _layout(moe_fused_mlp=True, fp8_params=False))
    unfused_held = est.estimate(work, _layout(fp8_params=True))
    unfused_cast = est.estimate(work, _layout(fp8_params=False))
    extra = (cast.step_time_s - held.step_time_s) - (unfused_cast.step_time_s - unfused_held.step_time_s)
    model = work.model
    experts = sum(model.layer_routed_expert_params(i) for i in range(model.num_layers)) / 8
    one_cast = Pricer.shipped().predict(OpSpec("cast", (int(experts),), "bf16"), catalogue()["B200"])
    assert extra == pytest.approx(14 * one_cast, rel=1e-6)


def test_fused_gpt_oss_experts_drop_the_eager_clamp_and_bias() -> None:
    """GPT-OSS-120B: unfused, Megatron-Core clamps the GLU halves and adds fc2's bias in eager PyTorch (fp32 chains);
    the fused op takes the clamp into its GeGLU and the bias into its GEMM: no memory-bound op between the GEMMs."""
    model = load_model("gpt-oss-120b")
    layout = Layout(dp_shard=8, ep=8, zero_stage=1, fp8="mxfp8", moe_dispatcher="hybridep")
    unfused = kind_ops(model, "SE", layout, 4096, "fp8").compute
    fused = kind_ops(model, "SE", layout.with_(moe_fused_mlp=True), 4096, "fp8").compute
    between = fused[[i for i, op in enumerate(fused) if op.groups > 1][0] + 1:]
    assert between[0].groups > 1  # fc2's grouped GEMM follows fc1's at once
    assert sum(op.dtype == "fp32" for op in fused) < sum(op.dtype == "fp32" for op in unfused)


@pytest.mark.parametrize("changes, words", [
    (dict(fp8="tensorwise"), "the MXFP8 recipe (fp8=mxfp8), got fp8=tensorwise"),
    (dict(tp=2, sequence_parallel=True, dp_shard=4), "no expert tensor parallelism (etp 1), got etp=2"),
    (dict(stack="torchtitan", zero_stage=3), "stack=megatron"),
    (dict(recompute="selective", recompute_modules="moe_act"), "no moe_act in recompute_modules"),
])
def test_layouts_the_kernels_do_not_run_are_refused(changes: dict, words: str) -> None:
    base = dict(dp_shard=8, ep=8, zero_stage=1, fp8="mxfp8", moe_fused_mlp=True)
    layout = Layout(**{**base, **changes})
    with pytest.raises(MeshplanError, match="moe_fused_mlp") as err:
        layout.validate(world_size=8, num_layers=48, num_heads=32, num_kv_heads=4, seq_len=4096, global_batch=64,
                        num_experts=128)
    assert words in str(err.value)


def test_models_and_parts_the_kernels_do_not_run_are_refused() -> None:
    """sm100 kernels (Blackwell), gated experts (Nemotron 3's squared ReLU experts are not), widths a multiple of 64."""
    b200, h100 = catalogue()["B200"], catalogue()["H100-SXM"]
    check_fused_moe_mlp(load_model("qwen3-30b-a3b"), b200)
    check_fused_moe_mlp(load_model("gpt-oss-120b"), b200)  # 2880 = 45 x 64
    with pytest.raises(MeshplanError, match="Blackwell"):
        check_fused_moe_mlp(load_model("qwen3-30b-a3b"), h100)
    with pytest.raises(MeshplanError, match="not gated"):
        check_fused_moe_mlp(load_model("nemotron-3-nano-30b-a3b"), b200)
    odd = dataclasses.replace(load_model("qwen3-30b-a3b"), moe_ffn_hidden_size=760)
    with pytest.raises(MeshplanError, match="multiples of 64; .* 2048 and 760"):
        check_fused_moe_mlp(odd, b200)


def test_plan_prices_it_faster_and_refuses_a_bad_pin_in_one_line(runner, tmp_path) -> None:
    base = ["plan", "-m", "qwen3-30b-a3b", "-b", "64", "-s", "4096", "--dtype", "fp8", "--json"]
    fix = "tp=1,pp=1,ep=8,mbs=2,zero=1,fp8=mxfp8,moe_dispatcher=hybridep,cuda_graphs=layers"
    times = {}
    for fused in ("false", "true"):
        res = runner.invoke(app, [*base, "-c", "1x8xB200", "--fix", f"{fix},moe_fused_mlp={fused}",
                                  "--out", str(tmp_path / f"{fused}.yaml")])
        assert res.exit_code == 0, res.output
        times[fused] = float(res.output.split('"step_time_s": ')[1].split(",")[0])
    assert times["true"] < times["false"]
    explained = runner.invoke(app, [*base, "-c", "1x8xB200", "--fix", f"{fix},moe_fused_mlp=true", "--explain",
                                    "--out", str(tmp_path / "e.yaml")])
    basis = json.loads(explained.output)["explain"]["priced_from"]["experts' fused grouped MLP"]
    assert "cuDNN frontend" in basis and "not priced apart" in basis
    bad = runner.invoke(app, [*base, "-c", "1x8xB200", "--fix", "tp=1,ep=8,fp8=tensorwise,moe_fused_mlp=true",
                              "--out", str(tmp_path / "bad.yaml")])
    assert bad.exit_code == 2 and "moe_fused_mlp" in bad.output and "Traceback" not in bad.output, bad.output


def test_exports(runner, tmp_path) -> None:
    """Megatron-LM: the two TransformerConfig flags and the environment switch Transformer Engine reads; the bridge
    export (v0.3.1, whose Megatron-Core has no moe_mlp_glu_interleave_size) refuses by name; torchtitan warns."""
    plan = tmp_path / "p.yaml"
    res = runner.invoke(app, ["plan", "-m", "qwen3-30b-a3b", "-c", "1x8xB200", "-b", "64", "-s", "4096", "--dtype",
                              "fp8", "--fix", "tp=1,pp=1,ep=8,mbs=2,zero=1,fp8=mxfp8,moe_fused_mlp=true",
                              "--out", str(plan)])
    assert res.exit_code == 0, res.output
    assert "moe_fused_mlp: true" in plan.read_text()
    out = tmp_path / "m.sh"
    assert runner.invoke(app, ["export", str(plan), "--to", "megatron", "--out", str(out)]).exit_code == 0
    script = out.read_text()
    assert "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in script
    assert "--use-transformer-engine-op-fuser" in script and "--moe-mlp-glu-interleave-size 32" in script
    bridge = runner.invoke(app, ["export", str(plan), "--to", "megatron-bridge", "--out", str(tmp_path / "b.sh")])
    assert bridge.exit_code == 2 and "moe_fused_mlp" in bridge.output and not (tmp_path / "b.sh").exists()
    titan = runner.invoke(app, ["export", str(plan), "--to", "torchtitan", "--out", str(tmp_path / "t.toml")])
    assert titan.exit_code == 0 and "moe_fused_mlp: no option fuses" in titan.output


@pytest.mark.parametrize("changes,padded", [
    ({"moe_dispatcher": "alltoall"}, True), ({"moe_dispatcher": "deepep"}, True),
    ({"moe_dispatcher": "hybridep"}, False),  # Hybrid-EP pads in its dispatch kernel
    ({"moe_dispatcher": "alltoall", "moe_capacity": 1.0}, False),  # counts fixed at the capacity
    ({"moe_dispatcher": "alltoall", "fp8": "none"}, False),  # bf16: nothing to align
    ({"moe_dispatcher": "alltoall", "moe_fused_mlp": True}, False)])
def test_the_grouped_mlp_pads_and_unpads_its_rows_for_the_quantization_block(changes, padded) -> None:
    """Megatron-Core's ``TEGroupedMLP`` pads each expert's rows to the quantization block before fc1 and unpads the
    output after fc2 (TE ``Fp8Padding`` / ``Fp8Unpadding``): a copy of the routed rows x hidden each way. Qwen3-30B-A3B
    (hidden 2048, top 8) at 4096 tokens a micro-batch, balanced: this rank's experts receive 4096 x 8 rows."""
    model, tokens = load_model("qwen3-30b-a3b"), 4096
    dtype = "bf16" if changes.get("fp8") == "none" else "fp8"
    lo = kind_ops(model, "AE", _layout(**changes), tokens, dtype)
    copies = [op for op in lo.experts if op.kind == "copy" and op.shape == (tokens * 8 * 2048,) * 2]
    assert len(copies) == (2 if padded else 0)
    if padded:
        assert lo.experts[0] == lo.experts[-1] == copies[0]
