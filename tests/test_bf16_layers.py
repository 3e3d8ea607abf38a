"""Decoder layers kept in bf16 under a low-precision recipe (``bf16_first_layers`` / ``bf16_last_layers``:
Megatron-Core's ``first_last_layers_bf16``), checked against independent truths: a model whose every layer is kept
in bf16 is the bf16 model, layer for layer and byte for byte; the layout rules against megatron-core's own
``TransformerConfig`` checks; the exported flags read back into megatron-core's config; the other targets name it.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import ModelTables, Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.model.config import load_model
from tests.test_export_golden import ALL_PLANS
from tests.test_export_parsers import BASH, _argv, _megatron_args, _torchrun_parse

LAYERS = 32  # Llama 3.1 8B


def _work(dtype: str) -> Workload:
    return Workload(load_model("llama-3.1-8b-instruct"), load_cluster("1x8xB200"), 64, 8192, dtype)


def _layout(pp: int = 1, **kw) -> Layout:
    return Layout.of(Degrees(dp_shard=8 // pp, pp=pp), micro_batch=1, zero_stage=1, **kw)


@pytest.mark.parametrize("fp8, dtype", [("mxfp8", "fp8"), ("tensorwise", "fp8"), ("none", "nvfp4")])
def test_every_layer_in_bf16_is_the_bf16_model(fp8: str, dtype: str) -> None:
    """All decoder layers kept in bf16: the GEMMs, attention, saved inputs and weights of a bf16 run (the embedding
    and the output layer are bf16 under every recipe), so step time and memory are the bf16 plan's."""
    est = estimator_for(load_cluster("1x8xB200"))
    bf16 = est.estimate(_work("bf16"), _layout())
    kept = est.estimate(_work(dtype), _layout(fp8=fp8, bf16_first_layers=16, bf16_last_layers=16))
    assert kept.step_time_s == pytest.approx(bf16.step_time_s, rel=1e-9)
    assert kept.memory.activations_bytes == pytest.approx(bf16.memory.activations_bytes, rel=1e-9)
    assert kept.memory.weights_bytes == pytest.approx(bf16.memory.weights_bytes, rel=1e-9)


def test_each_kept_layer_costs_its_share() -> None:
    """Layer by layer: n layers kept in bf16 add n times what one adds (one layer kind, no pipeline), and the
    low-precision run with none is faster than with any."""
    est = estimator_for(load_cluster("1x8xB200"))
    work = _work("fp8")
    t = [est.estimate(work, _layout(fp8="mxfp8", bf16_last_layers=n)).step_time_s for n in (0, 1, 4)]
    assert t[0] < t[1] < t[2]
    assert t[2] - t[0] == pytest.approx(4 * (t[1] - t[0]), rel=1e-6)


@pytest.mark.parametrize("pp, vpp, recompute, pp_layout", [(1, 1, "none", ()), (2, 1, "full", ()),
                                                             (4, 2, "full:2", ()), (2, 4, "selective", ()),
                                                             (3, 1, "full:2", (12, 11, 9))])
def test_kept_layers_sit_on_their_stage(pp: int, vpp: int, recompute: str, pp_layout) -> None:
    """Which pipeline rank holds (and recomputes) the kept layers, against a brute force over the layer numbers of
    each rank's chunks (Megatron-Core numbers layers over the whole model; ``full:N`` recomputes the first N layers
    of each chunk)."""
    tb = ModelTables(load_model("llama-3.1-8b-instruct"))
    lay = Layout.of(Degrees(dp_shard=max(1, 8 // pp), pp=pp, vpp=vpp), micro_batch=1, zero_stage=1,
                    recompute=recompute, pp_layout=pp_layout, bf16_first_layers=3, bf16_last_layers=5)
    kept = set(range(3)) | set(range(LAYERS - 5, LAYERS))
    n = int(recompute.split(":")[1]) if ":" in recompute else LAYERS
    for st in range(pp):
        chunks = lay.stage_chunks(LAYERS, st)
        held = [i for r in chunks for i in r if i in kept]
        again = [i for r in chunks for i in r[:n] if i in kept] if recompute != "none" else []
        _, counts, rec = tb.bf16_counts(lay, st)
        assert (sum(counts.values()), sum(rec.values())) == (len(held), len(again)), st


def test_delayed_scaling_is_refused_as_megatron_refuses_it() -> None:
    est = estimator_for(load_cluster("1x8xB200"))
    with pytest.raises(MeshplanError, match="delayed scaling"):
        est.estimate(_work("fp8"), _layout(fp8="delayed", bf16_first_layers=1))


# meshplan's fp8 recipe -> megatron-core's precision fields (megatron export: --fp8-format hybrid / --fp4-format e2m1)
MEGATRON_PRECISION = {"tensorwise": {"fp8": "hybrid", "fp8_recipe": "tensorwise"},
                      "delayed": {"fp8": "hybrid", "fp8_recipe": "delayed"},
                      "nvfp4": {"fp4": "e2m1", "fp4_recipe": "nvfp4"}, "none": {}}


def _megatron_refuses(recipe: str, pp: int, **kw) -> bool:
    import torch
    from megatron.core.transformer import TransformerConfig

    try:
        TransformerConfig(num_layers=8, hidden_size=64, num_attention_heads=4, first_last_layers_bf16=True,
                          pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                          **MEGATRON_PRECISION[recipe], **kw)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "nvfp4", "none"])
@pytest.mark.parametrize("first, last, pp", [(1, 1, 1), (8, 0, 1), (4, 4, 2), (5, 0, 2), (0, 5, 2), (0, 3, 4)])
def test_layout_rules_are_megatron_cores(recipe: str, first: int, last: int, pp: int) -> None:
    """Refused exactly where megatron-core 0.16.1 refuses: under fp8 more than one stage's layers, or any under
    delayed scaling; under NVFP4 alone (``fp4``) or in bf16 it checks neither."""
    pytest.importorskip("megatron.core")
    lay = _layout(pp=pp, fp8=recipe, bf16_first_layers=first, bf16_last_layers=last)
    try:
        lay.validate(world_size=8, num_layers=8, num_heads=4, num_kv_heads=4, seq_len=1024, global_batch=64)
        refused = False
    except MeshplanError:
        refused = True
    want = _megatron_refuses(recipe, pp, num_layers_at_start_in_bf16=first, num_layers_at_end_in_bf16=last)
    assert refused == want


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_megatron_export_sets_the_layer_counts(tmp_path) -> None:
    """The rendered flags, as bash and torchrun's parser hand them to pretrain_gpt.py and read into megatron-core's
    config under their field names, keep the plan's layers in bf16; a plan under delayed scaling is refused."""
    pytest.importorskip("megatron.core")
    plan = ALL_PLANS["bf16-layers-mxfp8"]()
    ns = _torchrun_parse(_argv(render(plan, "megatron").text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    args = _megatron_args(ns.training_script_args)
    assert args["--first-last-layers-bf16"] is True
    assert (int(args["--num-layers-at-start-in-bf16"]), int(args["--num-layers-at-end-in-bf16"])) == (1, 2)
    with pytest.raises(MeshplanError, match="Delayed scaling"):
        render(plan.model_copy(update={"fp8": "delayed", "dtype": "fp8"}), "megatron")


def test_without_a_recipe_nothing_is_written() -> None:
    """bf16 training has nothing to keep out of a recipe: no flag, no warning."""
    plan = ALL_PLANS["bf16-layers-mxfp8"]().model_copy(update={"fp8": "none", "dtype": "bf16"})
    out = render(plan, "megatron")
    assert "--first-last-layers-bf16" not in out.text
    assert not any("bf16_first_layers" in w for w in out.warnings)


@pytest.mark.parametrize("target", ["torchrun", "accelerate", "torchtitan", "slurm", "kubeflow"])
def test_other_targets_name_it(target: str) -> None:
    """(DeepSpeed refuses every low-precision recipe before this: its config has no fp8 key.)"""
    plan = ALL_PLANS["bf16-layers-tensorwise"]()
    assert any("bf16_first_layers=1, bf16_last_layers=1" in w for w in render(plan, target).warnings)


def test_explain_prices_the_kept_layers_as_bf16() -> None:
    """``--explain`` adds up to the step with kept layers, and only the stage holding them changes: its bf16 GEMM
    time grows (beyond the output layer's, bf16 under every recipe) and its fp8 GEMM time falls."""
    from meshplan.planner.estimate.explain import explain_gpu

    est = estimator_for(load_cluster("1x8xB200"))
    work, lay = _work("fp8"), _layout(pp=2, fp8="mxfp8", bf16_last_layers=4)
    ex, base = explain_gpu(est, work, lay), explain_gpu(est, work, lay.with_(bf16_last_layers=0))
    assert ex["step_time_s"] == pytest.approx(est.estimate(work, lay).step_time_s)
    slow = ex["stages"][ex["slowest_stage"]]
    assert sum(slow["compute_s"].values()) == pytest.approx(ex["step_s"]["slowest stage compute"], rel=1e-6)
    assert ex["stages"][0]["compute_s"] == base["stages"][0]["compute_s"]
    got, was = ex["stages"][1]["compute_s"], base["stages"][1]["compute_s"]
    assert got["matmul bf16"] > was["matmul bf16"]
    assert sum(v for k, v in got.items() if k.startswith("matmul fp8")) < sum(
        v for k, v in was.items() if k.startswith("matmul fp8"))


def test_offloaded_kept_layers_leave_their_own_bytes() -> None:
    """Offloading the first 4 layers when those are the 4 kept in bf16: the GPU holds the same 28 recipe layers as
    offloading 4 recipe layers, byte for byte."""
    est = estimator_for(load_cluster("1x8xB200"))
    work = _work("fp8")
    plain = est.estimate(work, _layout(fp8="mxfp8", offload_layers=4))
    kept = est.estimate(work, _layout(fp8="mxfp8", offload_layers=4, bf16_first_layers=4))
    assert kept.memory.activations_bytes == pytest.approx(plain.memory.activations_bytes, rel=1e-9)


def test_a_bf16_run_pinned_to_tensorwise_takes_the_library_presets_layers() -> None:
    """``--dtype bf16 --fix fp8=tensorwise`` runs tensor-wise fp8 GEMMs (``lowp_recipe``): the bridge library
    profile's tensor-wise values hold for it as for ``--dtype fp8``."""
    from meshplan.planner.layout.stacks import load_stacks

    prof = load_stacks().get("megatron-bridge@26.02.01")
    for dtype in ("bf16", "fp8"):
        got = prof.defaults(dtype, False, "tensorwise")
        assert (got["bf16_first_layers"], got["bf16_last_layers"]) == ("1", "1"), dtype
    assert "bf16_first_layers" not in prof.defaults("fp8", False, "mxfp8")


def test_offloading_a_model_kept_in_bf16_waits_as_the_bf16_model() -> None:
    """Every layer kept in bf16 with the first 8 offloaded: the copies, their bytes and the compute they hide under
    are the bf16 model's, so the exposed wait is too."""
    est = estimator_for(load_cluster("1x8xB200"))
    bf16 = est.estimate(_work("bf16"), _layout(offload_layers=8))
    kept = est.estimate(_work("fp8"), _layout(fp8="mxfp8", offload_layers=8, bf16_first_layers=16,
                                              bf16_last_layers=16))
    assert bf16.exposed_comm_s > 0
    assert kept.exposed_comm_s == pytest.approx(bf16.exposed_comm_s, rel=1e-9)
    assert kept.step_time_s == pytest.approx(bf16.step_time_s, rel=1e-9)
