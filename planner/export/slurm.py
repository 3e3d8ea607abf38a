"""Slurm ``sbatch`` script: one task per node, each running torchrun (the pattern of torchtitan's
``multinode_trainer.slurm`` and accelerate's ``examples/slurm/submit_multinode*.sh``; shared/notes/exports.md (f)).

``MASTER_ADDR`` is the first host of ``scontrol show hostnames "$SLURM_JOB_NODELIST"``; torchrun's c10d rendezvous
runs there. The training command is the torchrun target's (``examples/train_gpt.py --plan``).
"""
from __future__ import annotations

from meshplan.planner.export import _common as c
from meshplan.planner.export import torchrun
from meshplan.planner.plan import Plan

EXTENSION = "sbatch"


def check(plan: Plan) -> None:
    """Plan consistency (Slurm adds no constraint beyond torchrun's)."""
    torchrun.check(plan)


def unsupported(plan: Plan) -> list[str]:
    """The torchrun target's gaps, named for slurm."""
    out = [w.replace("torchrun:", "slurm:", 1) for w in torchrun.unsupported(plan)]
    if len(plan.cluster.groups) > 1:
        out.append("slurm: one homogeneous allocation (--nodes/--gpus-per-node); heterogeneous groups need a "
                   "Slurm heterogeneous job (#SBATCH hetjob), not rendered")
    return out


def render(plan: Plan) -> str:
    """The sbatch script."""
    nodes, per_node = plan.cluster.nodes, plan.cluster.devices_per_node
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={c.slug('meshplan-' + plan.name)}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={per_node}",
             "#SBATCH --exclusive"]
    lines += [f"# {h}" for h in c.header(plan, "Slurm sbatch", "torchrun under srun, one task per node")]
    lines.append(f"# {c.entry_note(torchrun.ENTRY)}")
    lines.append("set -euo pipefail")
    lines.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    lines.append(f"MASTER_PORT={torchrun.RDZV_PORT}")
    lines.append("export MASTER_ADDR MASTER_PORT")
    lines += torchrun.env_lines(plan)
    launch = ["srun", "torchrun", "--nnodes", '"$SLURM_NNODES"', "--nproc-per-node", str(per_node),
              "--rdzv-backend", "c10d", "--rdzv-endpoint", '"$MASTER_ADDR:$MASTER_PORT"', "--rdzv-id",
              '"$SLURM_JOB_ID"', f'"${{MESHPLAN_ENTRY:-{torchrun.ENTRY}}}"', "--plan", '"$MESHPLAN_PLAN"', '"$@"']
    lines.append(c.bash_lines(launch))
    return "\n".join(lines) + "\n"
