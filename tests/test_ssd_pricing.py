"""The Mamba-2 SSD scan's price rests on a published kernel timing (costmodel/data/published/ssd_chunk_scan_h800.json)
and on mamba_ssm's own kernel lists; these tests hold the constants to that measurement and the roofline to it."""
import json
import statistics
from dataclasses import replace
from importlib import resources

from pytest import approx

from meshplan.costmodel.api import SSD_SOURCE, Pricer
from meshplan.costmodel.devices import get_device
from meshplan.costmodel.ops import OpSpec, ssd_bytes, ssd_chunk_scan_bytes, ssd_flops, ssd_group_rereads
from meshplan.costmodel.roofline import ROOFLINE_EFFICIENCY, roofline_s
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.explain import explain_gpu
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model


def _measured() -> dict:
    path = resources.files("meshplan.costmodel").joinpath("data/published/ssd_chunk_scan_h800.json")
    return json.loads(path.read_text(encoding="utf-8"))


def _fractions(data: dict) -> tuple[float, float]:
    """Median over the rows of (share of fp16 peak, share of HBM bandwidth) the measured kernel reached."""
    s, dev = data["shape"], get_device(data["device"])
    flop_shares, bw_shares = [], []
    for r in data["rows"]:
        b, t, sec = s["batch"], r["seq_len"], r["latency_ms"] / 1e3
        # the README's own FLOP count: 2 b T Q H P / 2 (causal intra-chunk) + 2 b T H P N (states to the output)
        flops = 2 * b * t * s["chunk"] * s["heads"] * s["head_dim"] * 0.5 + 2 * b * t * s["heads"] * s["head_dim"] \
            * s["state"]
        assert abs(flops / sec / 1e12 - r["tflops"]) < 0.01 * r["tflops"]  # the table's TFLOP/s column agrees
        nbytes = ssd_chunk_scan_bytes(b, t, s["heads"], s["head_dim"], s["state"], s["groups"], s["chunk"], 2)
        flop_shares.append(flops / sec / dev.peak(data["dtype"]))
        bw_shares.append(nbytes / sec / dev.mem_bw_bytes_per_s)
    return statistics.median(flop_shares), statistics.median(bw_shares)


def test_ssd_efficiencies_are_the_published_kernel_timing():
    flop_share, bw_share = _fractions(_measured())
    eff_f, eff_b = ROOFLINE_EFFICIENCY["ssd"]
    assert abs(eff_f - flop_share) < 0.005, flop_share
    assert abs(eff_b - bw_share) < 0.005, bw_share
    assert "H800" in SSD_SOURCE and "no backward timing" in SSD_SOURCE


def test_roofline_at_those_shares_reproduces_the_measured_kernel():
    """Priced at the measured shares, the chunk-scan kernel's own FLOPs and bytes give back every row's time within
    6% (the rows differ only through their launch-size tail)."""
    data = _measured()
    s, dev = data["shape"], get_device(data["device"])
    eff_f, eff_b = ROOFLINE_EFFICIENCY["ssd"]
    for r in data["rows"]:
        t = r["seq_len"]
        flops = 2 * s["batch"] * t * s["heads"] * s["head_dim"] * (s["chunk"] / 2 + s["state"])
        nbytes = ssd_chunk_scan_bytes(s["batch"], t, s["heads"], s["head_dim"], s["state"], s["groups"], s["chunk"], 2)
        sec = max(flops / (dev.peak("fp16") * eff_f), nbytes / (dev.mem_bw_bytes_per_s * eff_b))
        assert abs(sec * 1e3 / r["latency_ms"] - 1) < 0.06, (t, sec * 1e3, r["latency_ms"])


def test_ssd_backward_is_its_own_kernel_list_not_twice_the_forward():
    """Nemotron 3 Nano's mixer (64 heads of 64, state 128, 8 groups, chunk 128): the backward kernels of mamba_ssm
    move more than twice the forward's bytes (they recompute C B^T and the chunk states and pass the per-head
    tensors 17 times) and run 3 G Q N + 5 H P N + 1.5 H Q P multiply-adds a token."""
    op = OpSpec("ssd", (1, 64, 8192, 64, 128, 8, 128), "bf16")
    bwd = replace(op, backward=True)
    assert ssd_bytes(bwd) > 2 * ssd_bytes(op)
    assert ssd_bytes(bwd) / 8192 > 17 * 2 * 64 * 64  # at least the per-head tensors' passes
    assert ssd_flops(bwd) == 2 * 8192 * (3 * 8 * 128 * 128 + 5 * 64 * 64 * 128 + 1.5 * 64 * 128 * 64)
    dev = get_device("GB300")
    pricer = Pricer.roofline()
    assert pricer.predict(bwd, dev) >= roofline_s(bwd, dev) > 2 * roofline_s(op, dev)


def test_explain_on_blackwell_says_the_ssd_rests_on_the_h800_timing():
    """On a GB300 rack, where no SSD kernel timing is published, ``--explain`` names the H800 measurement, and the
    estimator prices the SSD's backward from its own kernel list (more than twice its forward)."""
    est = GpuEstimator(Pricer.roofline())
    work = Workload(load_model("nemotron-3-nano-30b-a3b"), load_cluster("2x4xGB300-NVL72"), global_batch=64,
                    seq_len=8192)
    lay = Layout(dp_shard=8, ep=8, zero_stage=1)
    note = explain_gpu(est, work, lay)["unmeasured"]["ssd bf16"]
    assert "H800" in note and "no backward timing" in note
    op = OpSpec("ssd", (1, 64, 8192, 64, 128, 8, 128), "bf16")
    dev = get_device("GB300")
    assert est._bwd_s(op, dev) > 2 * est.op_time_s(op, dev)


def _forward_sets() -> list[dict]:
    path = resources.files("meshplan.costmodel").joinpath("data/published/ssd_forward_mamba_ssm.json")
    return json.loads(path.read_text(encoding="utf-8"))["sets"]


def test_the_priced_forward_is_mamba_ssm_s_measured_forward():
    """mamba_ssm's whole SSD forward, timed by others on an H200 (TileOPs PR 1557: one group of 24-128 heads,
    chunk 256) and a B200 (flashinfer PR 2709's copy of its Triton kernels: a group a head, chunk 128): from a
    quarter of a million token-heads up, where bytes rather than launches set the time, every row ran within
    0.74-1.30x of its price, and the H200's rows past L2 (heads re-reading their group's tensors) within 0.9-1.3x."""
    pricer = Pricer.roofline()
    past_l2 = []
    for s in _forward_sets():
        dev = get_device(s["device"])
        for r in s["rows"]:
            if r["batch"] * r["seq_len"] * r["heads"] < 250_000:
                continue
            op = OpSpec("ssd", (r["batch"], r["heads"], r["seq_len"], s["head_dim"], s["state"], s["groups"],
                                s["chunk"]), s["dtype"])
            ratio = r["latency_ms"] / (pricer.predict(op, dev) * 1e3)
            assert 0.7 <= ratio <= 1.35, (s["device"], r, ratio)
            if ssd_group_rereads(op, dev.l2_bytes) > 0:
                past_l2.append(ratio)
    assert len(past_l2) == 10 and all(0.9 <= x <= 1.3 for x in past_l2), past_l2


def test_heads_reread_their_group_s_tensors_only_past_l2():
    """A group's C B^T (fp32) and B, C over the batch: 4 x 32768 tokens x (4 x 256 + 2 x 2 x 128) = 201 MB on the
    H200's 60 MiB L2 leaves 1 - L2 / 201 MB of each later head's 4 Q + 2 e N bytes a token to HBM; a group per head,
    or a batch that fits, reads nothing again."""
    dev = get_device("H200")
    op = OpSpec("ssd", (4, 128, 32768, 64, 128, 1, 256), "bf16")
    shared = 4 * 32768 * (4 * 256 + 2 * 2 * 128)
    miss = 1 - dev.l2_bytes / shared
    assert ssd_group_rereads(op, dev.l2_bytes) == approx(4 * 32768 * 127 * (4 * 256 + 2 * 2 * 128) * miss)
    assert ssd_bytes(op, dev.l2_bytes) == approx(ssd_bytes(op) + ssd_group_rereads(op, dev.l2_bytes))
    bwd = replace(op, backward=True)
    assert ssd_group_rereads(bwd, dev.l2_bytes) == approx(4 * 32768 * 127 * (8 * 256 + 5 * 2 * 128) * miss)
    assert ssd_group_rereads(replace(op, shape=(4, 128, 32768, 64, 128, 128, 256)), dev.l2_bytes) == 0
    assert ssd_group_rereads(replace(op, shape=(1, 128, 2048, 64, 128, 1, 256)), dev.l2_bytes) == 0
