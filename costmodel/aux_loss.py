"""An MoE router's load-balancing loss as Megatron-Core computes it: a second scoring pass over the logits.

``TopKRouter.routing`` (megatron/core/transformer/moe/router.py, core_r0.14.0 to core_v0.19.0), in training with
any auxiliary-loss coefficient above 0 (``aux_loss``, ``seq_aux_loss`` or ``global_aux_loss``), scores the
``[tokens, experts]`` logits a second time apart from the routing (``moe_utils.compute_routing_scores_for_aux_loss``)
and reduces them (``switch_load_balancing_loss_func``). It does so whether or not ``moe_router_force_load_balancing``
replaced the logits, and a coefficient of 0 (``TransformerConfig``'s default) skips all of it. What runs:

* eager (``moe_router_fusion`` off): ``torch.softmax`` / ``torch.sigmoid`` and ``torch.topk`` over the fp32 logits,
  the pair ``costmodel.router_topk`` prices from its H100 / H200 measurements; the routing map
  ``torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()`` (a 4 B fill, a 4 -> 4 B cast, an out-of-place
  scatter copying the 4 B map, a 4 -> 1 B cast) and the two reductions over tokens, ``routing_map.sum(dim=0)`` (1 B)
  and ``probs.sum(dim=0)`` (4 B): ``costmodel.ops.AUX_EAGER_PASS_BYTES`` a score;
* fused (Transformer Engine 2.9 ``pytorch/router.py``): ``fused_score_for_moe_aux_loss_fwd`` reads the logits and
  writes the scores, the boolean map and the score function's output it saves for backward (13 B), the map's
  count stays eager (1 B) and ``fused_moe_aux_loss_fwd`` reads the scores (4 B): ``AUX_FUSED_PASS_BYTES``.

Backward: only the scores carry a gradient (the map is boolean). Eager: the sum's gradient is an expanded view, the
score function's backward reads the scores and writes the logits' gradient (8 B), and autograd adds it to the
routing pass's gradient of the same logits (read 2, write 1: 12 B). Fused: ``fused_moe_aux_loss_bwd`` writes the
scores' gradient (4 B), ``fused_score_for_moe_aux_loss_bwd`` reads it with the saved output and writes the logits'
(12 B), and the same accumulation: ``AUX_*_BWD_BYTES``. The eager counts are what megatron-core 0.16.1's own
functions dispatch, read back in ``tests/test_aux_loss.py``. These passes run at the memory-bound kernels' share of
HBM bandwidth (``ROOFLINE_EFFICIENCY["elementwise"]``), as the router top-k's backward does. Not priced: a sigmoid
router's normalisation (``scores / scores.sum(-1)``, 12 B a score more; the measured pair is sigmoid and top-k
alone), and the small all-reduce of the per-expert counts over the TP x CP group (over TP x DP x CP for
``global_aux_loss``), one per layer and micro-batch.
"""
from __future__ import annotations

from meshplan.costmodel import router_topk
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec
from meshplan.costmodel.roofline import ROOFLINE_EFFICIENCY


def time_s(op: OpSpec, device: DeviceSpec) -> float:
    """Seconds of the load-balancing loss over ``op.shape`` on ``device``: its memory passes at the memory-bound
    share of HBM bandwidth, plus, eager and forward, the measured score function and top-k."""
    t = op.bytes / (device.mem_bw_bytes_per_s * ROOFLINE_EFFICIENCY["elementwise"][1])
    if op.impl != "fused" and not op.backward:
        t += router_topk.time_s(OpSpec("topk", op.shape, "fp32"), device)
    return t


def source(op: OpSpec, device: DeviceSpec) -> str:
    """What the price rests on, for ``--explain``."""
    passes = "memory passes at HBM rate (Megatron-Core compute_routing_scores_for_aux_loss)"
    if op.impl == "fused":
        return f"load-balancing loss, Transformer Engine's fused kernels: {passes}"
    return f"load-balancing loss, eager: {router_topk.source(device)}, and {passes}"
