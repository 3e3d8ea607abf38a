"""torchrun launch script for the repository's ``examples/train_gpt.py`` (or any script that reads the plan).

Option names: torch 2.13.0 ``torch/distributed/run.py`` (``get_args_parser``), exports.md (a). The script is
the same on every node: multi-node jobs use the c10d rendezvous, so no per-node rank is needed, except for a
pipeline whose stages sit on different device types: there node ranks are static and the script names the device
of each (:mod:`planner.export.placement`). The plan reaches
the training script through one thing only, its path (``--plan`` and ``MESHPLAN_PLAN``); the ``MESHPLAN_*``
variables repeat the decisions for logs and for scripts that do not parse YAML.
"""
from __future__ import annotations

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement
from meshplan.planner.plan.schema import Plan

EXTENSION = "sh"
ENTRY = "examples/train_gpt.py"
RDZV_PORT = 29500


def check(plan: Plan) -> None:
    """Plan consistency (torchrun itself only needs nodes x processes-per-node = world)."""
    c.check_plan(plan)


def unsupported(plan: Plan) -> list[str]:
    """Decisions that neither torchrun nor examples/train_gpt.py's flags express."""
    d = plan.degrees
    out = c.common_notes(plan, "torchrun", placed=placement.is_heterogeneous_pipeline(plan))
    out += c.offload_notes(plan, "torchrun")
    out += c.stack_notes(plan, "torchrun", "eager")
    out += c.moe_notes(plan, "torchrun")
    # the example trainer keeps fp32 parameters under autocast, with no FSDP mixed-precision policy: its gradients
    # are reduced in fp32
    out += c.state_dtype_notes(plan, "torchrun", reduce=("fp32",))
    out += c.fsdp_notes(plan, "torchrun", "torch")
    out += c.tp_overlap_notes(plan, "torchrun")
    out += c.pp_overlap_notes(plan, "torchrun")
    out += c.shared_overlap_notes(plan, "torchrun")
    out += c.fused_moe_mlp_notes(plan, "torchrun")
    out += c.cuda_graph_notes(plan, "torchrun")
    out += c.fp8_params_notes(plan, "torchrun")
    out += c.bf16_layers_notes(plan, "torchrun")
    if plan.attention_dtype == "fp8":  # the launcher runs the user's script; the example trainer's is PyTorch SDPA
        out.append(f"torchrun: attention_dtype=fp8: {ENTRY} runs attention in PyTorch SDPA, which has no fp8 path; "
                   "the plan priced Transformer Engine's fp8 attention (export to megatron-bridge to run it)")
    # examples/train_gpt.py implements dp (DDP / FSDP2), tp, pp with 1f1b|gpipe; the rest needs another framework.
    for name, value in (("cp", d.cp), ("ep", d.ep), ("vpp", d.vpp)):
        if value > 1:
            out.append(f"torchrun: {ENTRY} has no {name} (plan {name}={value}); use the megatron or torchtitan target")
    if plan.compression and c.compression_methods(plan) and (d.dp_shard > 1 or d.tp > 1 or d.pp > 1):
        out.append(f"torchrun: {ENTRY} applies gradient compression as a DDP communication hook "
                   "(planner.export.comm_hook), i.e. only to pure DDP layouts; this plan's compression is not applied")
    if any(b.two_level or b.where == "cpu" for b in plan.compression or ()):
        out.append("torchrun: the DDP hook compresses whole buckets on the device; the plan's two-level / CPU "
                   "placement of compression is not applied")
    if c.fp8_recipe(plan) != "none":
        out.append(f"torchrun: {ENTRY} trains in fp32/bf16/fp16; the plan's fp8 ({c.fp8_recipe(plan)} recipe) is "
                   "not applied")
    if plan.recompute not in ("none", "selective", "full"):
        out.append(f"torchrun: {ENTRY} has no recompute={plan.recompute} (it stops at launch); use the megatron or "
                   "torchtitan target")
    if c.mixed_layer_precision(plan):
        out.append(f"torchrun: {ENTRY} trains every layer in {plan.dtype}; per-layer precision is not applied")
    if plan.recompute_modules:
        out.append(f"torchrun: {ENTRY} has no recompute_modules={plan.recompute_modules} (Megatron-Core's module "
                   "list); use the megatron or megatron-bridge target")
    if plan.mtp:
        out.append(f"torchrun: {ENTRY} trains no mtp={plan.mtp} multi-token-prediction modules; use the megatron or "
                   "megatron-bridge target")
    return out


def launcher_args(plan: Plan) -> list[str]:
    """torchrun's own options: static node ranks for a heterogeneous pipeline, else c10d (or ``--standalone``)."""
    if placement.is_heterogeneous_pipeline(plan):
        return placement.torchrun_static_args(plan)
    return c.torchrun_args(plan, f'"$HEAD_NODE:{RDZV_PORT}"', '"$MESHPLAN_JOB_ID"')


def preamble(plan: Plan) -> list[str]:
    """Lines after the header of a torchrun-launched script: what to run where, ``set -euo pipefail`` and the
    variables each node must set (``HEAD_NODE``; ``NODE_RANK`` with static node ranks)."""
    if placement.is_heterogeneous_pipeline(plan):
        lines = [f"# {t}" for t in placement.node_table(plan)]
        lines.append("# Run this same script on every node with NODE_RANK from the table; HEAD_NODE = node rank 0.")
        return lines + ["set -euo pipefail"] + placement.node_rank_lines(plan)
    if plan.cluster.nodes == 1:
        return ["set -euo pipefail"]
    return ["# Run this same script on every node; HEAD_NODE = host name of the first node.", "set -euo pipefail",
            ': "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"',
            *c.default_assignment("MESHPLAN_JOB_ID", c.slug(plan.name))]


def launch_words(plan: Plan) -> list[str]:
    """``torchrun <options> <entry> --plan "$MESHPLAN_PLAN" "$@"`` as shell words (variables left for bash; the
    script's own arguments, e.g. ``--steps 100``, pass through to the entry script)."""
    return (["torchrun"] + launcher_args(plan)
            + [f'"${{MESHPLAN_ENTRY:-{ENTRY}}}"', "--plan", '"$MESHPLAN_PLAN"', '"$@"'])


def env_lines(plan: Plan) -> list[str]:
    """``MESHPLAN_PLAN`` (overridable) and the exported decision variables."""
    lines = c.default_assignment("MESHPLAN_PLAN", c.default_plan_path(plan))
    lines += [f"export {k}={c.quote(v)}" for k, v in c.plan_env(plan)]
    return lines


def render(plan: Plan) -> str:
    """A bash script that launches the plan with torchrun."""
    lines = ["#!/bin/bash"] + [f"# {h}" for h in c.header(plan, "torchrun", "torch 2.13 torch/distributed/run.py")]
    lines.append(f"# {c.entry_note(ENTRY)}")
    lines += preamble(plan)
    lines += env_lines(plan)
    lines.append(c.bash_lines(launch_words(plan)))
    return "\n".join(lines) + "\n"
