"""MoE parallel folding (issue 12 item 3): the expert mesh etp x ep x expert-dp laid over a stage's tp x cp x dp
ranks independently of the dense mesh, checked against Megatron-Core's expert rank order (RankGenerator with
order "tp-ep-dp-pp" over expert_tensor_parallel_size, expert_model_parallel_size: etp fastest, then ep, then
expert-dp), and the folded layouts the dev set needs."""
from __future__ import annotations

import itertools

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.layout import Layout


def _megatron_expert_groups(world: int, etp: int, ep: int, pp: int) -> list[tuple[int, ...]]:
    """EP groups as Megatron-Core forms them: rank = etp_i + etp * (ep_i + ep * (edp_i + edp * pp_i))."""
    edp = world // (etp * ep * pp)
    groups = []
    for pp_i, edp_i, etp_i in itertools.product(range(pp), range(edp), range(etp)):
        groups.append(tuple(etp_i + etp * (ep_i + ep * (edp_i + edp * pp_i)) for ep_i in range(ep)))
    return sorted(groups)


@pytest.mark.parametrize("tp,cp,dp,pp,ep,etp", [(2, 1, 16, 2, 32, 1), (2, 2, 8, 1, 8, 2), (4, 1, 8, 2, 16, 2),
                                                (1, 2, 4, 2, 8, 1), (8, 1, 4, 1, 4, 0)])
def test_ep_groups_follow_megatrons_expert_rank_order(tp, cp, dp, pp, ep, etp):
    lay = Layout(tp=tp, cp=cp, dp_shard=dp, pp=pp, ep=ep, etp=etp, zero_stage=1)
    lay.validate(world_size=tp * cp * dp * pp, num_layers=8, num_heads=32, num_kv_heads=8, seq_len=4096,
                 global_batch=dp * 4, num_experts=64)
    assert sorted(lay.rank_groups(lay.ep_group)) == _megatron_expert_groups(lay.world_size, lay.expert_tp, ep, pp)
    assert lay.expert_dp * ep * lay.expert_tp == tp * cp * dp


def test_folding_admits_ep_beyond_data_parallel_and_refuses_what_does_not_fold():
    """Qwen3-235B's EP32 over 16 data-parallel ranks x TP2 (etp=1) folds; ep x etp that does not divide the stage's
    ranks is one line naming the numbers."""
    ok = Layout(tp=2, dp_shard=16, ep=32, etp=1, zero_stage=1)
    ok.validate(world_size=32, num_layers=94, num_heads=64, num_kv_heads=4, seq_len=4096, global_batch=64,
                num_experts=128)
    bad = Layout(tp=2, dp_shard=16, ep=32, etp=2, zero_stage=1)
    with pytest.raises(MeshplanError, match=r"ep\(32\) \* etp\(2\) = 64 must divide tp\*cp\*dp = 2\*1\*16 = 32"):
        bad.validate(world_size=32, num_layers=94, num_heads=64, num_kv_heads=4, seq_len=4096, global_batch=64,
                     num_experts=128)


def test_expert_states_shard_over_expert_data_parallel():
    """ZeRO shards expert states over the expert-dp part of dp_shard x cp x tp: EP8 x ETP1 over TP2 x DP8 leaves
    expert-dp 2, so Adam's 12 B per expert parameter are halved, dense ones split 8 ways."""
    from meshplan.planner.estimate.memory import model_state_bytes

    lay = Layout(tp=2, dp_shard=8, ep=8, etp=1, zero_stage=1)
    assert lay.expert_shard_group.size == 2 and lay.shard_group.size == 8
    w, g, o = model_state_bytes(1e9, 1e9, lay)
    assert o == pytest.approx(12e9 / 8 + 12e9 / 2)
