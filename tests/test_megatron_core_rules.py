"""What Megatron-Core runs together: ``moe_overlap`` (``overlap_moe_expert_parallel_comm``) only beside some other
choices, and token dropping (padded to capacity, as meshplan prices it) not through DeepEP. A layout meshplan accepts
under the megatron stack is one Megatron-Core's own ``TransformerConfig`` (the installed megatron-core) accepts, and a
free search never recommends one it would refuse.

Truth: ``TransformerConfig.__post_init__`` itself, built on this host (no GPU needed) with each combination.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # megatron-core without Transformer Engine here

# (pp, vpp, recompute, mtp): each against Megatron-Core's verdict
CASES = [(1, 1, "none", 0), (1, 1, "selective", 0), (1, 1, "full", 0), (1, 1, "full:2", 0), (2, 1, "none", 0),
         (2, 2, "none", 0), (2, 2, "none", 1), (1, 1, "none", 1), (2, 2, "none", 2)]


def _megatron_accepts(pp: int, vpp: int, recompute: str, mtp: int) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
    kw = dict(num_layers=8, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
              expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall", bf16=True,
              overlap_moe_expert_parallel_comm=True, pipeline_model_parallel_size=pp,
              mtp_num_layers=mtp or None)
    if pp > 1:
        kw["pipeline_dtype"] = torch.bfloat16
    if vpp > 1:
        kw["virtual_pipeline_model_parallel_size"] = vpp
    if recompute == "selective":
        kw["recompute_granularity"] = "selective"
    elif recompute.startswith("full"):
        kw.update(recompute_granularity="full", recompute_method="block",
                  recompute_num_layers=int(recompute.split(":")[1]) if ":" in recompute else 1)
    try:
        TransformerConfig(**kw)
    except (AssertionError, ValueError):
        return False
    return True


def _meshplan_accepts(pp: int, vpp: int, recompute: str, mtp: int) -> bool:
    layout = Layout(dp_shard=2, pp=pp, vpp=vpp, ep=2, etp=1, zero_stage=1, recompute=recompute, mtp=mtp,
                    moe_overlap=True, stack="megatron")
    try:
        layout.validate(world_size=2 * pp, num_layers=8, num_heads=4, num_kv_heads=4, seq_len=64, global_batch=8,
                        num_experts=8)
    except MeshplanError as err:
        assert "moe_overlap under Megatron-Core" in str(err)
        return False
    return True


@pytest.mark.parametrize("pp,vpp,recompute,mtp", CASES)
def test_meshplan_refuses_what_megatron_core_refuses(pp, vpp, recompute, mtp):
    assert _meshplan_accepts(pp, vpp, recompute, mtp) == _megatron_accepts(pp, vpp, recompute, mtp)


def test_the_cases_cover_both_verdicts():
    verdicts = [_megatron_accepts(*c) for c in CASES]
    assert any(verdicts) and not all(verdicts)


def test_other_stacks_are_not_held_to_megatron_cores_rules():
    layout = Layout(dp_shard=2, ep=2, etp=1, zero_stage=1, recompute="full", moe_overlap=True, stack="torchtitan")
    layout.validate(world_size=2, num_layers=8, num_heads=4, num_kv_heads=4, seq_len=64, global_batch=8,
                    num_experts=8)


def test_the_free_search_on_eight_nvl72_racks_recommends_only_what_megatron_core_runs():
    """DeepSeek-V3 on 144x4xGB200-NVL72 (issue 26's case): before this rule its best plans overlapped the expert
    all-to-all under full recomputation, which Megatron-Core refuses."""
    work = Workload(load_model("deepseek-v3"), load_cluster("144x4xGB200-NVL72"), 4608, 4096)
    ranked = search(work, {}, top=10).ranked
    assert ranked
    for layout, _ in ranked:
        if layout.moe_overlap:
            assert _megatron_accepts(layout.pp, layout.vpp, layout.recompute, layout.mtp), layout


def test_the_space_keeps_a_free_overlap_to_what_megatron_core_runs_and_a_pinned_one_is_told_why():
    from meshplan.planner.layout.space import enumerate_layouts, parse_fix

    model = load_model("mixtral-8x7b")
    free = [lay for lay in enumerate_layouts(model, 16, 8, 64, 4096, parse_fix("tp=1,cp=1"))]
    assert any(lay.moe_overlap for lay in free) and any(lay.recompute_kind == "full" for lay in free)
    assert not [lay for lay in free if lay.moe_overlap and lay.recompute_kind == "full"]
    assert not [lay for lay in free if lay.moe_overlap and lay.pp > 1 and lay.vpp == 1]
    work = Workload(model, load_cluster("2x8xH100"), 64, 4096)
    with pytest.raises(MeshplanError, match="moe_overlap under Megatron-Core .* no full recomputation"):
        search(work, parse_fix("moe_overlap=true,recompute=full,ep=8"), top=1)


def _megatron_takes_dropping_through(dispatcher: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
    kw = dict(num_layers=4, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
              expert_model_parallel_size=2, bf16=True, moe_expert_capacity_factor=1.25,
              moe_pad_expert_input_to_capacity=True)
    kw.update(moe_token_dispatcher_type="alltoall") if dispatcher == "alltoall" else kw.update(
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=dispatcher)
    try:
        TransformerConfig(**kw)
    except (AssertionError, ValueError):
        return False
    return True


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "hybridep"])
def test_token_dropping_goes_through_the_dispatchers_megatron_core_pads(dispatcher):
    layout = Layout(dp_shard=2, ep=2, etp=1, zero_stage=1, moe_capacity=1.25, moe_dispatcher=dispatcher)
    try:
        layout.validate(world_size=2, num_layers=8, num_heads=4, num_kv_heads=4, seq_len=64, global_batch=8,
                        num_experts=8)
        accepted = True
    except MeshplanError as err:
        assert "moe_pad_expert_input_to_capacity" in str(err)
        accepted = False
    assert accepted == _megatron_takes_dropping_through(dispatcher)


@pytest.mark.parametrize("cluster,expected", [("2x8xH100", "alltoall"), ("2x4xGB200-NVL72", "hybridep")])
def test_a_free_dispatcher_with_token_dropping_is_one_megatron_core_runs(cluster, expected):
    """Mixtral with a pinned capacity: on Hopper the free dispatcher would be DeepEP, which Megatron-Core refuses to
    pad; the search takes the all-to-all there, and Hybrid-EP (which pads) on Blackwell. The megatron export of the
    plan is one Megatron-Core's arguments accept."""
    from meshplan.planner.layout.space import parse_fix

    work = Workload(load_model("mixtral-8x7b"), load_cluster(cluster), 64, 4096)
    ranked = search(work, parse_fix("moe_capacity=1.25"), top=3).ranked
    assert ranked and {lay.moe_dispatcher for lay, _ in ranked if lay.ep > 1} == {expected}
    assert _megatron_takes_dropping_through(expected)


def test_the_megatron_export_refuses_deepep_with_token_dropping_by_name():
    """A plan file edited by hand (meshplan's own search would not write it)."""
    from meshplan.planner.export import render
    from tests.test_export_checks import with_
    from tests.test_export_golden import plan_dsv3

    dropping = with_(plan_dsv3(), moe_capacity=1.25)
    assert render(with_(dropping, moe_dispatcher="alltoall"), "megatron").text
    with pytest.raises(MeshplanError, match="megatron: moe_dispatcher=deepep with moe_capacity=1.25"):
        render(with_(dropping, moe_dispatcher="deepep"), "megatron")


def _holds_whole_experts(layout: Layout) -> bool:
    """Whether ``layout`` (Qwen3-30B-A3B's shapes over its world) passes validation; a refusal names the rule."""
    try:
        layout.validate(world_size=layout.world_size, num_layers=48, num_heads=32, num_kv_heads=4, seq_len=4096,
                        global_batch=8 * layout.dp, num_experts=128)
    except MeshplanError as err:
        assert "each replica holds whole experts" in str(err)
        return False
    return True


@pytest.mark.parametrize("replicate,shard,ok", [(8, 16, True), (16, 8, False), (1, 128, True), (128, 1, True)])
def test_each_replica_holds_whole_experts(replicate, shard, ok):
    """Qwen3-30B-A3B at ep 16 over 128 ranks under Megatron-Core: with hybrid sharding, the experts of a replica must
    fold over its own shard group (megatron-core parallel_state: expert_data_parallel_size %
    num_distributed_optimizer_instances == 0, here 128 / 16 = 8 against the replicas; the free search once ranked 16
    replicas of 8 second). Plain replication (no distributed optimizer instances) folds them over every rank."""
    layout = Layout(dp_replicate=replicate, dp_shard=shard, ep=16, zero_stage=3 if shard > 1 else 0)
    assert _holds_whole_experts(layout) == ok
    instances = replicate if replicate > 1 and shard > 1 else 1  # what the megatron export sets
    assert ok == ((128 // 16) % instances == 0)  # the megatron-core rule, computed


def test_torchtitan_lends_ep_only_its_shard_and_context_ranks():
    """torchtitan (the installed 0.2.x) builds its expert mesh as (pp, dp_replicate, efsdp, ep, etp) with efsdp =
    dp_shard x cp x tp // (etp x ep) (``ParallelDims.build_mesh``, read from its source): EP beyond dp_shard x cp
    (x tp) leaves that mesh short of the world. meshplan refuses such a layout under torchtitan's code and keeps it
    under Megatron-Core's, which folds the experts over every data-parallel rank."""
    import inspect

    from tests.test_export_parsers import _torchtitan

    _, ParallelDims = _torchtitan()
    src = inspect.getsource(ParallelDims.build_mesh)
    assert "fsdp = self.dp_shard * self.cp" in src and "efsdp = fsdp * self.tp // (self.etp * self.ep)" in src
    replicate, shard, ep = 8, 1, 8
    efsdp = shard * 1 * 1 // (1 * ep)
    assert 1 * replicate * efsdp * ep * 1 != replicate * shard  # torchtitan's sparse mesh misses the world
    for stack, ok in (("torchtitan", False), ("megatron", True)):
        assert _holds_whole_experts(Layout(dp_replicate=replicate, dp_shard=shard, ep=ep, stack=stack)) == ok, stack


@pytest.mark.parametrize("stack", ["torchtitan", "eager"])
def test_a_free_search_leaves_the_overlap_off_where_the_code_has_none(stack):
    """torchtitan and HF code have no overlapped expert all-to-all (their exports warn that it runs on the critical
    path): a free search under them does not price one; pinned, it is the user's to ask for."""
    from meshplan.planner.layout.space import enumerate_layouts, parse_fix

    model = load_model("mixtral-8x7b")
    pins = f"stack={stack},tp=1,cp=1,pp=1"
    free = list(enumerate_layouts(model, 16, 8, 64, 4096, parse_fix(pins)))
    assert any(lay.ep > 1 for lay in free) and not any(lay.moe_overlap for lay in free)
    pinned = list(enumerate_layouts(model, 16, 8, 64, 4096, parse_fix(pins + ",moe_overlap=true")))
    assert pinned and all(lay.moe_overlap for lay in pinned)


def test_ep_over_plain_replicas_exports_to_megatron_and_is_refused_by_torchtitan():
    """DeepSeek-V3 with plain replication (dp_shard 1) at ep 64: Megatron-Core folds the experts over every
    data-parallel rank, and meshplan accepts the layout under its code, so the megatron export renders it;
    torchtitan's expert mesh borrows only the sharded ranks, and its export refuses it by name."""
    from meshplan.planner.export import render
    from tests.test_export_checks import with_
    from tests.test_export_golden import plan_dsv3

    plan = with_(plan_dsv3(), zero_stage=0, degrees={"dp_shard": 1, "dp_replicate": 128})
    assert "--expert-model-parallel-size 64" in " ".join(render(plan, "megatron").text.split())
    with pytest.raises(MeshplanError, match="torchtitan: ep\\*etp = 64\\*2 must divide tp\\*cp\\*dp_shard = 2\\*1\\*1"):
        render(plan, "torchtitan")
