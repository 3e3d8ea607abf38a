"""Which node runs which pipeline stage, for plans whose stages sit on different device groups (heterogeneous
pipelines: ``meshplan plan`` on ``1x8xH100+1x8xA100`` puts the first 10 layers of Llama-3.1-8B on the A100 node).

A launcher decides the node -> rank map; the plan decides rank -> stage: Megatron's order (tp fastest, then cp, dp,
pp; ``examples/train_gpt.py``'s mesh ``(pp, dp_replicate, dp_shard, tp)`` alike), so pipeline stage s holds ranks
``[s * R, (s + 1) * R)`` with ``R = world / pp``. torchrun's c10d rendezvous gives node ranks in arrival order, so
these plans are launched with *static* node ranks instead (torch 2.13 ``torch/distributed/run.py``:
``--node-rank``, ``--master-addr``, ``--master-port``, the default ``static`` rendezvous; global rank = node rank x
nproc-per-node + local rank), and the script says which device each node rank must have.

Targets that can run them: torchrun, Megatron-LM (launched by torchrun) and Slurm (a heterogeneous job, one
component per run of node ranks on one device type, ``srun --het-group`` giving ``SLURM_PROCID`` in component
order: https://slurm.schedmd.com/heterogeneous_jobs.html, "Launching Applications"). DeepSpeed, Accelerate,
TorchTitan and Kubeflow configs cannot pin a stage to a node and refuse such plans (:func:`refuse`).
"""
from __future__ import annotations

from dataclasses import dataclass

from meshplan.planner.export import _common as c
from meshplan.planner.plan.schema import Plan

MASTER_PORT = 29500


@dataclass(frozen=True)
class NodeBlock:
    """Consecutive node ranks on one device group."""

    first_node: int
    """First node rank of the block."""
    nodes: int
    """Node ranks in the block."""
    group: int
    """Index into ``plan.cluster.groups``."""
    device: str
    """That group's device (``H100-SXM``)."""
    stages: tuple[int, ...]
    """Pipeline stages (pp ranks) the block runs."""

    @property
    def last_node(self) -> int:
        return self.first_node + self.nodes - 1


def is_heterogeneous_pipeline(plan: Plan) -> bool:
    """True when the plan's stages sit on more than one device group."""
    return len(c.stage_groups(plan)) > 1


def node_blocks(plan: Plan) -> list[NodeBlock]:
    """Node ranks in stage order, grouped by device group; ``[]`` for a plan whose stages share one group.

    Raises:
        MeshplanError: a node would hold ranks of stages on two groups, or a group has fewer nodes than its stages
            need (numbers printed).
    """
    if not is_heterogeneous_pipeline(plan):
        return []
    d, groups = plan.degrees, plan.cluster.groups
    if d.vpp > 1:
        c.fail(f"vpp={d.vpp} with stages on different device types: each rank would hold chunks of several "
               "stages, which static node ranks cannot pin; plan with vpp=1")
    per_node = groups[plan.stages[0].device_group].devices_per_node  # one width: c.check_plan refuses others
    ranks_per_stage = d.world_size // d.pp
    node_group: dict[int, int] = {}
    node_stages: dict[int, list[int]] = {}
    for s, stage in enumerate(plan.stages):
        lo, hi = s * ranks_per_stage, (s + 1) * ranks_per_stage
        for node in range(lo // per_node, -(-hi // per_node)):
            if node_group.setdefault(node, stage.device_group) != stage.device_group:
                c.fail(f"node rank {node} would hold ranks of stages on device groups {node_group[node]} and "
                       f"{stage.device_group} ({ranks_per_stage} ranks per stage, {per_node} per node)")
            node_stages.setdefault(node, []).append(s)
    blocks: list[NodeBlock] = []
    for node in sorted(node_group):
        g = node_group[node]
        if blocks and blocks[-1].group == g:
            b = blocks[-1]
            stages = b.stages + tuple(s for s in node_stages[node] if s not in b.stages)
            blocks[-1] = NodeBlock(b.first_node, b.nodes + 1, g, b.device, stages)
        else:
            blocks.append(NodeBlock(node, 1, g, groups[g].device, tuple(node_stages[node])))
    for g, group in enumerate(groups):
        used = sum(b.nodes for b in blocks if b.group == g)
        if used > group.nodes:
            c.fail(f"the stages on device group {g} ({group.device}) need {used} nodes, the group has {group.nodes}")
    return blocks


def torchrun_static_args(plan: Plan, master: str = '"$HEAD_NODE"') -> list[str]:
    """torchrun options with static node ranks (shell words; ``NODE_RANK``, ``MASTER_PORT`` and ``master`` set by
    the script)."""
    blocks = node_blocks(plan)
    nodes = sum(b.nodes for b in blocks)
    per_node = plan.cluster.groups[blocks[0].group].devices_per_node
    return ["--nnodes", str(nodes), "--nproc-per-node", str(per_node), "--node-rank", '"$NODE_RANK"',
            "--master-addr", master, "--master-port", '"$MASTER_PORT"']


def _stage_text(plan: Plan, stages: tuple[int, ...]) -> str:
    first = plan.stages[stages[0]]
    last = plan.stages[stages[-1]]
    word = "stage" if len(stages) == 1 else "stages"
    ids = str(stages[0]) if len(stages) == 1 else f"{stages[0]}-{stages[-1]}"
    return f"{word} {ids} (layers {first.first_layer}-{last.first_layer + last.num_layers - 1})"


def node_table(plan: Plan) -> list[str]:
    """Comment lines (no marker): which device each node rank must have and what it runs."""
    out = ["Heterogeneous pipeline: node ranks are static and follow the stages (rank = node rank x "
           "nproc-per-node + local rank; stage = rank // ranks per stage):"]
    for b in node_blocks(plan):
        nodes = f"node rank {b.first_node}" if b.nodes == 1 else f"node ranks {b.first_node}-{b.last_node}"
        out.append(c.comment_text(f"  {nodes}: {b.device} (cluster group {b.group}), {_stage_text(plan, b.stages)}"))
    return out


def node_rank_lines(plan: Plan) -> list[str]:
    """Bash lines for a torchrun-launched script: require ``NODE_RANK`` and ``HEAD_NODE``, refuse a node rank
    outside the plan, and export the device this node must have (``MESHPLAN_NODE_DEVICE``; the example trainer
    checks it against ``torch.cuda.get_device_name``)."""
    blocks = node_blocks(plan)
    last = blocks[-1].last_node
    lines = [f': "${{NODE_RANK:?set NODE_RANK (0-{last}) to the rank of this node in the table above}}"',
             ': "${HEAD_NODE:?set HEAD_NODE to the host name of node rank 0}"',
             *c.default_assignment("MASTER_PORT", str(MASTER_PORT)),
             'case "$NODE_RANK" in *[!0-9]*|"") echo "NODE_RANK=$NODE_RANK: not a number" >&2; exit 2;; esac']
    for i, b in enumerate(blocks):
        kw = "if" if i == 0 else "elif"
        lines.append(f'{kw} [ "$NODE_RANK" -ge {b.first_node} ] && [ "$NODE_RANK" -le {b.last_node} ]; then '
                     f"MESHPLAN_NODE_DEVICE={c.quote(b.device)}")
    lines.append(f'else echo "NODE_RANK=$NODE_RANK: this plan has node ranks 0-{last}" >&2; exit 2; fi')
    lines.append("export MESHPLAN_NODE_DEVICE")
    return lines


def gres_type(device: str) -> str:
    """Slurm GPU type of a catalogue device (``H100-SXM`` -> ``h100``): the family, lower case. Sites name GRES
    types in their own gres.conf; the script says so."""
    return c.slug(device.split("-")[0]) or "gpu"


def refuse(plan: Plan, target: str) -> None:
    """Refuse a heterogeneous pipeline for a target that cannot pin a stage to a node (one line, the reason)."""
    if is_heterogeneous_pipeline(plan):
        devices = ", ".join(f"stage {s}: {plan.cluster.groups[st.device_group].device}"
                            for s, st in enumerate(plan.stages))
        c.fail(f"{target}: the plan's pipeline stages run on different device types ({devices}) and {target} "
               "cannot pin a stage to a node; export to torchrun, megatron or slurm (static node ranks)")
