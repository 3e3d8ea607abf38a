"""Blackwell precision recipes: MXFP8 and NVFP4 as Transformer Engine runs them (TE 2.20.0.dev0 docs and
``transformer_engine/pytorch/csrc/quantizer.cpp``), priced, sized and selected.

Independent truths: the dense peaks of the cited datasheets (B200 bf16 2.25, nvfp4 9 PFLOP/s; GB300 bf16 2.5, nvfp4
15), TE's block sizes (MXFP8: one E8M0 byte per 32 elements; NVFP4: one E4M3 byte per 16, per 16x16 for weights),
and the model's own parameter count.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer, fp8_time_share
from meshplan.costmodel.devices import get_device
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload, decoder_params
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.memory import lowp_weight_bytes, saved_input_bytes
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import fp8_recipe_choices
from meshplan.planner.model.config import load_model


def test_datasheet_peaks_set_the_nvfp4_main_loop():
    """The nvfp4 main loop is the measured multiple (``costmodel.fp4_gemm``, recomputed in tests/test_fp4_gemm.py
    and tests/test_te_gemm.py) of each part's bf16 / nvfp4 datasheet ratio: a quarter on the B200, a sixth on
    Blackwell Ultra, whose multiple the B300 measured."""
    from meshplan.costmodel.fp4_gemm import main_loop_multiple

    b200, gb300 = get_device("B200"), get_device("GB300")
    assert (b200.peak("bf16"), b200.peak("nvfp4"), b200.peak("mxfp8")) == (2.25e15, 9.0e15, 4.5e15)
    op = OpSpec("matmul", (8192, 8192, 8192), "nvfp4", impl="nvfp4")
    x = main_loop_multiple(150.0)
    assert fp8_time_share(op, b200) == pytest.approx(x * 2.25 / 9 + 150 / 8192)
    assert fp8_time_share(op, gb300) == pytest.approx(main_loop_multiple(150.0, "B300") * 2.5 / 15 + 150 / 8192)
    assert main_loop_multiple(150.0, "GB300") == main_loop_multiple(150.0, "B300") > x
    fp8 = OpSpec("matmul", (8192, 8192, 8192), "fp8", impl="mxfp8")
    assert fp8_time_share(fp8, b200) == fp8_time_share(fp8) == pytest.approx(0.5 + 150 / 8192)


def test_nvfp4_gemm_priced_from_its_bf16_twin():
    p = Pricer.roofline()  # no learned model needed for the ratio
    dev = get_device("B200")
    bf16 = p.predict(OpSpec("matmul", (8192, 8192, 8192), "bf16"), dev)
    sec, src = p.predict_with_source(OpSpec("matmul", (8192, 8192, 8192), "nvfp4", impl="nvfp4"), dev)
    from meshplan.costmodel.fp4_gemm import main_loop_multiple

    share = main_loop_multiple(150.0) * 0.25 + 150 / 8192
    assert sec == pytest.approx(bf16 * share) and "nvfp4 rule" in src and "PR #20646" in src


def test_block_scale_bytes_from_te_block_sizes():
    assert saved_input_bytes("none") == 2 and saved_input_bytes("delayed") == 1
    assert saved_input_bytes("mxfp8") == 1 + 1 / 32 and saved_input_bytes("nvfp4") == 0.5 + 1 / 16
    assert lowp_weight_bytes("delayed", shared_layout=False) == 2  # Hopper: fp8 copy + transpose
    assert lowp_weight_bytes("tensorwise", shared_layout=True) == 1  # Blackwell: one layout serves both
    assert lowp_weight_bytes("mxfp8", True) == lowp_weight_bytes("blockwise", True) == 2 * (1 + 1 / 32)
    assert lowp_weight_bytes("nvfp4", True) == 2 * (0.5 + 1 / 256)


def _estimate(cluster: str, dtype: str, **decisions):
    model = load_model("llama-3.1-8b")
    clus = load_cluster(cluster)
    work = Workload(model, clus, 64, 4096, dtype)
    lay = Layout(dp_replicate=clus.world_size, micro_batch=1, **decisions)
    est = GpuEstimator(Pricer.roofline())
    return est, work, lay, est.estimate(work, lay)


def test_nvfp4_weight_copies_and_saved_inputs_in_memory():
    est, work, lay, bf16 = _estimate("8xB200", "bf16")
    _, _, _, fp4 = _estimate("8xB200", "nvfp4")
    linear = decoder_params(est.tables(work.model), lay, 0)
    assert fp4.memory.weights_bytes - bf16.memory.weights_bytes == pytest.approx(2 * (0.5 + 1 / 256) * linear,
                                                                                  rel=1e-6)
    assert fp4.memory.activations_bytes < bf16.memory.activations_bytes  # wgrad inputs kept at 0.5625 B, not 2


def test_nvfp4_op_list_runs_every_decoder_gemm_in_nvfp4_with_bf16_rest():
    model = load_model("llama-3.1-8b")
    lay = Layout(dp_replicate=8, micro_batch=1)
    ops = layer_ops(model, 0, lay, 4096, "nvfp4").compute
    gemms = [o for o in ops if o.kind == "matmul"]
    assert gemms and all(o.dtype == "nvfp4" and o.impl == "nvfp4" for o in gemms)
    # per GEMM input: the amax pass (a copy of half its elements = one read) and the fused rowwise + RHT cast
    casts = [o for o in ops if o.kind == "cast"]
    assert len(casts) == len(gemms)
    assert all(o.dtype == "bf16" for o in ops if o.kind in ("attention", "rmsnorm", "swiglu", "cast", "copy"))


@pytest.mark.parametrize("dtype, fp8, stack, per_elem", [
    ("bf16", "none", "megatron", 2.0), ("fp8", "tensorwise", "megatron", 1.0), ("fp8", "delayed", "megatron", 1.0),
    ("fp8", "mxfp8", "megatron", 1 + 1 / 32), ("nvfp4", "nvfp4", "megatron", 0.5 + 1 / 16),
    ("fp8", "tensorwise", "torchtitan", 2.0)])
def test_sequence_parallel_gathers_move_the_quantized_input(dtype, fp8, stack, per_elem):
    """Transformer Engine all-gathers a sequence-parallel linear's input after quantizing its shard
    (``pytorch/module/linear.py``: ``gather_along_first_dim(inputmat, tp_group, quantizer=...)``; v1.8's
    LayerNormLinear writes the norm output in fp8 before the gather): the gather moves the recipe's bytes per element
    (its data and block scales), the reduce-scatter the GEMM's bf16 output; an MoE block's token gather and other
    stacks' gathers stay bf16 (torchtitan's float8 TP gathers fp8 for tensor-wise scaling, which meshplan does not
    price: no dev-set row runs it)."""
    model, tokens = load_model("llama-3.1-8b"), 4096
    lay = Layout(tp=4, dp_replicate=2, micro_batch=1, sequence_parallel=True, fp8=fp8, stack=stack)
    lo = layer_ops(model, 0, lay, tokens, dtype)
    h = model.hidden_size
    assert lo.tp_comm == (("allgather", per_elem * tokens * h), ("reducescatter", 2.0 * tokens * h)) * 2
    # backward: TE gathers a row-parallel layer's grad output quantized, both usages for the block-scaled recipes
    # (``_all_gather_mxfp8`` / ``_all_gather_nvfp4``: rowwise for dgrad, columnwise for wgrad), tensor-scaled fp8 its
    # rowwise copy only (the transpose made locally)
    both = 2 if (stack, fp8) in (("megatron", "mxfp8"), ("megatron", "nvfp4")) else 1
    assert lo.tp_grad_gathers == (both * per_elem * tokens * h,) * 2
    moe = load_model("qwen3-30b-a3b")
    lay_moe = Layout(tp=4, dp_replicate=2, micro_batch=1, sequence_parallel=True, fp8=fp8, stack=stack, ep=2)
    gathers = [b for k, b in layer_ops(moe, 0, lay_moe, tokens, dtype).tp_comm if k == "allgather"]
    assert gathers == [per_elem * tokens * moe.hidden_size, 2.0 * tokens * moe.hidden_size]
    # at expert TP 1 Megatron-Core's dispatcher gathers nothing over TP (its tp_group is the expert-TP group): the
    # routed-expert block has no TP pair, the attention block keeps its own
    lo = layer_ops(moe, 0, replace(lay_moe, etp=1), tokens, dtype)
    assert [k for k, _ in lo.tp_comm] == ["allgather", "reducescatter"] and len(lo.tp_grad_gathers) == 1


def test_dtype_nvfp4_selects_the_recipe_and_refuses_hopper():
    assert fp8_recipe_choices("nvfp4", get_device("GB200")) == ("nvfp4",)
    # blockwise runs as MXFP8 on Blackwell: one candidate, priced alike when pinned (test_blockwise_on_blackwell_...)
    assert fp8_recipe_choices("fp8", get_device("GB200")) == ("tensorwise", "delayed", "mxfp8")
    assert fp8_recipe_choices("fp8", get_device("H100")) == ("tensorwise", "delayed", "blockwise")
    with pytest.raises(MeshplanError, match="H100-SXM does not support nvfp4"):
        get_device("H100").peak("nvfp4")
    with pytest.raises(MeshplanError, match="fp8=nvfp4 needs block-scaled nvfp4 tensor cores"):
        _estimate("8xH100", "bf16", fp8="nvfp4")


def test_cli_dtype_nvfp4_plans_and_megatron_exports_fp4(runner, tmp_path):
    from meshplan.cli.main import app

    out = tmp_path / "p.yaml"
    res = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "8xB200", "--global-batch", "64",
                              "--seq-len", "4096", "--dtype", "nvfp4", "--fix", "tp=1,pp=1,zero=1",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    exp = runner.invoke(app, ["export", str(out), "--to", "megatron"])
    assert exp.exit_code == 0, exp.output
    assert "--fp4-format e2m1 --fp4-recipe nvfp4" in " ".join(exp.output.split())
    bad = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "8xH100", "--global-batch", "64",
                              "--seq-len", "4096", "--dtype", "nvfp4", "--out", str(tmp_path / "q.yaml")])
    assert bad.exit_code == 2 and "does not support nvfp4" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize("dtype, pinned, wants", [("nvfp4", "mxfp8", "fp8"), ("bf16", "mxfp8", "fp8"),
                                                   ("fp8", "nvfp4", "nvfp4"), ("bf16", "nvfp4", "nvfp4")])
def test_cli_refuses_a_pinned_recipe_of_another_dtype(runner, tmp_path, dtype, pinned, wants):
    """A pinned low-precision recipe belongs to one workload dtype (the fp8 recipes to --dtype fp8, NVFP4 to --dtype
    nvfp4): pinned under another, the plan would train in the recipe while taking its MFU against the other dtype's
    peak, so it is refused in one line naming both, and nothing is written."""
    from meshplan.cli.main import app

    out = tmp_path / "p.yaml"
    res = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "8xB200", "--global-batch", "64",
                              "--seq-len", "4096", "--dtype", dtype, "--fix", f"fp8={pinned}", "--out", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    line = " ".join(res.output.split())
    assert f"--fix fp8={pinned}" in line and f"--dtype {dtype}" in line and f"use --dtype {wants}" in line
    assert not out.exists()


def test_blockwise_on_blackwell_prices_as_mxfp8_so_a_free_search_tries_one():
    """Transformer Engine runs blockwise fp8 as MXFP8 on Blackwell ("FP8 Block is emulated via MXFP8",
    docs/examples/gemm_profiling): pinned there, it prices what MXFP8 prices (step and memory), which is why
    ``fp8_recipe_choices`` tries only MXFP8; on Hopper it is its own recipe (1x128 / 128x128 scales, 1 B inputs)."""
    _, _, _, block = _estimate("8xB200", "fp8", fp8="blockwise")
    _, _, _, mx = _estimate("8xB200", "fp8", fp8="mxfp8")
    assert block.step_time_s == mx.step_time_s
    assert block.memory.total_bytes == mx.memory.total_bytes
    _, _, _, hblock = _estimate("8xH100", "fp8", fp8="blockwise")
    _, _, _, htensor = _estimate("8xH100", "fp8", fp8="tensorwise")
    assert hblock.memory.activations_bytes == htensor.memory.activations_bytes  # 1 B saved inputs either way
    assert "blockwise" in fp8_recipe_choices("fp8", get_device("H100"))
