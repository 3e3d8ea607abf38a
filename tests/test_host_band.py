"""The step an MoE plan takes at the other published x86 host speed (``planner.estimate.host_band``).

Truths the pricing does not compute: the two published x86 / Grace ratios (pytorch issue 187862, the priced one:
``OpOverload.__call__`` at 181.7 ns median on an H100 host against 197.4 ns on a GB200; TransformerEngine issue 2053:
a ``torch.nn.Linear`` forward at 13.48 us on a DGX H100's Xeon against 37.08 us on a GB200), the routed stretch's host
time NVIDIA's GB200 timeline shows (3.45 ms at 8 experts a rank, 90 us more an expert), and where no wait exists
(Grace, where both ratios are 1; a dense model; a whole-iteration graph).
"""
from __future__ import annotations

import pytest

from meshplan.planner.estimate.gpu import straggler_slowdown
from meshplan.planner.search.job import PlanRequest, plan_job

MESH = "tp=1,pp=1,cp=1,ep=8,mbs=4,zero=1,recompute=none,moe_dispatcher=hybridep"
LAYERS, MICRO_BATCHES = 48, 512 // (8 * 4)  # Qwen3-30B-A3B, global batch 512 over DP 8 at micro-batch 4
PRICED, OTHER = 181.7 / 197.4, 13.48 / 37.08
# the routed stretch of a rank holding Qwen3-30B-A3B's 16 experts (128 at EP 8): the timeline's 3.45 ms at 8, and
# its two grouped linears' host ranges (0.377 + 0.34 ms over 8 experts) for each of the 8 more
ROUTED_16_S = 3.45e-3 + 8 * (0.377e-3 + 0.34e-3) / 8
# the host's lead before it launches fc1's grouped GEMM at 16 experts: the timeline's 0.84 ms from the dispatch's end
# to fc1's range (+686.9 to +687.74 ms), then that range's 0.377 ms at 8 experts, twice
FC1_LAUNCH_16_S = (687.74e-3 - 686.9e-3) + 2 * 0.377e-3


def _explain(tmp_path, cluster: str, fix: str, model: str = "qwen3-30b-a3b") -> dict:
    out = plan_job(PlanRequest.of(model, cluster, 512, 4096, fix=fix, top=1, dtype="fp8", explain=True,
                                  out=tmp_path / "plan.yaml"))
    return out.plan.explain


def test_an_x86_plan_prices_the_other_host_speed(tmp_path) -> None:
    """On DGX-B200 (x86) with per-layer graphs each layer waits for the routed experts' eager stretch at both
    speeds, so the step at the other speed is shorter by the difference of the two published ratios times a host
    time between the lead before fc1's GEMM (what the GPU cannot start before) and the whole stretch, per layer and
    micro-batch, stretched by the slowest of the 8 ranks."""
    ex = _explain(tmp_path, "1x8xB200", f"{MESH},cuda_graphs=layers")
    band = ex["host_speed"]
    assert band["host_over_grace"] == {"priced": pytest.approx(PRICED), "alternative": pytest.approx(OTHER)}
    assert ex["stages"][0]["exposed_comm_s"]["host wait after the MoE token-count sync"] > 0
    per_host_s = LAYERS * MICRO_BATCHES * (PRICED - OTHER) * (1 + straggler_slowdown(8))
    assert FC1_LAUNCH_16_S * per_host_s <= ex["step_time_s"] - band["step_time_s"] <= ROUTED_16_S * per_host_s
    assert band["change"] == pytest.approx(band["step_time_s"] / ex["step_time_s"] - 1)


@pytest.mark.parametrize("cluster, fix, model", [
    ("2x4xGB200-NVL72", f"{MESH},cuda_graphs=layers", "qwen3-30b-a3b"),  # Grace: both ratios are 1
    ("1x8xB200", f"{MESH},cuda_graphs=iteration", "qwen3-30b-a3b"),  # one graph: no wait to move
    ("1x8xB200", "tp=1,pp=1,cp=1,mbs=4,zero=1,recompute=none", "llama-3.1-8b-instruct"),  # dense: no sync
    ("1x8xB200", f"{MESH},cuda_graphs=layers,moe_impl=automodel", "qwen3-30b-a3b"),  # AutoModel's layer: unpriced
])
def test_no_band_where_no_wait_moves(tmp_path, cluster: str, fix: str, model: str) -> None:
    assert "host_speed" not in _explain(tmp_path, cluster, fix, model)
