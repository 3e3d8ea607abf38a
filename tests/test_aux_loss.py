"""The MoE router's load-balancing loss (``moe_aux_loss``, ``costmodel.aux_loss``): its eager passes read back from
megatron-core's own functions, and where the estimator lists it."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from meshplan.costmodel import aux_loss, router_topk
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.ops import AUX_EAGER_BWD_BYTES, AUX_EAGER_PASS_BYTES, OpSpec
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model

T, E, K = 2048, 256, 4  # index bytes (T x K x 8) stay within 1% of the T x E passes
MEASURED = ("_softmax", "topk")  # the score function and top-k, priced from their measurement (costmodel.router_topk)
FACTORIES = ("zeros_like", "ones_like", "new_zeros", "empty_like", "full_like")  # write their output, read nothing


class _Bytes(TorchDispatchMode):
    """Bytes each dispatched aten op moves: every tensor it reads and writes once, a view (an output sharing an
    input's storage) nothing, a factory its output only; ``skip`` names ops left out."""

    def __init__(self, skip: tuple[str, ...] = ()):
        super().__init__()
        self.skip, self.total, self.names = skip, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        ins = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        ptrs = {t.untyped_storage().data_ptr() for t in ins}
        if name in self.skip or any(o.untyped_storage().data_ptr() in ptrs for o in outs):
            return out
        self.names.append(name)

        def size(t):  # an expanded view holds less than its shape says
            return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
        self.total += sum(size(t) for t in outs) + (0 if name in FACTORIES else sum(size(t) for t in ins))
        return out


def _megatron_step(aux: bool, fwd_skip: tuple[str, ...] = ()) -> tuple[_Bytes, _Bytes]:
    """megatron-core's unfused router (``topk_routing_with_score_function``) and, with ``aux``, its load-balancing
    loss (``compute_routing_scores_for_aux_loss``, the per-expert count, ``switch_load_balancing_loss_func``), as
    ``TopKRouter.routing`` runs them; forward bytes counted for the loss alone, backward for the whole step."""
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    torch.manual_seed(0)
    logits = torch.randn(T, E, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probs, _ = moe_utils.topk_routing_with_score_function(logits, K, use_pre_softmax=False,
                                                              score_function="softmax", fused=False)
    loss = probs.sum()
    fwd = _Bytes(fwd_skip)
    if aux:
        with fwd:
            routing_map, scores = moe_utils.compute_routing_scores_for_aux_loss(logits, K, "softmax", fused=False)
            loss = loss + moe_utils.switch_load_balancing_loss_func(scores, routing_map.sum(dim=0), T, K, E, 1e-3,
                                                                    fused=False)
    bwd = _Bytes()
    with bwd:
        loss.backward()
    return fwd, bwd


def test_eager_passes_are_what_megatron_core_dispatches():
    """Beside the measured score function and top-k, the loss's forward moves ``AUX_EAGER_PASS_BYTES`` a score
    (the map's fill, cast, scatter and cast, two reductions), and it adds ``AUX_EAGER_BWD_BYTES`` a score to the
    backward (softmax backward, the gradient's accumulation): counted off megatron-core 0.16.1's own code."""
    fwd, bwd_with = _megatron_step(True, fwd_skip=MEASURED)
    _, bwd_without = _megatron_step(False)
    assert fwd.total / (T * E) == pytest.approx(AUX_EAGER_PASS_BYTES, rel=0.02), fwd.names
    assert (bwd_with.total - bwd_without.total) / (T * E) == pytest.approx(AUX_EAGER_BWD_BYTES, rel=0.02)


def test_eager_loss_costs_at_least_the_measured_pair_it_reruns():
    """The eager loss re-runs the router's score function and top-k, so on the parts that timed that pair (H100,
    H200: ``costmodel/data/measured``) its forward costs at least each measured median (less the pair's fit
    tolerance, 12%) and more by its own passes; fused, it runs memory passes alone, under half the eager price; the
    backward has no top-k to re-run."""
    for r in router_topk.records():
        dev, shape = catalogue()[r["part"]], (r["tokens"], r["experts"], r["topk"])
        eager, fused = (OpSpec("auxloss", shape, "fp32", impl=i) for i in ("eager", "fused"))
        assert aux_loss.time_s(eager, dev) > 0.88 * r["seconds"], r
        assert aux_loss.time_s(eager, dev) > router_topk.time_s(OpSpec("topk", shape, "fp32"), dev)
        assert aux_loss.time_s(fused, dev) < 0.5 * aux_loss.time_s(eager, dev), r
        back = OpSpec("auxloss", shape, "fp32", backward=True, impl="eager")
        assert aux_loss.time_s(back, dev) < aux_loss.time_s(eager, dev), r


@pytest.mark.parametrize("aux,fusion,router,expect", [
    ("none", False, "learned", None), ("seq_aux_loss", False, "learned", "eager"),
    ("aux_loss", True, "learned", "fused"), ("aux_loss", False, "contiguous", None)])
def test_an_moe_layer_lists_the_loss_once(aux, fusion, router, expect):
    """One ``auxloss`` op per MoE layer where a loss is computed, over the layer's tokens and all experts; none
    without one or under a contiguous router (it scores nothing)."""
    model = load_model("qwen3-30b-a3b")
    moe = next(i for i in range(model.num_layers) if "E" in model.layer_kind(i))
    layout = Layout(ep=8, micro_batch=2, moe_aux_loss=aux, moe_router_fusion=fusion, moe_router=router)
    ops = [op for op in layer_ops(model, moe, layout, 4096).compute if op.kind == "auxloss"]
    if expect is None:
        assert ops == []
    else:
        assert [(op.shape, op.impl) for op in ops] == [((2 * 4096, 128, 8), expect)]


def test_each_release_trains_each_models_loss_as_its_bridge_sets_it():
    """Megatron-Bridge's model bridges, providers and recipes (read at each release's tag): Qwen3-MoE aux_loss
    (1e-3) throughout; DeepSeek-V3 seq_aux_loss from v0.2.0 (r0.1.0's provider leaves the coefficient at 0: none);
    Kimi-K2 and Nemotron 3 Nano seq_aux_loss from v0.3.1, Nemotron 3 Super from v0.4.0, where their recipes begin;
    GPT-OSS never (its bridge sets the type "none"). Megatron-LM alone computes none (TransformerConfig's 0.0)."""
    from meshplan.planner.layout.stacks import load_stacks
    from meshplan.planner.search.workloads import model_values

    cat = load_stacks()
    models = {m: load_model(m) for m in ("qwen3-235b-a22b", "deepseek-v3", "kimi-k2", "nemotron-3-nano-30b-a3b",
                                         "nemotron-3-super-120b-a12b", "gpt-oss-120b")}
    since = {"qwen3-235b-a22b": "25.09", "deepseek-v3": "25.11", "kimi-k2": "26.02.01",
             "nemotron-3-nano-30b-a3b": "26.02.01", "nemotron-3-super-120b-a12b": "26.04", "gpt-oss-120b": None}
    releases = ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01")
    for version in releases:
        for base in ("megatron-bridge", "megatron-bridge-perf"):
            prof = cat.get(f"{base}@{version}")
            for name, spec in models.items():
                first = since[name]
                want = None if first is None or releases.index(version) < releases.index(first) else (
                    "aux_loss" if name.startswith("qwen3") else "seq_aux_loss")
                assert model_values(prof, spec, "bf16").get("moe_aux_loss") == want, (base, version, name)
    for ref in ("megatron-lm@core_r0.16.0", "megatron-lm@core_v0.19.0"):
        assert model_values(cat.get(ref), models["qwen3-235b-a22b"], "bf16").get("moe_aux_loss") is None
