"""The token counts a dropless MoE layer exchanges before its sync (``host_wait.count_exchange_s``), priced by NCCL's
own LL-protocol latency model (``collectives.nccl_ll_latency_s``)."""
from __future__ import annotations

import pytest

from meshplan.costmodel.collectives import Link, nccl_ll_latency_s
from meshplan.costmodel.devices import catalogue
from meshplan.planner.estimate.host_wait import count_exchange_s
from meshplan.planner.layout.layout import Layout


@pytest.mark.parametrize("kind, p, nodes, us", [
    # NVIDIA/nccl src/graph/tuning.cc @ 5067397, by hand: ring LL base 6.6 us + a step's hardware latency, NVLink
    # 0.6 us; across nodes the intra steps at the 1 us network overhead and the crossing steps at the network's 2.7
    ("allgather", 8, 1, 6.6 + 7 * 0.6),
    ("allgather", 64, 1, 6.6 + 63 * 0.6),  # one NVL72 rack
    ("allgather", 64, 8, 6.6 + 56 * 1.0 + 7 * 2.7),
    ("allgather", 4, 4, 6.6 + 3 * 5.0),  # one rank a node: the tree's network latency, as NCCL takes it
    # all-reduce: the faster of the ring (twice the steps) and the tree (6.8 + 2 (0.6 (k-1) + 5.0 log2 N))
    ("allreduce", 2, 1, 6.6 + 2 * 0.6),
    ("allreduce", 256, 32, 6.8 + 2 * (7 * 0.6 + 5 * 5.0)),
    ("allgather", 1, 1, 0.0)])
def test_nccl_ll_latency_model(kind, p, nodes, us) -> None:
    assert nccl_ll_latency_s(kind, p, nodes) == pytest.approx(us * 1e-6)


def test_only_the_alltoall_dispatchers_dropless_layers_exchange_counts() -> None:
    """Megatron-Core's MoEAlltoAllTokenDispatcher.preprocess all-gathers the tokens per expert over the expert-TP x
    EP group unless the layer drops and pads to capacity; the flex dispatcher's kernels carry theirs; a lone rank has
    nothing to exchange."""
    dev, link = catalogue()["B200"], Link("ib", 40e9, 10e-6, nodes=8, intra_latency_s=3.5e-6)
    base = dict(ep=64, micro_batch=1, moe_dispatcher="alltoall")
    got = count_exchange_s(Layout(**base), 128, link, dev)
    assert got == pytest.approx(nccl_ll_latency_s("allgather", 64, 8) + 63 / 64 * 8 * 128 * 64 / 40e9)
    assert count_exchange_s(Layout(**{**base, "moe_capacity": 1.0}), 128, link, dev) == 0.0
    for dispatcher in ("deepep", "hybridep"):
        assert count_exchange_s(Layout(**{**base, "moe_dispatcher": dispatcher}), 128, link, dev) == 0.0
    assert count_exchange_s(Layout(**{**base, "ep": 1}), 128, link, dev) == 0.0
    assert count_exchange_s(Layout(**{**base, "stack": "torchtitan"}), 128, link, dev) == 0.0


def test_the_plan_pays_the_exchange_once_per_moe_layer_and_micro_batch(tmp_path) -> None:
    """Qwen3-30B-A3B on 1x8xB200 at EP 8 under the alltoall dispatcher: ``--explain`` books the counts' all-gather
    (one per MoE layer and micro-batch, forward only) apart from the host wait: 48 layers x 16 micro-batches of
    NCCL's LL all-gather over 8 NVLink ranks plus 8 x 128 x 8 bytes on the link; Hybrid-EP books none."""
    from meshplan.planner.search.job import PlanRequest, plan_job

    def explain(dispatcher: str) -> dict:
        fix = f"tp=1,pp=1,cp=1,ep=8,mbs=4,zero=1,recompute=none,cuda_graphs=layers,moe_dispatcher={dispatcher}"
        out = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xB200", 512, 4096, fix=fix, top=1, dtype="fp8",
                                      explain=True, out=tmp_path / "plan.yaml"))
        return out.plan.explain["stages"][0]["exposed_comm_s"]

    comm = explain("alltoall")
    line = next(k for k in comm if k.startswith("ep allgather of the token counts"))
    link_bw = 0.80 * 900e9  # links.yaml: DGX-B200's NVLink 5, 900 GB/s a direction at NCCL's 0.80
    one = nccl_ll_latency_s("allgather", 8, 1) + 7 / 8 * 8 * 128 * 8 / link_bw
    assert comm[line] == pytest.approx(48 * 16 * one, abs=1e-6)  # explain rounds to the microsecond
    assert "host wait after the MoE token-count sync" in comm
    assert not any(k.startswith("ep allgather of the token counts") for k in explain("hybridep"))
