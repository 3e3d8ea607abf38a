"""Optimizer-state and gradient precision (``optim_dtype``, ``grad_dtype``): bytes per parameter against the
frameworks' own accounting, the ``--fix`` keys, the plan file, and Megatron's own config classes reading the export.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from meshplan.core.errors import MeshplanError
from meshplan.planner.estimate.memory import model_state_bytes
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import parse_fix

P = 1_000_000_000  # parameters on the rank


def _states(d: int, zero: int, dtype: str = "bf16", **kw) -> float:
    w, g, o = model_state_bytes(P, 0, Layout(dp_shard=d, zero_stage=zero, **kw), dtype)
    return (w + g + o) / P


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_megatron_theoretical_memory_formula(d):
    """Megatron-LM's ``report_theoretical_memory`` (megatron/training/theoretical_memory_usage.py,
    ``compute_weight_and_optimizer_memory``): 18 B per parameter without the distributed optimizer, 6 + 12/dp with
    it; Megatron keeps bf16 runs' gradients in fp32 main-grad buffers (arguments.py): the Megatron stack's own
    gradient dtype, for bf16 and fp8 runs; ``grad_dtype=bf16`` is ``--grad-reduce-in-bf16`` (2 B less)."""
    for dtype in ("bf16", "fp8"):
        assert _states(d, 0, dtype) == pytest.approx(18)
        assert _states(d, 1, dtype) == pytest.approx(6 + 12 / d)
        assert _states(d, 1, dtype, grad_dtype="bf16") == pytest.approx(4 + 12 / d)
    # FSDP (zero 3) and the PyTorch stacks: the ZeRO paper's 2 + 2 + 12 B, sharded
    assert _states(d, 3, "bf16") == pytest.approx(16 / d)
    assert _states(d, 1, "bf16", stack="torchtitan") == pytest.approx(4 + 12 / d)


# The shard tensors apex's DistributedFusedAdam allocates per parameter (apex/contrib/optimizers/
# distributed_fused_adam.py, StateBucket.__init__: params_shard in the optimizer dtype when store_params,
# param_remainders_shard int16 when store_param_remainders, exp_avg_shard and exp_avg_sq_shard in the optimizer
# dtype), for the three set-ups NeMo r2.0.0rc1's megatron_base_model.setup_optimization chooses over bf16 weights.
APEX_STATES = {
    "fp32": (torch.float32, torch.float32, torch.float32),  # store_params, fp32 master (optim.dtype fp32, fp32 model)
    "remainder": (torch.int16, torch.float32, torch.float32),  # fp32 optimizer over bf16 weights: remainders
    "bf16": (torch.bfloat16, torch.bfloat16),  # optim.dtype bf16 == model dtype: store_params=False
}


@pytest.mark.parametrize("optim", sorted(APEX_STATES))
@pytest.mark.parametrize("grads", [torch.bfloat16, torch.float32])
def test_apex_state_bytes(optim, grads):
    """ZeRO-1 at dp=4: bf16 weights and the whole contiguous grad buffer (``_init_grad_buffer``, grad_sync_dtype)
    on every rank, the optimizer shards over the 4."""
    expect = 2 + grads.itemsize + sum(t.itemsize for t in APEX_STATES[optim]) / 4
    grad_dtype = "fp32" if grads == torch.float32 else "bf16"
    assert _states(4, 1, optim_dtype=optim, grad_dtype=grad_dtype) == pytest.approx(expect)


def test_fix_keys_and_errors():
    pins = parse_fix("optim_dtype=remainder,grad_dtype=fp32")
    assert (pins.optim_dtype, pins.grad_dtype) == ("remainder", "fp32")
    for bad in ("optim_dtype=fp16", "grad_dtype=fp8"):
        with pytest.raises(MeshplanError, match=bad.split("=")[0]):
            parse_fix(bad)
    with pytest.raises(MeshplanError, match="optim_dtype 'int8'"):
        Layout(optim_dtype="int8").validate(world_size=1, num_layers=2, num_heads=2, num_kv_heads=2, seq_len=128,
                                            global_batch=1)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One real ``plan_job`` per setting: Llama 3.1 8B config on 2x8 H100, the layout pinned but the dtypes."""
    from meshplan.planner.search.job import PlanRequest, plan_job
    from tests.helpers import data_path

    model = str(data_path("model_configs", "llama-3.1-8b-instruct.json"))
    out = {}
    for name, extra in (("default", ""), ("remainder", ",optim_dtype=remainder"), ("bf16", ",optim_dtype=bf16"),
                        ("fp32grads", ",grad_dtype=fp32"), ("bf16grads", ",grad_dtype=bf16")):
        path = tmp_path_factory.mktemp(name) / "plan.yaml"
        out[name] = plan_job(PlanRequest.of(model, "2x8xH100", 256, 4096,
                                            fix="tp=2,pp=1,dp=8,dp_shard=8,dp_replicate=1,cp=1,mbs=1,"
                             f"zero=1,recompute=selective,sp=true{extra}", top=1, name=name, out=path))
    return out


def test_plans_price_and_record_the_states(planned):
    """Memory falls by the bytes the states drop; bf16 gradients halve Megatron's fp32 main grads and their
    data-parallel traffic; the plan file holds a field only when it differs from the default (plans of older
    versions stay byte-identical)."""
    from meshplan.planner.plan.build import plan_layout
    from meshplan.planner.plan.schema import load_plan

    mem = {k: v.plan.prediction.memory_bytes for k, v in planned.items()}
    params = mem["default"]["weights_bytes"] / 2  # bf16 weights on the rank (no fp8 copies: bf16 run)
    assert mem["default"]["optimizer_bytes"] - mem["remainder"]["optimizer_bytes"] == pytest.approx(2 * params / 8,
                                                                                                  rel=1e-6)
    assert mem["default"]["optimizer_bytes"] - mem["bf16"]["optimizer_bytes"] == pytest.approx(8 * params / 8,
                                                                                             rel=1e-6)
    assert mem["fp32grads"]["grads_bytes"] == mem["default"]["grads_bytes"]  # Megatron's own: fp32 main grads
    assert mem["default"]["grads_bytes"] == pytest.approx(2 * mem["bf16grads"]["grads_bytes"], rel=1e-6)
    default, bf16g = planned["default"].plan, planned["bf16grads"].plan
    assert bf16g.prediction.breakdown.exposed_comm_s <= default.prediction.breakdown.exposed_comm_s
    assert "optim_dtype" not in default.to_yaml() and "grad_dtype" not in default.to_yaml()
    back = load_plan(planned["remainder"].path)
    assert back.optim_dtype == "remainder" and plan_layout(back).optim_dtype == "remainder"
    assert plan_layout(load_plan(planned["fp32grads"].path)).grad_dtype == "fp32"


def test_megatron_export_reads_back(planned):
    """megatron-core's own ``OptimizerConfig`` and ``DistributedDataParallelConfig`` take the exported flags (argparse
    dest = flag name with underscores; ``--accumulate-allreduce-grads-in-fp32`` is the DDP config's
    ``grad_reduce_in_fp32`` in Megatron-LM's training.py)."""
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from meshplan.planner.export import render

    text = render(planned["remainder"].plan, "megatron").text
    assert "--use-distributed-optimizer" in text and "--use-precision-aware-optimizer" in text
    # the config's __post_init__ asks Transformer Engine's version under the precision-aware optimizer (not
    # installable here), so its fields' defaults are read: 16-bit remainders of fp32 master weights
    fields = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}
    assert {"use_precision_aware_optimizer", "use_distributed_optimizer"} <= set(fields)
    assert fields["store_param_remainders"] is True and fields["main_params_dtype"] == torch.float32
    text = render(planned["fp32grads"].plan, "megatron").text
    assert "--accumulate-allreduce-grads-in-fp32" in text
    assert DistributedDataParallelConfig(grad_reduce_in_fp32=True).grad_reduce_in_fp32
    assert "--grad-reduce-in-bf16" in render(planned["bf16grads"].plan, "megatron").text
    assert "--grad-reduce-in-bf16" not in render(planned["default"].plan, "megatron").text
    out = render(planned["bf16"].plan, "megatron")
    assert any("optim_dtype=bf16" in w for w in out.warnings)  # Megatron has no bf16-master optimizer
    tt = render(planned["remainder"].plan, "torchtitan")
    assert any("optim_dtype=remainder" in w for w in tt.warnings)
