"""Grouped expert GEMMs and the token moves around them, against meshplan's own kernel measurements on one H200 and
one H100 (``costmodel/data/measured``; ``bench/gpu_kernels.py``, BENCHMARKS.md "One H200").

The truth is each measured grouped call (CUDA events, medians). The price is the learned model's dense GEMM of the
same total size (trained on other kernels) times the grouped kernel's share; the share is measured, so each device is
also priced with the share taken from the other device's file alone (leave one device out)."""

import statistics

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.grouped import MEASURED_ON as DEVICE_OF
from meshplan.costmodel.grouped import curves_of, measured_files, priced_over_measured
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.ops_graph import expert_ops, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model


@pytest.fixture(scope="module")
def files():
    got = measured_files()
    assert set(DEVICE_OF) <= set(got), sorted(got)
    return got


@pytest.mark.parametrize("name", sorted(DEVICE_OF))
def test_grouped_calls_priced_within_measurement(files, name):
    """Every width and dtype measured: the median grouped call priced within 0.75-1.25x of its measured time (0.80-1.12
    when written; the
    shipped model priced the same calls as separate GEMMs at 1.44-1.48x for bf16 at 128-512 rows and 0.70-0.78x
    for fp8: BENCHMARKS.md)."""
    pricer, dev = Pricer.shipped(), catalogue()[DEVICE_OF[name]]
    ratios = {k: statistics.median(v) for k, v in priced_over_measured(pricer, files[name], dev).items()}
    assert {d for d, _ in ratios} == {"bf16", "fp8"} and len(ratios) == 8, ratios
    for key, r in ratios.items():
        assert 0.75 <= r <= 1.25, (name, key, round(r, 3))


@pytest.mark.parametrize("held_out", sorted(DEVICE_OF))
def test_grouped_share_transfers_between_devices(files, held_out):
    """Leave one device out: the share measured on the other GPU alone prices the held-out GPU's grouped calls
    within 0.75-1.33x at every width and dtype (0.78-1.19 when written)."""
    other = [d for n, d in files.items() if n != held_out and n in DEVICE_OF]
    curves = curves_of(other)
    by_width = priced_over_measured(Pricer.shipped(), files[held_out], catalogue()[DEVICE_OF[held_out]], curves)
    ratios = {k: statistics.median(v) for k, v in by_width.items()}
    for key, r in ratios.items():
        assert 0.75 <= r <= 1.33, (held_out, key, round(r, 3))


def test_permute_priced_as_a_copy_of_every_routed_token(files):
    """The permute (argsort + gather into expert order), measured at 65536 tokens for four models on the H200,
    against the copy the op list prices for it: within 0.75-1.1x."""
    pricer, dev = Pricer.shipped(), catalogue()["H200"]
    seen = 0
    for r in files["nvidia-h200.json"]["sections"]["permute"]["records"]:
        if r["op"] != "permute" or r["tokens"] != 65536:
            continue
        op = OpSpec("copy", (r["tokens"] * r["topk"] * r["hidden"],), "bf16")
        ratio = pricer.predict(op, dev) * 1e3 / r["median_ms"]
        assert 0.75 <= ratio <= 1.1, (r["model"], ratio)
        seen += 1
    assert seen == 4


def test_stacks_run_experts_grouped_except_plain_pytorch():
    """One grouped GEMM per projection over the local experts (Megatron ``--moe-grouped-gemm``, torchtitan
    ``use_grouped_mm``); plain PyTorch loops: the same FLOPs either way (2 x rows x width x hidden per GEMM)."""
    model = load_model("qwen3-30b-a3b")
    tokens = 4096 * model.experts_per_token
    flops = {}
    for stack in ("megatron", "torchtitan", "eager"):
        ops = expert_ops(model, Layout(dp_shard=8, ep=8, micro_batch=1, stack=stack), tokens, "bf16")
        gemms = [o for o in ops if o.kind == "matmul"]
        local = model.num_experts // 8
        assert len(gemms) == (2 * local if stack == "eager" else 2), stack
        assert all(o.groups == (1 if stack == "eager" else local) for o in gemms), stack
        flops[stack] = sum(o.flops for o in gemms)
    want = 2 * tokens * 3 * model.moe_ffn_hidden_size * model.hidden_size  # gate_up (2F) + down (F)
    for stack, f in flops.items():
        assert f == pytest.approx(want, rel=0.01), stack


def test_token_moves_follow_the_dispatcher():
    """The alltoall dispatcher sorts the received copies by local expert and back (``sort_chunks_by_idxs``);
    DeepEP's flex dispatcher does not: two copies fewer per MoE layer, the permute and unpermute in both."""
    model = load_model("qwen3-30b-a3b")
    kinds = {}
    for disp in ("alltoall", "deepep"):
        lay = Layout(dp_shard=8, ep=8, micro_batch=1, moe_dispatcher=disp)
        moe_layer = next(i for i in range(model.num_layers) if model.is_moe_layer(i))
        ops = layer_ops(model, moe_layer, lay, 4096).compute
        n = 4096 * model.experts_per_token * model.hidden_size
        kinds[disp] = [o.kind for o in ops if o.shape == (n,)]
    assert kinds["alltoall"].count("copy") == 3 and kinds["deepep"].count("copy") == 1, kinds
    assert kinds["alltoall"].count("elementwise") == kinds["deepep"].count("elementwise") == 1, kinds
