"""Virtual stages that hold only the embedding or only the loss: Megatron's account-for-embedding/loss split when
the decoder layers are fewer than the virtual stages (Megatron-Bridge's Llama 3.1 405B: 126 layers over PP16 x VP8 =
128 virtual stages, E | t x 126 | L). Checked against Megatron's even split of layers + 2 and a brute force, priced,
and read back by megatron-core's own ``PipelineParallelLayerLayout``."""
from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.layout.space import enumerate_layouts, parse_fix
from meshplan.planner.layout.splits import balanced_split, format_pp_layout, parse_pp_layout
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.schema import Stage
from tests.test_export_golden import ALL_PLANS
from tests.test_export_parsers import BASH, _argv, _megatron_args, _render_or_refusal, _torchrun_parse


@pytest.mark.parametrize("layers,stages", [(126, 128), (6, 8), (30, 32)])
def test_one_unit_per_virtual_stage_is_megatrons_even_split(layers: int, stages: int) -> None:
    """Megatron-LM's --account-for-embedding/loss-in-pipeline-split divides layers + 2 evenly: one unit each, so
    the first virtual stage is the embedding alone and the last the loss alone."""
    assert (layers + 2) % stages == 0 and (layers + 2) // stages == 1
    assert balanced_split(layers, stages) == (0,) + (1,) * layers + (0,)
    assert format_pp_layout(balanced_split(layers, stages)) == f"0+1*{layers}+0"


@pytest.mark.parametrize("layers,stages", [(3, 4), (4, 5), (5, 6), (6, 7), (2, 3)])
def test_fewer_layers_than_stages_against_brute_force(layers: int, stages: int) -> None:
    """Every split whose inner stages hold >= 1 layer and whose ends >= 0, first and last carrying one unit more:
    none has a lighter heaviest stage."""
    def heaviest(split):
        return max(n + (i == 0) + (i == stages - 1) for i, n in enumerate(split))

    ok = [c for c in itertools.product(range(layers + 1), repeat=stages)
          if sum(c) == layers and min(c[1:-1]) >= 1]
    got = balanced_split(layers, stages)
    assert sum(got) == layers and min(got[1:-1]) >= 1 and heaviest(got) == min(heaviest(c) for c in ok)


def test_empty_inner_stage_refused() -> None:
    with pytest.raises(MeshplanError, match="first and last may hold 0"):
        parse_pp_layout("1+0+1")
    four_layers = replace(load_model("llama-3.1-8b-instruct"), num_layers=4)
    with pytest.raises(MeshplanError, match="more than the 4 layers plus the embedding and the loss"):
        list(enumerate_layouts(four_layers, 8, 8, 64, 1024, parse_fix("pp=4,vpp=2")))


def test_embedding_only_stage_prices_what_it_holds() -> None:
    """E | t x 32 | L over PP2 x VP17: rank 0 holds the embedding and 16 layers, rank 1 16 layers and the loss, as
    the plain 16 + 16 split over PP2 does: each rank's weights are the same bytes, and the interleaved step runs."""
    from meshplan.planner.estimate.base import stage_memory

    work = Workload(load_model("llama-3.1-8b-instruct"), load_cluster("1x8xH100"), 64, 4096, "bf16")
    est = estimator_for(work.cluster)
    inter = Layout.of(Degrees(dp_shard=4, pp=2, vpp=17), micro_batch=1, zero_stage=1, recompute="none",
                      pp_layout=balanced_split(32, 34))
    plain = Layout.of(Degrees(dp_shard=4, pp=2), micro_batch=1, zero_stage=1, recompute="none")
    for lay in (inter, plain):
        lay.validate(world_size=8, num_layers=32, num_heads=32, num_kv_heads=8, seq_len=4096, global_batch=64)
    assert inter.pp_layout == (0,) + (1,) * 32 + (0,)
    tb = est.tables(work.model)
    m = inter.num_microbatches(64)
    for st in range(2):
        assert inter.stage_num_layers(32, st) == plain.stage_num_layers(32, st) == 16
        assert stage_memory(work, tb, inter, st, m).weights_bytes == stage_memory(work, tb, plain, st, m).weights_bytes
    assert est.estimate(work, inter).step_time_s > 0


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_megatron_core_reads_the_layout(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    from tests.test_export_megatron_core import _layers_per_stage, _transformer_config

    base = ALL_PLANS["llama70b"]()  # PP4 x VP2 = 8 virtual stages
    split = balanced_split(6, 8)
    firsts = [sum(split[:i]) for i in range(len(split))]
    plan = base.model_copy(update={"model": base.model.model_copy(update={"num_layers": 6}),
                                   "stages": tuple(Stage(first_layer=f, num_layers=n) for f, n in zip(firsts, split))})
    text = _render_or_refusal(plan, "megatron")
    ns = _torchrun_parse(_argv(text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    cfg, args = _transformer_config(_megatron_args(ns.training_script_args))  # validate_layer_layout runs here
    assert args["pipeline_model_parallel_layout"] == "E|t*1|t*1|t*1|t*1|t*1|t*1|L"
    assert _layers_per_stage(cfg) == list(split)
