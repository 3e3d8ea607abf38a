"""The MLP activation the op list prices is the kernel the stack runs, asked the way it was measured.

Truth: Vidur's H100 profile of Llama-2-7B (``data/kernels/vidur``), whose ``mlp_act`` column times the fused
SwiGLU kernel, SiLU(gate) * up, over [tokens, ffn] outputs. A fused gated MLP must put exactly that one kernel in
the op list (it was once priced as a binary elementwise op over twice the outputs: 6n bytes moved for a kernel that
moves 3n), so its learned price lands on the measurement; eager code runs SiLU and the multiply as two kernels."""
from __future__ import annotations

import csv

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import get_device
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model
from tests.helpers import data_path, open_data

TOKENS = 4096


def _measured_mlp_act_s() -> float:
    """Vidur's median ``mlp_act`` time of Llama-2-7B on H100 at 4096 tokens, TP 1 (ms in the file)."""
    parts = ("kernels", "vidur", "compute", "h100", "Llama-2-7b-hf", "mlp.csv")
    with open_data(*parts) as fh:
        for row in csv.DictReader(fh):
            if int(float(row["num_tokens"])) == TOKENS and int(float(row["num_tensor_parallel_workers"])) == 1:
                return float(row["time_stats.mlp_act.median"]) * 1e-3
    pytest.fail(f"{'/'.join(parts)}: no row at {TOKENS} tokens, TP 1")


def _mlp_activation_ops(stack: str, config: str = "llama2-7b.json"):
    model = load_model(str(data_path("published_runs", "configs", config)))
    ops = layer_ops(model, 0, Layout(micro_batch=1, stack=stack), TOKENS).compute
    n = TOKENS * model.ffn_hidden_size
    return n, [o for o in ops if o.kind in ("activation", "swiglu", "elementwise") and o.shape[0] == n]


def test_fused_swiglu_is_one_kernel_priced_as_measured():
    n, acts = _mlp_activation_ops("megatron")
    assert [o.kind for o in acts] == ["swiglu"], acts
    assert acts[0].bytes == 3 * 2 * n  # reads gate and up, writes their product (bf16)
    priced = Pricer.shipped().predict(acts[0], get_device("H100"))
    measured = _measured_mlp_act_s()
    assert priced == pytest.approx(measured, rel=0.10), (priced, measured)


def test_eager_swiglu_is_silu_then_multiply():
    n, acts = _mlp_activation_ops("eager")
    assert sorted(o.kind for o in acts) == ["activation", "elementwise"], acts


def test_plain_gelu_is_one_unary_kernel():
    n, acts = _mlp_activation_ops("megatron", "gpt3-5b-nemo.json")
    assert [o.kind for o in acts] == ["activation"], acts
    assert acts[0].bytes == 2 * 2 * n  # reads n, writes n


def test_routed_experts_run_the_fused_swiglu():
    from meshplan.planner.estimate.ops_graph import expert_ops

    model = load_model(str(data_path("model_configs", "deepseek-v3.json")))
    ops = expert_ops(model, Layout(dp_shard=64, ep=64, etp=1, micro_batch=1), TOKENS * model.experts_per_token,
                     "bf16")
    kinds = {o.kind for o in ops}
    assert "swiglu" in kinds and "elementwise" not in kinds and "activation" not in kinds, kinds
