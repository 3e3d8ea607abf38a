"""fp8 as Transformer Engine runs it (issue 13 item 1, issue 12 item 4): the decoder's linear-layer GEMMs in fp8, each
after a cast of its bf16 input; attention, norms, activations, embedding and the output layer in bf16. So fp8 does
not make a step 2x faster: on Llama-3.1-8B the non-GEMM work keeps its bf16 price."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.ops_graph import embedding_ops, head_ops, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model


def test_only_decoder_gemms_run_in_fp8_each_after_a_cast():
    m = load_model("llama-3.1-8b")
    lay = Layout(tp=1, micro_batch=1)
    fp8 = layer_ops(m, 0, lay, 4096, "fp8").compute
    bf16 = layer_ops(m, 0, lay, 4096, "bf16").compute
    kinds = Counter((o.kind, o.dtype) for o in fp8)
    gemms = [o for o in bf16 if o.kind == "matmul"]
    assert kinds[("matmul", "fp8")] == len(gemms) == 4  # qkv, out, gate+up, down
    assert kinds[("cast", "bf16")] == len(gemms)
    casts = [o for o in fp8 if o.kind == "cast"]
    assert [c.shape[0] for c in casts] == [g.shape[0] * g.shape[2] for g in gemms]  # m x k input of each GEMM
    assert {o.dtype for o in fp8 if o.kind not in ("matmul", "cast")} == {"bf16"}
    assert {o.dtype for o in (*head_ops(m, lay, 4096, "fp8"), *embedding_ops(m, lay, 4096, "fp8"))} <= {"bf16",
                                                                                                      "fp32"}


def test_fp8_is_not_twice_as_fast():
    m = load_model("llama-3.1-8b")
    dev = load_cluster("8xH100").device
    pricer = Pricer.from_dir(None)
    lay = Layout(tp=1, micro_batch=1)

    def layer_s(dtype):
        return sum(pricer.predict(o, dev) for o in layer_ops(m, 0, lay, 8192, dtype).compute)

    gemm_bf16 = sum(pricer.predict(o, dev) for o in layer_ops(m, 0, lay, 8192, "bf16").compute if o.kind == "matmul")
    other_bf16 = layer_s("bf16") - gemm_bf16
    # the non-GEMM work (attention, norms, activations) is priced as in bf16, plus the casts
    assert layer_s("fp8") > other_bf16 + 0.25 * gemm_bf16
    assert layer_s("fp8") > 0.5 * layer_s("bf16")


def test_fp8_rule_matches_transformer_engines_own_gemm_benchmark():
    """Transformer Engine's GEMM profiling guide (NVIDIA/TransformerEngine docs/examples/gemm_profiling/
    gemm_profiling.rst, PR #2863, "Worked Example: 5B Model on H200") times the 12 GEMMs of a hidden-4096 /
    FFN-16384 layer at M = 15,872 tokens on an H200 NVL: BF16 31.968 ms per layer, FP8 (tensor-wise, pre-quantized:
    the kernels alone) 16.785 ms, i.e. 0.525 of bf16; FP8 DelayedScaling through te.Linear (input and weight casts
    in every call) 18.978 of 32.014 ms, 0.593. meshplan's rule (costmodel.api FP8_FIXED_K, from DeepGEMM) prices the
    kernels, and ops_graph's casts of the inputs (forward, and the grad outputs in backward) the quantization."""
    dev = load_cluster("8xH200").device
    pricer = Pricer.from_dir(None)
    M, h, f = 15872, 4096, 16384
    bf16 = fp8 = casts = 0.0
    for n, k in ((3 * h, h), (h, h), (f, h), (h, f)):  # QKV, attention out, MLP up, MLP down (m, n, k)
        for backward in (False, True):  # forward; dgrad + wgrad
            bf16 += pricer.predict(OpSpec("matmul", (M, n, k), "bf16", backward=backward), dev)
            fp8 += pricer.predict(OpSpec("matmul", (M, n, k), "fp8", impl="delayed", backward=backward), dev)
        casts += 3 * pricer.predict(OpSpec("cast", (M * k,), "bf16"), dev)  # forward cast, backward 2x (estimator)
    assert abs(fp8 / bf16 - 16.785 / 31.968) < 0.03
    # with the casts: at or below TE's delayed-scaling figure, which also re-casts the weights in every call (TE
    # caches them across a training step's micro-batches) and runs at 600 W (H200 NVL) rather than 700 W
    assert 16.785 / 31.968 < (fp8 + casts) / bf16 <= 18.978 / 32.014 + 0.01


def test_each_fp8_gemm_quantizes_its_output_gradient_in_backward():
    """Transformer Engine's ``_Linear.backward`` quantizes the GEMM's output gradient (``m x n``) for dgrad and wgrad;
    the input's column-wise copy was written by the forward's cast. Megatron-Core's output projection saves its
    original input under every recipe but delayed scaling (core_v0.16.1 attention.py ``set_save_original_input``),
    so its backward quantizes that input again, column-wise only: 3 of the cast class's 4 B an element. Shapes from
    Llama-3.1-8B's config at 4096 tokens: q 4096 and k, v 1024 wide (6144), hidden 4096, ffn 14336."""
    m = load_model("llama-3.1-8b")
    tokens, h, qkv, ffn = 4096, 4096, 4096 + 2 * 1024, 14336
    outputs = [qkv, h, 2 * ffn, h]  # qkv, out, gate+up, down: each GEMM's n
    inputs = [h, h, h, ffn]
    for recipe, proj_again in (("delayed", 0), ("mxfp8", 3 * tokens * h // 4)):
        lay = Layout(tp=1, micro_batch=1, fp8=recipe)
        casts = [o for o in layer_ops(m, 0, lay, tokens, "fp8").compute if o.kind == "cast"]
        assert [c.shape for c in casts] == [
            (tokens * k, tokens * n + (proj_again if i == 1 else 0)) for i, (k, n) in enumerate(zip(inputs, outputs))]
    est = GpuEstimator(Pricer.from_dir(None))
    dev = load_cluster("8xH100").device
    cast = casts[0]
    assert est._bwd_s(cast, dev) == est.op_time_s(OpSpec("cast", (cast.shape[1],), cast.dtype), dev)


def test_sequence_parallel_quantizes_this_ranks_rows_before_the_gather():
    """Under sequence parallelism Transformer Engine quantizes a column-parallel layer's input on this rank's
    ``1 / tp`` of the tokens and all-gathers the fp8 copy (``LayerNormLinear``), and a row-parallel layer's output
    gradient alike in the backward (``grad_output_preprocess``). Llama-3.1-8B at TP 2, 4096 tokens: QKV 3072 and
    gate+up 14336 columns a rank, the output projection's 2048 and the down projection's 7168 input columns."""
    m = load_model("llama-3.1-8b")
    tokens, h, t = 4096, 4096, 2
    lay = Layout(tp=t, dp_replicate=4, micro_batch=1, fp8="mxfp8", sequence_parallel=True)
    casts = [o.shape for o in layer_ops(m, 0, lay, tokens, "fp8").compute if o.kind == "cast"]
    local = tokens // t
    assert casts == [(local * h, tokens * 3072),  # QKV: forward on the local rows, backward its whole gradient
                     (tokens * 2048, local * h + 3 * tokens * 2048 // 4),  # out: gradient local, input again
                     (local * h, tokens * 14336),  # gate + up
                     (tokens * 7168, local * h)]  # down
    no_sp = [o.shape for o in layer_ops(m, 0, replace(lay, sequence_parallel=False), tokens, "fp8").compute
             if o.kind == "cast"]
    assert no_sp[0] == (tokens * h, tokens * 3072) and no_sp[3] == (tokens * 7168, tokens * h)
