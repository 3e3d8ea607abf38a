"""``moe_router=contiguous``: NeMo AutoModel's fake balanced gate, whose token copies sit on adjacent experts.

The truth each test holds to: the gate's own index arithmetic run in torch (``FakeBalancedGate.forward``,
``components/moe/layers.py`` @ 89e3a9fdd: ``torch.arange(T * topk).view(-1, topk) % n_experts``), counted by brute
force, and the dispatch bytes that follow from it.
"""
from __future__ import annotations

import math

import pytest
import torch

from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.gpu import group_links
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model
from meshplan.planner.model.routing import contiguous_spread
from tests.helpers import data_path, load_dev_set


def _gate_spread(tokens: int, experts: int, topk: int, ep: int, ranks_per_node: int) -> tuple[float, float]:
    """Mean distinct EP ranks and nodes per token of the fake balanced gate, counted token by token."""
    indices = torch.arange(tokens * topk).view(-1, topk) % experts  # the gate's own routing
    ranks = indices // (experts // ep)
    nodes = ranks // ranks_per_node if ranks_per_node else torch.zeros_like(ranks)
    distinct = [(len(set(r.tolist())), len(set(n.tolist()))) for r, n in zip(ranks, nodes)]
    return (sum(d[0] for d in distinct) / tokens, sum(d[1] for d in distinct) / tokens)


@pytest.mark.parametrize("experts, topk, ep, per_node", [
    (128, 8, 8, 0),    # Qwen3-30B-A3B at EP 8 in one node: every token on one rank
    (256, 8, 64, 8),   # DeepSeek-V3 at EP 64 over 8 nodes: two ranks of one node
    (384, 8, 32, 8),   # Kimi K2 at EP 32: 12 experts a rank, so some tokens straddle two
    (128, 4, 64, 8),   # GPT-OSS-120B at EP 64
    (60, 4, 4, 2),     # Qwen1.5-MoE-A2.7B: 15 experts a rank, a start that is not a multiple of them
    (40, 6, 8, 4),     # topk not dividing the experts: gcd(6, 40) = 2 starts apart
])
def test_spread_matches_the_gate_token_by_token(experts, topk, ep, per_node):
    tokens = experts * 32  # the gate's routing repeats every `experts` tokens (or sooner)
    assert contiguous_spread(experts, topk, ep, per_node) == pytest.approx(
        _gate_spread(tokens, experts, topk, ep, per_node))


def test_one_node_dispatch_moves_one_copy_per_token_not_five():
    """Qwen3-30B-A3B at EP 8 on one H100 node under DeepEP: a trained router's 8 distinct experts of 128 (16 a rank)
    sit on E[distinct ranks] = 8 (1 - C(112, 8) / C(128, 8)) = 5.34 ranks, the gate's on 1, so the same routed bytes
    take 5.34x the bandwidth to move."""
    model = load_model(str(data_path("model_configs", "qwen3-30b-a3b.json")))
    cluster = load_cluster("1x8xH100")
    base = Layout(dp_shard=8, ep=8, zero_stage=3, moe_dispatcher="deepep")
    learned = group_links(cluster, model, base)[1].bandwidth_bytes_per_s
    gate = group_links(cluster, model, base.with_(moe_router="contiguous"))[1].bandwidth_bytes_per_s
    assert gate / learned == pytest.approx(8 * (1 - math.comb(112, 8) / math.comb(128, 8)), rel=1e-9)


def test_across_nodes_the_dispatch_sends_one_copy_per_node_reached():
    """DeepSeek-V3 at EP 64 over eight H100 nodes under DeepEP, bound by each GPU's NIC either way. Its group-limited
    router (8 groups of 32 experts, a token's from 4 of them; DeepSeek-V3 report section 2.1.2, one group a node here)
    reaches 4 of the 8 nodes; the gate's 8 adjacent experts sit on 2 ranks of one node. Of each routed copy's bytes
    the NIC carries (7/8) * 4/8 against (7/8) * 1/8: 4x the bandwidth for the same bytes."""
    model = load_model(str(data_path("model_configs", "deepseek-v3.json")))
    assert (model.routing_groups, model.routing_groups_per_token, model.experts_per_token) == (8, 4, 8)
    assert contiguous_spread(256, 8, 64, 8) == (2.0, 1.0)
    cluster = load_cluster("8x8xH100")
    base = Layout(dp_shard=64, ep=64, zero_stage=3, moe_dispatcher="deepep")
    learned = group_links(cluster, model, base)[1].bandwidth_bytes_per_s
    gate = group_links(cluster, model, base.with_(moe_router="contiguous"))[1].bandwidth_bytes_per_s
    assert gate / learned == pytest.approx(4.0, rel=1e-9)


def test_the_nccl_all_to_all_sends_a_copy_per_expert_either_way():
    """Megatron's alltoall dispatcher sends one copy per routed expert: where the copies sit changes nothing."""
    model = load_model(str(data_path("model_configs", "qwen3-30b-a3b.json")))
    cluster = load_cluster("2x8xH100")
    base = Layout(dp_shard=16, ep=16, zero_stage=3, moe_dispatcher="alltoall")
    assert group_links(cluster, model, base)[1] == group_links(cluster, model, base.with_(moe_router="contiguous"))[1]


def test_every_export_target_names_the_router_it_cannot_carry():
    """No launcher has AutoModel's fake balanced gate: each target's notes say so where the gate changed the priced
    dispatch (a deduplicating dispatcher over EP > 1), and a learned router's say nothing of it."""
    from meshplan.planner.export import accelerate, deepspeed, megatron, torchrun, torchtitan
    from tests.test_export_bridge import plan_qwen3_moe

    gate, learned = plan_qwen3_moe(moe_router="contiguous", moe_dispatcher="deepep"), plan_qwen3_moe()
    unpriced = plan_qwen3_moe(moe_router="contiguous")  # NCCL's all-to-all: the router changed no price
    for target in (accelerate, deepspeed, megatron, torchrun, torchtitan):
        assert any("moe_router=contiguous" in line for line in target.unsupported(gate)), target.__name__
        for plan in (learned, unpriced):
            assert not any("moe_router" in line for line in target.unsupported(plan)), target.__name__


def test_automodel_rows_route_as_their_table_says():
    """The AutoModel table states 'Fake balanced gate is enabled' for every row: each MoE row is priced with the
    gate, as a stated fact (not a per-row setting), in both of the harness's modes."""
    dev_set = load_dev_set()
    checked = set()
    for row in dev_set.load_rows(dev_set.DEFAULT_RUNS):
        if row["source_id"] != "S5":
            continue
        for profile_only in (False, True):
            inp = dev_set.row_needs(row, dev_set.DEFAULT_RUNS, profile_only)
            if inp.out_of_scope or not inp.moe:
                continue
            assert inp.fix.get("moe_router") == "contiguous", row["name"]
            assert not any(s.startswith("moe_router") for s in inp.per_row), row["name"]
            checked.add(row["name"])
    assert len(checked) == 9  # DeepSeek-V3 x2, Kimi K2, Qwen3-30B, GPT-OSS x2, Nemotron 3 Nano, Super and Ultra


def test_a_held_out_automodel_row_keeps_the_gate_its_publication_names(tmp_path):
    """``bench/as_held_out.py`` keeps the router the AutoModel table names ('Fake balanced gate is enabled') for its MoE
    rows (its dense row has no router), a held-out row states it as ``moe_router``, and a word that is not one of
    meshplan's is left to the search and named."""
    from tests.helpers import load_bench

    dev_set, held = load_dev_set(), load_bench("as_held_out", "as_stated")
    runs_dir = data_path("published_runs")
    row = next(r for r in dev_set.load_rows(runs_dir) if r["name"] == "automodel-qwen3-30b-8")
    cut = held.as_stated(row, runs_dir, None)
    assert cut["moe_router"] == "contiguous"
    assert dev_set.row_needs(cut, runs_dir).fix["moe_router"] == "contiguous"
    dense = next(r for r in dev_set.load_rows(runs_dir) if r["name"] == "automodel-llama3-70b-64")
    assert dev_set.states_fake_gate(dense) and "moe_router" not in held.as_stated(dense, runs_dir, None)
    bad = dev_set.row_needs(cut | {"moe_router": "fake balanced"}, runs_dir)
    assert "moe_router" not in bad.fix and "not read: moe_router='fake balanced'" in bad.assumptions[0]


def test_explain_names_the_spread_it_priced():
    """``meshplan plan --explain`` says what the dispatch was priced from: the gate's ranks against a trained
    router's, for the layout's own EP size (Qwen3-30B-A3B, 8 experts a token over EP 8: 1 against 5.34)."""
    from meshplan.costmodel.api import Pricer
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.estimate.explain import explain_gpu
    from meshplan.planner.estimate.gpu import GpuEstimator

    model = load_model(str(data_path("model_configs", "qwen3-30b-a3b.json")))
    work = Workload(model, load_cluster("1x8xH100"), 512, 4096, "bf16")
    base = Layout(dp_shard=8, ep=8, zero_stage=3, micro_batch=4, moe_dispatcher="deepep", recompute="full")
    est = GpuEstimator(Pricer.shipped())
    said = explain_gpu(est, work, base.with_(moe_router="contiguous"))["priced_from"]["ep routing (contiguous)"]
    assert "8 experts on 1 of the 8 EP ranks" in said and "would sit on 5.34" in said
    assert "ep routing (contiguous)" not in explain_gpu(est, work, base)["priced_from"]
    from meshplan.planner.search.exact import describe

    assert "router=contiguous" in describe(base.with_(moe_router="contiguous")) and "router" not in describe(base)
