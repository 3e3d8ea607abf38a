"""The MoE router's eager score function and top-k (``costmodel.router_topk``), and where it runs fused."""
from __future__ import annotations

import pytest

from meshplan.costmodel import router_topk
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.stacks import load_stacks
from meshplan.planner.model.config import load_model


def test_the_price_is_the_measured_kernel_on_the_parts_it_ran_on():
    """Every timed router (H100 and H200; softmax and sigmoid; 128 and 256 experts; 4,096 to 65,536 tokens) within
    12% of the price, the price rising with tokens x experts; the two parts priced alike, as they measured."""
    rows = router_topk.records()
    assert len(rows) == 48
    pricer = Pricer.shipped()
    for r in rows:
        op = OpSpec("topk", (r["tokens"], r["experts"], r["topk"]), "fp32")
        assert pricer.predict(op, catalogue()[r["part"]]) == pytest.approx(r["seconds"], rel=0.12), r
    h100, h200 = catalogue()["H100-SXM"], catalogue()["H200"]
    op = OpSpec("topk", (8192, 512, 22), "fp32")
    assert pricer.predict(op, h100) == pytest.approx(pricer.predict(op, h200))
    assert pricer.predict(op, h100) > pricer.predict(OpSpec("topk", (8192, 128, 22), "fp32"), h100) * 3


def test_another_part_scales_by_its_sms_and_clock_and_says_so():
    pricer, op = Pricer.shipped(), OpSpec("topk", (65536, 128, 8), "fp32")
    h100, b300 = catalogue()["H100-SXM"], catalogue()["B300"]
    ratio = (h100.sm_count * h100.clock_hz) / (b300.sm_count * b300.clock_hz)
    assert pricer.predict(op, b300) == pytest.approx(pricer.predict(op, h100) * ratio)
    assert "scaled by SMs x clock to B300" in pricer.predict_with_source(op, b300)[1]
    assert "scaled" not in pricer.predict_with_source(op, h100)[1]


def test_the_router_runs_its_top_k_unfused_unless_fused_or_contiguous():
    """Megatron-Core's default (``moe_router_fusion`` off) runs torch's score function and top-k: a ``topk`` op over
    the layer's tokens and experts; fused, or under a contiguous router, one softmax pass in its place."""
    spec = load_model("qwen3-30b-a3b")
    moe = next(i for i in range(spec.num_layers) if "E" in spec.layer_kind(i))

    def router(**kw):
        ops = layer_ops(spec, moe, Layout(ep=8, micro_batch=2, **kw), 4096).compute
        return [(o.kind, o.shape) for o in ops if o.kind in ("topk", "softmax")]

    assert router() == [("topk", (2 * 4096, 128, 8))]
    assert router(moe_router_fusion=True) == [("softmax", (2 * 4096, 128))]
    assert router(moe_router="contiguous") == [("softmax", (2 * 4096, 128))]


def test_the_perf_scripts_fuse_the_router_where_their_files_say():
    """Megatron-Bridge's performance scripts set moe_router_fusion for DeepSeek-V3, GPT-OSS and Qwen3 from v0.2.0 (and
    Kimi-K2 from v0.3.1, where its scripts begin); r0.1.0 (25.09) and the Nemotron models keep Megatron-Core's off."""
    cat = load_stacks()
    for version in ("25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01"):
        prof = cat.get(f"megatron-bridge-perf@{version}")
        fused = {v.model for v in prof.values if v.key == "moe_router_fusion" and v.value == "true"}
        assert {"deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b"} <= fused, version
        assert ("kimi-k2" in fused) == (version not in ("25.11", "26.02"))
        assert not {m for m in fused if m.startswith("nemotron")}
    assert not [v for v in cat.get("megatron-bridge-perf@25.09").values if v.key == "moe_router_fusion"]


def test_the_fit_holds_for_an_expert_count_it_did_not_see():
    """Fitted on 128 experts' timings alone it prices 256 experts' (and back) within 10% at the median: the time per
    token and expert carries over the expert count, as a 512-expert model (Nemotron 3 Super) needs."""
    from meshplan.costmodel.fitted import router_topk_rows

    row = router_topk_rows()[0]
    assert row["held_out_error_pct"] < 10 and row["step_times_used"] == 0
