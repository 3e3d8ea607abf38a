"""Calculon (github.com/calculon-ai/calculon) on a dev-set row: row -> application/execution JSON -> step time.

Calculon's ``llm`` command takes an application (model), an execution (parallel strategy) and a system file
(calculon/llm/llm.py ``Llm.Application``, ``Llm.Execution.fields()``; README "LLM Example"). ``application`` and
``execution`` build the first two from a ``peer_rows.Row`` with the standard library only; ``predict`` imports
Calculon from a checkout and runs ``Llm.compile`` / ``Llm.run`` as its ``llm`` runner does (calculon/llm/runner.py).

Systems: Calculon ships ``systems/h100_80g_nvl8.json`` (H100 rows) and ``systems/a100_80g.json`` (A100 rows; the file
its own ``llm-validation`` uses for end-to-end times), used as shipped. Calculon's network ``bandwidth`` is per
processor (calculon/network.py: time = latency + size / (bandwidth * efficiency) per participant), so the H100
file's inter-node 50 GB/s is one 400 Gb/s NIC per GPU: the DGX H100 figure, nothing to convert.

Calculon models one dense block type (MHA or MQA attention, two-matrix MLP, no embedding / LM head, no context or
expert parallelism, ZeRO-1 optimizer sharding at most). What that means per row is in ``application`` and
``execution``: GQA and gated MLPs are priced FLOP-equivalently (``feedforward`` chosen so the block's GEMM FLOPs
and weights equal the real block's), CP and MoE rows are not expressible.
"""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from peer_rows import NotExpressible, Prediction, Row, from_checkout, map_row

PEER = "calculon"
SYSTEMS = {"H100": "systems/h100_80g_nvl8.json", "A100": "systems/a100_80g.json"}
NVLINK_TIER, NETWORK_TIER = 0, 1  # the two networks of both shipped files: NVLink (size 8), InfiniBand


def application(row: Row) -> tuple[dict, list[str]]:
    """Calculon application dict (hidden, feedforward, seq_size, attn_heads, attn_size, num_blocks)."""
    if row.out_of_scope:
        raise NotExpressible(f"dev set: {row.out_of_scope}")
    if row.moe:
        raise NotExpressible("mixture of experts: Calculon models dense blocks only")
    if row.cp > 1:
        raise NotExpressible(f"context parallelism (cp={row.cp}): Calculon has tensor, pipeline and data "
                             "parallelism only")
    approx: list[str] = []
    h, a, d, g = row.hidden, row.heads, row.head_dim, row.kv_heads
    mlp_mats = 3 if row.gated_mlp else 2
    # Calculon's block GEMMs per token: Q,K,V,O = 4*h*a*d, MLP = 2*h*ff. The real block's: Q,O = 2*h*a*d,
    # K,V = 2*h*g*d, MLP = mlp_mats*h*ffn. Equal FLOPs (and weights) when ff = (mlp_mats*ffn + 2*g*d - 2*a*d)/2.
    ff = (mlp_mats * row.ffn + 2 * g * d - 2 * a * d) / 2
    ff = round(ff / row.tp) * row.tp  # Calculon splits feedforward evenly over TP
    if g != a or row.gated_mlp:
        what = " and ".join(x for x in (f"GQA ({g} KV heads)" if g != a else "",
                                        "gated MLP" if row.gated_mlp else "") if x)
        approx.append(f"{what} priced FLOP-equivalently: MHA + 2-matrix MLP with feedforward {ff} "
                      f"(real ffn {row.ffn})")
    app = {"hidden": h, "feedforward": ff, "seq_size": row.seq, "attn_heads": a, "attn_size": d,
           "num_blocks": row.layers}
    return app, approx


def tiers(row: Row) -> tuple[int, int, int]:
    """Network tier of (tp, pp, dp). Megatron and torchtitan order ranks tp-(cp)-dp-pp, innermost first; a group
    stays on NVLink while it and every inner group fit in one node (Calculon's tier 0, size 8, must be filled)."""
    n = row.gpus_per_node
    tp_net = NVLINK_TIER if row.tp <= n else NETWORK_TIER
    dp_net = NVLINK_TIER if row.tp * row.dp <= n else NETWORK_TIER
    pp_net = NVLINK_TIER if row.tp * row.dp * row.pp <= n else NETWORK_TIER
    return tp_net, pp_net, dp_net


def execution(row: Row) -> tuple[dict, list[str]]:
    """Calculon execution dict (the 23 fields of ``Llm.Execution.fields()``)."""
    application(row)  # the same refusals
    approx: list[str] = []
    if row.gbs % (row.dp * row.mbs):
        raise NotExpressible(f"gbs {row.gbs} is not a multiple of dp*mbs = {row.dp * row.mbs}")
    if row.zero >= 2:
        approx.append("ZeRO-3/FSDP2 priced as Calculon's optimizer_sharding (ZeRO-1): no per-layer parameter "
                      "all-gathers, weights unsharded in memory")
    if row.recompute == "full":
        recompute = "full"
    else:
        # FlashAttention (TE, SDPA) never stores the score matrix and recomputes it in backward: Calculon's
        # attn_only (Korthikanti et al. 2022's "selective") is that behaviour; its "none" stores seq^2 scores.
        recompute = "attn_only"
        if row.recompute == "selective" and row.stack == "fsdp2":
            approx.append("torchtitan op-level selective AC priced as attn_only (Calculon has no op-level policy)")
    sp = row.sp and row.tp > 1
    tp_net, pp_net, dp_net = tiers(row)
    exe = {
        "num_procs": row.tp * row.pp * row.dp,
        "tensor_par": row.tp, "pipeline_par": row.pp, "data_par": row.dp,
        "tensor_par_net": tp_net, "pipeline_par_net": pp_net, "data_par_net": dp_net,
        "batch_size": row.gbs, "microbatch_size": row.mbs,
        # The shipped H100 file lists float8 and float16 (bf16 has the same peak and size); Calculon prices a
        # whole run in one datatype, so fp8 rows run every tensor in fp8.
        "datatype": "float8" if row.dtype == "fp8" else "float16",
        "fused_activation": True,
        "attention_type": "multihead",
        "activation_recompute": recompute,
        "pipeline_interleaving": row.vp if row.pp > 1 else 1,
        "optimizer_sharding": row.dp > 1,
        "tensor_par_comm_type": "rs_ag" if sp else "ar",
        # Megatron's sequence-parallel linears re-gather their input in backward; Calculon's own Megatron
        # validation (validation/seqsel/*_seqsel.json) sets seq_par_ag_redo with attn_only.
        "seq_par_ag_redo": sp and recompute != "full",
        "tensor_par_overlap": "ring" if (row.tp_comm_overlap and row.tp > 1) else "none",
        "data_par_overlap": row.dp > 1,  # overlapped grad reduce / param gather (NeMo launcher, FSDP2 prefetch)
        "weight_offload": False, "activations_offload": False, "optimizer_offload": False,
        "training": True,
    }
    if row.dtype == "fp8":
        approx.append("fp8 run priced all-fp8 (Calculon has one datatype per run; attention and optimizer stay "
                      "bf16/fp32 in the real run)")
    return exe, approx


def _calculon(checkout: Path):
    """The calculon package and its Llm class, imported from ``checkout`` (the folder holding calculon/)."""
    calculon, llm = from_checkout(checkout, "calculon/llm/llm.py", "calculon", "calculon.llm")
    return calculon, llm.Llm


def predict(row: Row, checkout: Path) -> Prediction:
    """Run Calculon's Llm on ``row``: total_time is one training step (a global batch) on processor 0."""
    pred, inputs = map_row(row, PEER, application, execution)
    if inputs is None:
        return pred
    app, exe = inputs
    pred.system_file = SYSTEMS[row.gpu]
    with contextlib.redirect_stdout(io.StringIO()):
        calculon, Llm = _calculon(checkout)
        syst = calculon.System(calculon.io.read_json_file(str(checkout / SYSTEMS[row.gpu])))
        model = Llm(Llm.Application(app), logging.getLogger("calculon"))
        try:
            model.compile(syst, Llm.Execution.from_json(exe))
            model.run(syst)
        except Llm.Error as exc:
            # Llm.run computes every time before _check_mem_caps raises, then the runner prints "ERROR: ..." and
            # stops: a refusal, reported as one (the time it had computed is kept, not counted).
            if not str(exc).startswith("Mem tier"):
                pred.status, pred.reason = "error", f"Calculon: {exc}"
                return pred
            pred.status, pred.reason = "refused", f"Calculon: {exc}"
            pred.time_if_not_refused_s = float(model.get_total_time())
            return pred
        except AssertionError as exc:
            pred.status, pred.reason = "error", f"Calculon assertion: {exc}"
            return pred
    pred.predicted_step_s = float(model.get_total_time())
    pred.status = "approx" if pred.approximations else "ok"
    return pred
