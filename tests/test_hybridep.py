"""Hybrid-EP as a dispatcher: its NVLink share recomputed from the README table it rests on (numbers copied here by
hand from deepseek-ai/DeepEP hybrid-ep @ 94a9f8f, docs/README_Hybrid-EP.md, "Kernel Only", 16 SMs), and the copies a
rank sends inside one NVL72 domain counted by brute force over a simulated top-8 router."""
import numpy as np
import pytest

from meshplan.costmodel.hybridep import hybridep_nvlink_share, measured_range, nvlink_shares
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.export import bridge

# (bf16 dispatch, combine) GB/s, Kernel Only, 16 SMs, as the README prints them
README_B200_8 = (734.95, 673.84)
README_GB200 = {8: (750.15, 684.27), 16: (661.93, 600.75), 24: (637.80, 565.53), 32: (629.79, 547.25),
                36: (612.85, 543.27)}


def test_shares_are_the_readme_figures_over_nvlink5():
    """8 ranks: the B200 and GB200 rows averaged; 16-36: GB200's, each the mean of dispatch and combine / 900 GB/s."""
    want = {k: sum(v) / 2 / 900 for k, v in README_GB200.items()}
    want[8] = (sum(README_B200_8) / 2 + sum(README_GB200[8]) / 2) / 2 / 900
    assert nvlink_shares() == pytest.approx(want, rel=1e-9)
    assert measured_range() == (8, 36)
    assert hybridep_nvlink_share(64) == pytest.approx(want[36])  # beyond the table: its last row
    assert hybridep_nvlink_share(4) == pytest.approx(want[8])


def _distinct_ranks(ranks: int, experts: int, topk: int, tokens: int = 20000) -> float:
    scores = np.random.default_rng(1).random((tokens, experts))
    chosen = np.argsort(-scores, axis=1)[:, :topk] // (experts // ranks)
    return float(np.mean([len(set(row)) for row in chosen]))


def test_hybridep_in_one_nvl72_domain_sends_one_copy_per_rank_at_its_measured_rate():
    """EP64 inside a GB200 NVL72 (Qwen3-235B-like routing: 128 experts, top-8): the link is the plain all-to-all's
    divided by the simulated distinct ranks over 8, at Hybrid-EP's 36-rank share of NVLink instead of NCCL's 0.80."""
    c = load_cluster("1x72xGB200")
    plain = c.alltoall_link(64, 1)
    hyb = c.alltoall_link(64, 1, dedup_topk=8, nvlink_share=hybridep_nvlink_share(64))
    share = _distinct_ranks(64, 128, 8) / 8
    want = plain.bandwidth_bytes_per_s / share * (sum(README_GB200[36]) / 2 / 900) / 0.80
    assert hyb.bandwidth_bytes_per_s == pytest.approx(want, rel=0.03)


def test_megatron_core_parses_the_hybridep_dispatcher(tmp_path):
    """The rendered megatron launch read back by torchrun's and Megatron-LM's own parsers into megatron-core 0.16.1's
    TransformerConfig: the flex dispatcher with the hybridep backend (a repeated flag keeps its last value)."""
    from tests.test_export_golden import _moe_variant
    from tests.test_export_megatron_core import (
        _argv,
        _megatron_args,
        _render_or_refusal,
        _torchrun_parse,
        _transformer_config,
    )
    plan = _moe_variant(moe_dispatcher="hybridep")
    text = _render_or_refusal(plan, "megatron")
    ns = _torchrun_parse(_argv(text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    cfg, args = _transformer_config(_megatron_args(ns.training_script_args))
    assert (args["moe_token_dispatcher_type"], cfg.moe_flex_dispatcher_backend) == ("flex", "hybridep")


def test_bridge_overrides_name_the_hybridep_backend():
    """Megatron-Bridge's model fields, as megatron-core's TransformerConfig names them."""
    from tests.test_export_golden import _moe_variant
    o = bridge.moe_overrides(_moe_variant(moe_dispatcher="hybridep"))
    assert (o["model.moe_token_dispatcher_type"], o["model.moe_flex_dispatcher_backend"]) == ("flex", "hybridep")


def test_explain_names_what_no_measurement_covers():
    """EP 36 in one domain is inside the table: no gap; EP 64 across nodes names both gaps."""
    from meshplan.costmodel import hybridep
    assert hybridep.explain(36, False)[1] == ""
    gap = hybridep.explain(64, True)[1]
    assert "above the 36 ranks measured" in gap and "no Blackwell RDMA row" in gap


# (bf16 dispatch, combine) GB/s, Kernel Only, 32 SMs, GB200, as the README prints them (no B200 row at 32 SMs)
README_GB200_32 = {8: (764.03, 737.13), 16: (706.95, 666.26), 24: (665.97, 639.80), 32: (642.23, 605.15),
                   36: (632.31, 596.99)}


def test_shares_at_32_sms_are_the_readme_32_sm_rows():
    """32 SMs (Megatron-Bridge's performance scripts): the GB200 32-SM rows; an SM count between two rows takes the
    one below it, and more than the table's largest its largest, which --explain names."""
    from meshplan.costmodel import hybridep
    want = {k: sum(v) / 2 / 900 for k, v in README_GB200_32.items()}
    assert nvlink_shares(32) == pytest.approx(want, rel=1e-9)
    assert hybridep_nvlink_share(32, 32) == pytest.approx(want[32])
    assert nvlink_shares(128) == nvlink_shares(32) and nvlink_shares(24) == nvlink_shares(16)
    assert nvlink_shares(8) == nvlink_shares(16)
    assert "at 32 SMs" in hybridep.explain(32, False, 32)[0] and hybridep.explain(32, False, 32)[1] == ""
    assert "no row at that count; the 32-SM rows" in hybridep.explain(32, False, 128)[1]


def _explain(tmp_path, fix: str) -> dict:
    from meshplan.planner.search.job import PlanRequest, plan_job
    out = plan_job(PlanRequest.of("qwen3-30b-a3b", "2x4xGB200-NVL72", 512, 4096, fix=fix, top=1, dtype="fp8",
                                  explain=True, out=tmp_path / "plan.yaml"))
    return out.plan.explain


def test_the_dispatch_takes_the_bandwidth_of_its_sms(tmp_path):
    """Qwen3-30B-A3B at EP 8 in one NVL72 domain: Hybrid-EP's link on 32 SMs over on 16 is the README's 32-SM share
    at 8 ranks (GB200) over its 16-SM one (B200 and GB200 rows averaged), and --explain names the SMs."""
    from meshplan.planner.estimate.gpu import group_links
    from meshplan.planner.layout.layout import Layout
    from meshplan.planner.model.config import load_model
    cluster, model = load_cluster("2x4xGB200-NVL72"), load_model("qwen3-30b-a3b")
    bw = {sms: group_links(cluster, model, Layout(dp_shard=8, ep=8, moe_dispatcher="hybridep", hybridep_sms=sms))[1]
          .bandwidth_bytes_per_s for sms in (16, 32)}
    share16 = (sum(README_B200_8) / 2 + sum(README_GB200[8]) / 2) / 2
    assert bw[32] / bw[16] == pytest.approx(sum(README_GB200_32[8]) / 2 / share16, rel=1e-9)
    mesh = "dp=8,tp=1,pp=1,cp=1,ep=8,mbs=4,zero=1,recompute=none,moe_dispatcher=hybridep,moe_overlap=false"
    ex = _explain(tmp_path, f"{mesh},hybridep_sms=32")
    assert "at 32 SMs" in ex["priced_from"]["ep dispatch (hybridep)"]


def test_an_overlapped_dispatch_takes_its_sms_from_the_compute():
    """Overlapped, the all-to-all's kernels hold their SMs: Hybrid-EP its ``hybridep_sms`` of the device's, another
    dispatcher the 20 DeepSeek-V3's report names (of a GB200's 148 here: NVIDIA publishes no Blackwell SM count;
    devices.yaml cites its source)."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.gpu import ep_sm_share
    from meshplan.planner.layout.layout import Layout
    dev = load_cluster("2x4xGB200-NVL72").device
    assert ep_sm_share(dev, Layout(moe_dispatcher="hybridep", hybridep_sms=32)) == pytest.approx(32 / dev.sm_count)
    assert ep_sm_share(dev, Layout(moe_dispatcher="hybridep")) == pytest.approx(16 / dev.sm_count)
    assert ep_sm_share(dev, Layout(moe_dispatcher="deepep", hybridep_sms=32)) == pytest.approx(20 / dev.sm_count)


def test_megatron_lm_cannot_set_the_sms_and_says_so():
    """Megatron-LM's arguments have no Hybrid-EP SM flag (core_r0.16.0 to core_v0.19.0): its export warns where
    the plan priced another count than Megatron-Core's 16; the bridge writes the field, so it does not."""
    from meshplan.planner.export import megatron
    from tests.test_export_golden import _moe_variant
    plan = _moe_variant(moe_dispatcher="hybridep", hybridep_sms=32)
    assert any(n.startswith("megatron: hybridep_sms=32:") for n in megatron.unsupported(plan))
    assert not any("hybridep_sms" in n for n in bridge.unsupported(plan))
    assert bridge.moe_overrides(plan)["model.moe_hybridep_num_sms"] == 32
    assert not any("hybridep_sms" in n for n in megatron.unsupported(_moe_variant(moe_dispatcher="hybridep")))
    assert "model.moe_hybridep_num_sms" not in bridge.moe_overrides(_moe_variant(moe_dispatcher="deepep"))


def _qwen_step(estimator, sms: int) -> float:
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.layout.layout import Layout
    from meshplan.planner.model.config import load_model
    work = Workload(load_model("qwen3-30b-a3b"), load_cluster("2x4xGB200-NVL72"), 512, 4096, "fp8")
    lay = Layout(dp_shard=8, ep=8, zero_stage=1, micro_batch=4, fp8="mxfp8", moe_dispatcher="hybridep",
                 hybridep_sms=sms)
    return estimator.estimate(work, lay).step_time_s


def test_one_estimator_prices_both_sm_counts_as_two_fresh_ones():
    """The estimator's caches (links, layer times) key on the SMs: 16 then 32 on one estimator give what two fresh
    estimators give, and the two differ."""
    from meshplan.costmodel.api import Pricer
    from meshplan.planner.estimate.gpu import GpuEstimator
    shared = GpuEstimator(Pricer.shipped())
    both = [_qwen_step(shared, sms) for sms in (16, 32)]
    apart = [_qwen_step(GpuEstimator(Pricer.shipped()), sms) for sms in (16, 32)]
    assert both == apart and both[0] != both[1]


def test_the_layout_names_sms_other_than_megatron_cores():
    """The ranked table and --json say which SM count a Hybrid-EP layout was priced at where it is not Megatron-Core's
    own 16; another dispatcher has none."""
    from meshplan.planner.layout.layout import Layout
    from meshplan.planner.search.exact import describe
    words = describe(Layout(dp_shard=8, ep=8, moe_dispatcher="hybridep", hybridep_sms=32)).split()
    assert "moe_dispatcher=hybridep(sms=32)" in words
    assert "moe_dispatcher=hybridep" in describe(Layout(dp_shard=8, ep=8, moe_dispatcher="hybridep")).split()
    assert "sms=" not in describe(Layout(dp_shard=8, ep=8, moe_dispatcher="deepep", hybridep_sms=32))
