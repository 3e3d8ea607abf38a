"""Kubeflow Training Operator v1 ``PyTorchJob`` (``apiVersion: kubeflow.org/v1``).

Fields: kubeflow/training-operator ``pkg/apis/kubeflow.org/v1/pytorch_types.go`` (@2f18ab7a) and
``pkg/controller.v1/pytorch/envvar.go``, shared/notes/exports.md (f): ``spec.nprocPerNode`` is a string; Master
(1 replica) + Worker (nodes - 1); the container must be named ``pytorch`` and its port ``pytorchjob-port``
(23456). The operator injects ``MASTER_ADDR``, ``MASTER_PORT`` and ``PET_NNODES`` / ``PET_NPROC_PER_NODE`` /
``PET_NODE_RANK``, which torchrun reads as its options, so the command is a bare ``torchrun <script>``.
"""
from __future__ import annotations

import yaml

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement, torchrun
from meshplan.planner.plan.schema import Plan

EXTENSION = "yaml"
IMAGE = "meshplan-train:latest"  # the user's training image; the header comment says to replace it
PORT = 23456


def check(plan: Plan) -> None:
    """Plan consistency (the operator adds no constraint beyond torchrun's, but one pod template cannot pin a
    pipeline stage to a device type)."""
    torchrun.check(plan)
    placement.refuse(plan, "kubeflow")


def unsupported(plan: Plan) -> list[str]:
    """The torchrun target's gaps, named for kubeflow."""
    out = [w.replace("torchrun:", "kubeflow:", 1) for w in torchrun.unsupported(plan)]
    if len(plan.cluster.groups) > 1:
        out.append("kubeflow: one pod template for all nodes; heterogeneous groups need nodeSelectors per "
                   "replica type, not rendered")
    return out


def _replica(plan: Plan, replicas: int) -> dict:
    per_node = plan.cluster.devices_per_node
    env = [{"name": "MESHPLAN_PLAN", "value": c.default_plan_path(plan)}]
    env += [{"name": k, "value": v} for k, v in c.plan_env(plan)]
    container = {
        "name": "pytorch",
        "image": IMAGE,
        "command": ["torchrun", torchrun.ENTRY, "--plan", c.default_plan_path(plan)],
        "env": env,
        "ports": [{"name": "pytorchjob-port", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": str(per_node)}},  # a quantity: int-or-string, typed str
    }
    return {"replicas": replicas, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}


def manifest(plan: Plan) -> dict:
    """The PyTorchJob as a dict."""
    specs = {"Master": _replica(plan, 1)}
    if plan.cluster.nodes > 1:
        specs["Worker"] = _replica(plan, plan.cluster.nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": c.slug("meshplan-" + plan.name)},
            # runPolicy: the operator's defaults written out (cleanPodPolicy None: pods are kept for their logs);
            # the kubeflow-training SDK's PyTorchJobSpec model requires the field
            "spec": {"nprocPerNode": str(plan.cluster.devices_per_node), "runPolicy": {"cleanPodPolicy": "None"},
                     "pytorchReplicaSpecs": specs}}


def render(plan: Plan) -> str:
    """The YAML text."""
    lines = [f"# {h}" for h in c.header(plan, "Kubeflow PyTorchJob", "kubeflow.org/v1")]
    lines.append(f"# Replace image {IMAGE} with your training image (it must contain {torchrun.ENTRY} and the plan "
                 f"{c.comment_text(c.default_plan_path(plan))}).")
    lines.append(f"# {c.entry_note(torchrun.ENTRY)}")
    return "\n".join(lines) + "\n" + yaml.safe_dump(manifest(plan), sort_keys=False)
