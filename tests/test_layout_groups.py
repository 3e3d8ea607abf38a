"""Rank groups and strides come from ``Layout`` alone, in Megatron-LM's rank order (tp fastest, then cp, dp, pp)."""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.layout import Degrees, Layout


def test_megatron_parallel_state_example():
    """The example of Megatron-LM's ``initialize_model_parallel`` docstring (megatron/core/parallel_state.py):
    16 GPUs, tensor parallel 2, pipeline parallel 4 -> 8 TP groups, 8 DP groups, 4 PP groups, listed there as below."""
    lay = Layout(dp_replicate=2, tp=2, pp=4)
    assert lay.world_size == 16
    assert lay.rank_groups(lay.tp_group) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]
    assert lay.rank_groups(lay.dp_group) == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert lay.rank_groups(lay.pp_group) == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


def test_groups_partition_the_world_and_agree_with_strides():
    """Every group of every kind partitions the ranks; members are ``stride`` apart; sizes are the degrees."""
    lay = Layout(dp_replicate=2, dp_shard=2, tp=2, cp=2, pp=2, ep=2, zero_stage=1)
    for group, size in ((lay.tp_group, 2), (lay.cp_group, 2), (lay.ep_group, 2), (lay.dp_group, 4),
                        (lay.grad_group, 8), (lay.shard_group, 4), (lay.replicate_group, 2), (lay.pp_group, 2)):
        groups = lay.rank_groups(group)
        assert sorted(r for g in groups for r in g) == list(range(lay.world_size)), group
        assert all(len(g) == size for g in groups), (group, groups)
        assert all(b - a == group.stride for g in groups for a, b in zip(g, g[1:])), group
    # torchtitan: FSDP shards over dp_shard x cp, the ranks right after tp; HSDP replicas stride over them
    assert lay.rank_groups(lay.shard_group)[0] == (0, 2, 4, 6)
    assert lay.rank_groups(lay.replicate_group)[0] == (0, 8)
    assert lay.pp_neighbours == (2, 16)


def test_degrees_is_the_plans_and_the_layouts():
    lay = Layout(dp_shard=4, tp=2, micro_batch=2, zero_stage=3)
    assert lay.degrees == Degrees(dp_shard=4, tp=2) and type(lay.degrees) is Degrees
    assert Layout.of(lay.degrees, micro_batch=2, zero_stage=3) == lay
    with pytest.raises(MeshplanError, match=r"dp_replicate\(1\) \* dp_shard\(4\) \* cp\(1\) \* tp\(2\) \* pp\(1\) = 8"):
        lay.validate(world_size=16, num_layers=4, num_heads=4, num_kv_heads=4, seq_len=128, global_batch=16)
