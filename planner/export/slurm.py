"""Slurm ``sbatch`` script: one task per node, each running torchrun (the pattern of torchtitan's
``multinode_trainer.slurm`` and accelerate's ``examples/slurm/submit_multinode*.sh``; shared/notes/exports.md (f)).

``MASTER_ADDR`` is the first host of ``scontrol show hostnames "$SLURM_JOB_NODELIST"``; torchrun's c10d rendezvous
runs there. The training command is the torchrun target's (``examples/train_gpt.py --plan``).

A pipeline whose stages sit on different device types becomes a heterogeneous job (``#SBATCH hetjob`` between
components; https://slurm.schedmd.com/heterogeneous_jobs.html): one component per run of node ranks on one device
type, in stage order, each asking for its GPU type (``--gpus-per-node=h100:8``; GRES type names are the site's,
from its gres.conf). One ``srun --het-group=0,...`` step spans the components with task ids in component order, so
``SLURM_PROCID`` is the static node rank torchrun gets (:mod:`planner.export.placement`).
"""
from __future__ import annotations

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement, torchrun
from meshplan.planner.plan.schema import Plan

EXTENSION = "sbatch"


def check(plan: Plan) -> None:
    """Plan consistency (Slurm adds no constraint beyond torchrun's)."""
    torchrun.check(plan)


def unsupported(plan: Plan) -> list[str]:
    """The torchrun target's gaps, named for slurm."""
    out = [w.replace("torchrun:", "slurm:", 1) for w in torchrun.unsupported(plan)]
    if placement.is_heterogeneous_pipeline(plan):
        out = [w for w in out if "static node ranks" not in w]
        out.append("slurm: stages pinned to device types by a heterogeneous job (one component per device type, "
                   "SLURM_PROCID = node rank)")
        out.append("slurm: GPU types in --gpus-per-node are written as the device family "
                   f"({', '.join(sorted({placement.gres_type(b.device) for b in placement.node_blocks(plan)}))}); "
                   "use your site's GRES type names if they differ")
    elif len(plan.cluster.groups) > 1:
        out.append("slurm: one homogeneous allocation (--nodes/--gpus-per-node); heterogeneous groups need a "
                   "Slurm heterogeneous job (#SBATCH hetjob), not rendered")
    return out


def _render_hetjob(plan: Plan) -> str:
    """A heterogeneous job: one component per block of node ranks, one srun step over all of them."""
    blocks = placement.node_blocks(plan)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={c.slug('meshplan-' + plan.name)}"]
    for i, b in enumerate(blocks):
        per_node = plan.cluster.groups[b.group].devices_per_node
        if i:
            lines.append("#SBATCH hetjob")
        lines += [f"#SBATCH --nodes={b.nodes}", "#SBATCH --ntasks-per-node=1",
                  f"#SBATCH --gpus-per-node={placement.gres_type(b.device)}:{per_node}", "#SBATCH --exclusive"]
    lines += [f"# {h}" for h in c.header(plan, "Slurm sbatch (heterogeneous job)",
                                          "torchrun under srun, one task per node, static node ranks")]
    lines += [f"# {t}" for t in placement.node_table(plan)]
    lines += [f"#   hetjob component {i} = node ranks {b.first_node}-{b.last_node} ({b.device})"
              for i, b in enumerate(blocks)]
    lines.append(f"# {c.entry_note(torchrun.ENTRY)}")
    lines.append("set -euo pipefail")
    lines.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n 1)')
    lines += c.default_assignment("MASTER_PORT", str(placement.MASTER_PORT))
    lines.append("export MASTER_ADDR")
    lines += torchrun.env_lines(plan)
    devices = ",".join(b.device for b in blocks for _ in range(b.nodes))
    lines.append(f"export MESHPLAN_NODE_DEVICES={c.quote(devices)}")
    # Each task expands its own SLURM_PROCID (the node rank) and device; the batch script must not.
    args = " ".join(placement.torchrun_static_args(plan, master='"$MASTER_ADDR"'))
    task = ('NODE_RANK=$SLURM_PROCID; IFS=, read -ra devs <<< "$MESHPLAN_NODE_DEVICES"; '
            f'export MESHPLAN_NODE_DEVICE="${{devs[$NODE_RANK]}}"; exec torchrun {args} '
            f'"${{MESHPLAN_ENTRY:-{torchrun.ENTRY}}}" --plan "$MESHPLAN_PLAN" "$@"')
    groups = ",".join(str(i) for i in range(len(blocks)))
    lines.append("# shellcheck disable=SC2016  # the task's variables are expanded by each task, not here")
    lines.append(c.bash_lines(["srun", f"--het-group={groups}", "bash", "-c", c.quote(task), "meshplan-task",
                               '"$@"']))
    return "\n".join(lines) + "\n"


def render(plan: Plan) -> str:
    """The sbatch script."""
    if placement.is_heterogeneous_pipeline(plan):
        return _render_hetjob(plan)
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
