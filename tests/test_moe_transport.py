"""How many bytes the expert dispatch moves: DeepEP's one copy per destination rank (NVLink) and per destination
node (RDMA), and DeepSeek-V3's group-limited routing. The truth is a brute-force simulation of the router itself
(DeepSeek's ``MoEGate``: group score = sum of the group's top-2 expert scores, ``topk_group`` groups kept, top-k
experts among theirs), not the closed form under test."""
import itertools

import numpy as np
import pytest

from meshplan.planner.cluster.spec import distinct_nodes, load_cluster
from meshplan.planner.model.config import load_model
from meshplan.planner.model.routing import uniform_ranks


def _simulated_nodes(experts: int, nodes: int, topk: int, groups: int, per_token: int, tokens: int = 20000) -> float:
    """Mean distinct nodes (contiguous equal shares of the experts) a token's top-k experts sit on, routing random
    balanced scores through DeepSeek's gate (``per_token`` = 0: plain top-k)."""
    scores = np.random.default_rng(0).random((tokens, experts))
    if per_token:
        by_group = scores.reshape(tokens, groups, experts // groups)
        group_score = np.sort(by_group, axis=2)[:, :, -2:].sum(2)
        kept = np.argsort(-group_score, axis=1)[:, :per_token]
        mask = np.zeros((tokens, groups), bool)
        np.put_along_axis(mask, kept, True, 1)
        scores = np.where(np.repeat(mask, experts // groups, axis=1), scores, -1.0)
    chosen = np.argsort(-scores, axis=1)[:, :topk] // (experts // nodes)
    return float(np.mean([len(set(row)) for row in chosen]))


def test_deepseek_v3_reads_its_group_limited_routing():
    """HF config: n_group 8, topk_group 4; Kimi-K2's config keeps every group (n_group 1): no limit."""
    ds = load_model("deepseek-v3")
    assert (ds.routing_groups, ds.routing_groups_per_token) == (8, 4)
    kimi = load_model("kimi-k2")
    assert kimi.routing_groups_per_token == 0


@pytest.mark.parametrize("nodes,groups,per_token", [(8, 8, 4), (4, 8, 4), (8, 1, 0), (16, 1, 0)])
def test_distinct_nodes_matches_the_simulated_router(nodes, groups, per_token):
    """DeepSeek-V3 (256 experts, top-8) over 8 and 4 nodes, and plain top-8 routing over 8 and 16: the closed form
    within 3% of the simulated gate."""
    sim = _simulated_nodes(256, nodes, 8, groups, per_token)
    assert distinct_nodes(float(nodes), 8, groups, per_token) == pytest.approx(sim, rel=0.03)


def test_deepep_inside_a_node_sends_one_copy_per_destination_rank():
    """EP8 in one DGX H100, Qwen3-30B-A3B's routing (128 experts, top-8, 16 per rank): a token reaches about 5.2
    distinct ranks (the simulated router), so the NVLink bytes per routed copy, and the time, shrink by that over 8
    against one copy per expert: within 3% of the simulation."""
    c = load_cluster("1x8xH100")
    plain = c.alltoall_link(8, 1)
    deepep = c.alltoall_link(8, 1, dedup_topk=8)
    share = _simulated_nodes(128, 8, 8, 1, 0) / 8
    assert deepep.bandwidth_bytes_per_s == pytest.approx(plain.bandwidth_bytes_per_s / share, rel=0.03)


def test_group_limited_routing_cuts_the_rdma_bytes_at_ep64():
    """EP64 over 8 DGX H100 nodes under DeepEP: DeepSeek-V3's 4-of-8 groups reach 3.5 remote nodes per token
    (4 x 7/8) against 4.59 for plain top-8, and the NIC-bound link is faster by that ratio."""
    c = load_cluster("8x8xH100")
    plain = c.alltoall_link(64, 1, dedup_topk=8)
    limited = c.alltoall_link(64, 1, dedup_topk=8, routing_groups=(8, 4))
    uniform_remote = 7 * (1 - (7 / 8) ** 8)
    assert limited.bandwidth_bytes_per_s / plain.bandwidth_bytes_per_s == pytest.approx(uniform_remote / 3.5)


def test_distinct_ranks_are_counted_over_distinct_experts():
    """A router picks a token's experts distinct: for 16 experts over 4 ranks at top-3, the mean distinct ranks over
    every one of the C(16, 3) = 560 picks (brute force) is what ``uniform_ranks`` and ``distinct_nodes`` give with the
    expert count; the many-experts limit, which lets a pick repeat, counts fewer."""
    picks = list(itertools.combinations(range(16), 3))
    exact = sum(len({e // 4 for e in pick}) for pick in picks) / len(picks)
    assert uniform_ranks(4, 3, 16) == pytest.approx(exact, rel=1e-12)
    assert distinct_nodes(4.0, 3, experts=16) == pytest.approx(exact, rel=1e-12)
    assert uniform_ranks(4, 3) < exact
