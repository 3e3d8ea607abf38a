"""fp8 as Transformer Engine runs it (issue 13 item 1, issue 12 item 4): the decoder's linear-layer GEMMs in fp8, each
after a cast of its bf16 input; attention, norms, activations, embedding and the output layer in bf16. So fp8 does
not make a step 2x faster: on Llama-3.1-8B the non-GEMM work keeps its bf16 price."""
from __future__ import annotations

from collections import Counter

from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster import load_cluster
from meshplan.planner.layout import Layout
from meshplan.planner.model_spec import load_model
from meshplan.planner.ops_graph import embedding_ops, head_ops, layer_ops


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
