"""``fp8_params``: the decoder's linear weights held only in their low-precision copies (Megatron-Core
``fp8_param_gather``, which Megatron-Bridge's fp8 configs set).

Truths: Megatron-Core's ``DistributedDataParallelConfig.fp8_param_gather`` ("keep the compute param in fp8 (do not
use any other intermediate dtype)"): what leaves memory is the 16-bit copy of exactly the decoder weights fp8 casts,
whose count is the published parameter count less the embedding, output layer and final norm; Megatron-LM's own
argument list (data/notes/exports.md: ``--fp8-param-gather`` "needs the distributed optimizer or an FSDP").
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.space import enumerate_layouts, parse_fix
from meshplan.planner.model.config import load_model
from tests.test_export_checks import with_
from tests.test_export_golden import plan_llama70b

# Llama 3.1 8B (HF model card: 8.03B parameters); vocab 128256 x hidden 4096, untied output layer, final RMSNorm
LLAMA_8B_PARAMS = 8_030_261_248
EMBED = OUTPUT = 128256 * 4096
FINAL_NORM = 4096


def _memory(fix: str, cluster: str = "1x4xGB200-NVL72", dtype: str = "fp8"):
    model = load_model("llama-3.1-8b")
    work = Workload(model, load_cluster(cluster), 8, 4096, dtype)
    (layout,) = enumerate_layouts(model, work.cluster.world_size, work.cluster.devices_per_node, 8, 4096,
                                  parse_fix(fix))
    return estimator_for(work.cluster).estimate(work, layout).memory


@pytest.mark.parametrize("recipe", ["mxfp8", "tensorwise"])
def test_the_16bit_decoder_weights_leave_memory(recipe):
    base = f"dp=4,dp_shard=4,tp=1,pp=1,mbs=1,zero=1,recompute=none,fp8={recipe}"
    kept, dropped = _memory(base), _memory(base + ",fp8_params=true")
    decoder = LLAMA_8B_PARAMS - EMBED - OUTPUT - FINAL_NORM
    assert kept.weights_bytes - dropped.weights_bytes == pytest.approx(2 * decoder, rel=1e-6)
    assert (kept.grads_bytes, kept.optimizer_bytes, kept.activations_bytes) == (
        dropped.grads_bytes, dropped.optimizer_bytes, dropped.activations_bytes)


def test_no_effect_without_a_low_precision_recipe():
    base = "dp=4,dp_shard=4,tp=1,pp=1,mbs=1,zero=1,recompute=none"
    assert _memory(base, dtype="bf16") == _memory(base + ",fp8_params=true", dtype="bf16")


def test_megatron_spells_it_and_refuses_it_without_the_distributed_optimizer():
    plan = with_(plan_llama70b(), fp8="mxfp8", fp8_params=True)
    assert "--fp8-param-gather" in render(plan, "megatron").text.split()
    assert "--fp8-param-gather" not in render(with_(plan, fp8_params=False), "megatron").text.split()
    with pytest.raises(MeshplanError, match="fp8_params .--fp8-param-gather. needs the distributed optimizer"):
        render(with_(plan, zero_stage=0, degrees={"dp_shard": 1, "dp_replicate": 4}), "megatron")


def test_targets_without_it_say_so():
    plan = with_(plan_llama70b(), fp8="tensorwise", fp8_params=True)
    assert any("fp8_params" in w for w in render(plan, "torchtitan").warnings)
