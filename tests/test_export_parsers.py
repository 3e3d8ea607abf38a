"""Rendered launch configs, read back by each target's own parser (installed packages, CPU only):

* torchrun / slurm / megatron scripts: bash expands them (``torchrun``/``srun``/``scontrol`` captured as shell
  functions that print their argv) and torch 2.13's ``torch.distributed.run.get_args_parser`` parses the line;
* megatron flags: megatron-core ships no training argument parser (``megatron/training`` is not in the PyPI
  wheel), so each flag is checked against the flag list of shared/notes/exports.md (b), which was dumped from the
  real parser, and the values against the plan through Megatron's derivations (dp, microbatches, vpp);
* deepspeed: ``deepspeed.runtime.config.DeepSpeedConfig`` (batch assertion, ZeRO pydantic model);
* accelerate: ``launch_command_parser`` + ``_validate_launch_command`` (what ``accelerate launch`` runs) and
  ``ParallelismConfig``;
* torchtitan v0.2.2: ``ConfigManager.parse_args(["--job.config_file", ...])`` and ``ParallelDims`` validation;
* kubeflow: YAML structure against training-operator v1's PyTorchJob fields (exports.md (f)).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from meshplan.core.errors import MeshplanError
from meshplan.planner.export import _common, placement, render
from meshplan.planner.plan.schema import load_plan
from tests.helpers import data_path
from tests.test_export_golden import ALL_PLANS, PLANS, all_plans_for

BASH = shutil.which("bash")
CAPTURE = ('torchrun() { printf "%s\\n" torchrun "$@"; }; srun() { "$@"; }; '
           'scontrol() { printf "node-a\\nnode-b\\n"; }; ')


def _argv(script: str, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run the rendered script in bash with the launcher captured; return the launcher's argv."""
    path = tmp_path / "launch.sh"
    path.write_text(script)
    out = subprocess.run([BASH, "-c", CAPTURE + f"source {path}"], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], **env}, timeout=30, check=True).stdout
    return out.splitlines()


def _render_or_refusal(plan, target: str) -> str | None:
    """The rendered text, or None when the target refuses the plan; a refusal must be one line that names the
    decision it cannot express (issue 15 item 1: refused or named, never dropped)."""
    from meshplan.core.errors import MeshplanError

    try:
        return render(plan, target).text
    except MeshplanError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith(f"{target}: "), msg
        d = plan.degrees
        named = (plan.dtype, plan.recompute, plan.schedule, f"cp={d.cp}", "zero_stage", f"fp8 recipe {plan.fp8}",
                 f"fp8 recipe {_common.fp8_recipe(plan)}", f"cp_kind {plan.cp_kind}", f"etp={plan.etp}", "moe_overlap",
                 f"recompute_modules={plan.recompute_modules}", f"mtp={plan.mtp}", "attention_dtype=fp8",
                 f"cuda_graphs={plan.cuda_graphs}")
        assert any(w in msg for w in named), msg
        return None


def _torchrun_parse(argv: list[str]) -> argparse.Namespace:
    from torch.distributed.run import get_args_parser

    assert argv[0] == "torchrun"
    return get_args_parser().parse_args(argv[1:])


@pytest.mark.skipif(BASH is None, reason="bash not available")
@pytest.mark.parametrize("plan_name", all_plans_for("torchrun"))
def test_torchrun_script_parses(plan_name: str, tmp_path: Path) -> None:
    plan = ALL_PLANS[plan_name]()
    plan_file = plan.save(tmp_path / "plan.yaml")
    text = _render_or_refusal(plan, "torchrun")
    if text is None:
        return
    argv = _argv(text, tmp_path, {"HEAD_NODE": "node-a", "MESHPLAN_PLAN": str(plan_file),
                                                           "NODE_RANK": "1"})
    ns = _torchrun_parse(argv)
    nodes, per_node = plan.cluster.nodes, plan.cluster.devices_per_node
    assert ns.nproc_per_node == str(per_node)
    assert ns.nnodes == str(nodes)
    assert nodes * per_node == plan.degrees.world_size
    if placement.is_heterogeneous_pipeline(plan):  # static node ranks (torchrun's default "static" rendezvous)
        assert (ns.rdzv_backend, ns.node_rank, ns.master_addr, str(ns.master_port)) == ("static", 1, "node-a",
                                                                                       "29500")
    elif nodes > 1:
        assert (ns.rdzv_backend, ns.rdzv_endpoint) == ("c10d", "node-a:29500")
    else:
        assert ns.standalone
    assert ns.training_script == "examples/train_gpt.py"
    assert ns.training_script_args[0] == "--plan"
    assert load_plan(ns.training_script_args[1]) == plan  # the plan reaches the script through its path


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_slurm_script_parses(tmp_path: Path) -> None:
    plan = PLANS["llama70b"]()
    text = render(plan, "slurm").text
    sbatch = dict(re.findall(r"^#SBATCH --([a-z-]+)=?(\S*)$", text, re.M))
    assert sbatch["nodes"] == "16" and sbatch["gpus-per-node"] == "8" and sbatch["ntasks-per-node"] == "1"
    argv = _argv(text, tmp_path, {"SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "16", "SLURM_JOB_ID": "42"})
    ns = _torchrun_parse(argv)
    assert (ns.nnodes, ns.nproc_per_node, ns.rdzv_id) == ("16", "8", "42")
    assert ns.rdzv_endpoint == "node-a:29500"  # MASTER_ADDR = first host from scontrol


# --- megatron -------------------------------------------------------------------------------------------

def _megatron_flags_from_notes() -> set[str]:
    notes = data_path("notes", "exports.md").read_text(encoding="utf-8")
    section = notes.split("## (b) Megatron-LM")[1].split("## (c) DeepSpeed")[0]
    flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", section))
    # Plain add_argument flags of megatron/training/arguments.py (NVIDIA/Megatron-LM) that the notes do not list
    # (--use-rope-scaling: store_true, "Apply rope scaling as used in llama3.x"; --rope-scaling-factor: float,
    # default 8.0).
    # The issue 12 flags below are generated from megatron-core 0.16.1 TransformerConfig / ModelParallelConfig fields
    # of the same names (test_export_megatron_core builds the config from them): --moe-expert-capacity-factor,
    # --moe-pad-expert-input-to-capacity, --moe-token-drop-policy, --overlap-moe-expert-parallel-comm,
    # --moe-shared-expert-overlap, --moe-flex-dispatcher-backend; --fp4-format and --fp4-recipe (TransformerConfig
    # fp4, argparse_meta arg_names ["--fp4-format"], and fp4_recipe). --recompute-modules (nargs='*') and
    # --mtp-num-layers (_add_mtp_args, type=int) are arguments.py's own add_argument flags. --first-last-layers-bf16,
    # --num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16 are generated from the TransformerConfig fields
    # (ArgumentGroupFactory(TransformerConfig, exclude=...) in _add_network_size_args, which does not exclude them;
    # megatron/training/initialize.py reads args.first_last_layers_bf16). --cuda-graph-impl and --cuda-graph-scope
    # (nargs='+'), --no-check-for-nan-in-loss-and-grad: arguments.py's add_argument flags (core_v0.16.0 lines 1430-
    # 1441, validate_args line 725); --attention-dropout and --hidden-dropout are generated from TransformerConfig's
    # attention_dropout and hidden_dropout; --moe-router-fusion and --moe-router-load-balancing-type from
    # TransformerConfig's moe_router_fusion and moe_router_load_balancing_type; --squared-relu is arguments.py's own
    # add_argument (core_v0.16.0 line 1685, Nemotron-4's MLP).
    return flags | {"--fp4-format", "--fp4-recipe", "--recompute-modules", "--mtp-num-layers",
                    "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
                    "--add-qkv-bias", "--qk-layernorm", "--use-rope-scaling", "--rope-scaling-factor",
                    "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity", "--moe-token-drop-policy",
                    "--overlap-moe-expert-parallel-comm", "--moe-shared-expert-overlap",
                    "--moe-flex-dispatcher-backend", "--cuda-graph-impl", "--cuda-graph-scope",
                    "--no-check-for-nan-in-loss-and-grad", "--attention-dropout", "--hidden-dropout",
                    "--moe-router-fusion", "--moe-router-load-balancing-type", "--squared-relu"}


def _megatron_args(words: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        w = words[i]
        assert w.startswith("--"), f"stray value {w!r}"
        values = []
        while i + 1 + len(values) < len(words) and not words[i + 1 + len(values)].startswith("--"):
            values.append(words[i + 1 + len(values)])
        many = w in ("--recompute-modules", "--cuda-graph-scope")  # nargs='*' and nargs='+' (arguments.py)
        assert len(values) <= 1 or many, f"{w} takes one value, got {values}"
        out[w] = (values if many else values[0]) if values else True
        i += 1 + len(values)
    return out


@pytest.mark.skipif(BASH is None, reason="bash not available")
@pytest.mark.parametrize("plan_name", all_plans_for("megatron"))
def test_megatron_args(plan_name: str, tmp_path: Path) -> None:
    plan = ALL_PLANS[plan_name]()
    text = _render_or_refusal(plan, "megatron")
    if text is None:
        return
    ns = _torchrun_parse(_argv(text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    assert ns.training_script == "pretrain_gpt.py"
    args = _megatron_args(ns.training_script_args)
    unknown = set(args) - _megatron_flags_from_notes()
    assert not unknown, f"flags not in Megatron's parser dump: {unknown}"
    d, m = plan.degrees, plan.model
    tp, pp, cp = (int(args[f]) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                         "--context-parallel-size"))
    world = int(ns.nnodes) * int(ns.nproc_per_node)
    dp = world // (tp * pp * cp)  # Megatron derives DP (validate_args)
    assert (tp, pp, cp, dp) == (d.tp, d.pp, d.cp, d.dp)
    mbs, gbs = int(args["--micro-batch-size"]), int(args["--global-batch-size"])
    assert gbs % (mbs * dp) == 0 and gbs // (mbs * dp) == plan.grad_accum
    if "--num-layers-per-virtual-pipeline-stage" in args:
        assert int(args["--num-layers"]) // pp // int(args["--num-layers-per-virtual-pipeline-stage"]) == d.vpp
    if "--pipeline-model-parallel-layout" in args:
        # Unroll as PipelineParallelLayerLayout.parse_str_to_list does: t*n -> n decoder layers, '|' between stages.
        layout = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), args["--pipeline-model-parallel-layout"])
        assert [s.count("t") for s in layout.split("|")] == [s.num_layers for s in plan.stages]
    assert int(args["--num-layers"]) == m.num_layers and int(args["--hidden-size"]) == m.hidden_size
    assert int(args["--vocab-size"]) == m.vocab_size and int(args["--seq-length"]) == plan.seq_len
    assert ("--sequence-parallel" in args) == plan.sequence_parallel
    assert args.get("--recompute-granularity", "none") == plan.recompute.split(":")[0]
    if plan.recompute.startswith("full"):  # method/num-layers iff granularity full (validate_args)
        n = _common.recompute_layers(plan)
        assert (args["--recompute-method"], int(args["--recompute-num-layers"])) == (("block", n) if n else
                                                                                     ("uniform", 1))
    else:
        assert "--recompute-method" not in args
    recipe = _common.fp8_recipe(plan)
    fp8 = recipe if recipe != "nvfp4" else "none"  # NVFP4 is megatron-core's fp4 mode (TransformerConfig.fp4)
    assert args.get("--fp8-recipe", "none") == fp8 and ("--fp8-format" in args) == (fp8 != "none")
    assert (args.get("--fp4-format"), args.get("--fp4-recipe")) == (("e2m1", "nvfp4") if recipe == "nvfp4" else
                                                                     (None, None))
    if d.cp > 1:
        assert args["--cp-comm-type"] == {"ring": "p2p", "allgather": "all_gather", "a2a": "a2a"}[plan.cp_kind]
    assert float(args.get("--moe-expert-capacity-factor", 0)) == plan.moe_capacity
    assert ("--overlap-moe-expert-parallel-comm" in args) == plan.moe_overlap
    if d.ep > 1:
        assert int(args["--expert-model-parallel-size"]) == d.ep and int(args["--num-experts"]) % d.ep == 0
        assert int(args["--expert-tensor-parallel-size"]) == (plan.etp or d.tp)
        assert world % (int(args["--expert-tensor-parallel-size"]) * d.ep * pp) == 0
    # validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1 on Hopper unless an FSDP is in use.
    needs_env = (tp > 1 or cp > 1) and "--use-megatron-fsdp" not in args
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in render(plan, "megatron").text) == needs_env
    if m.num_experts and m.moe_layers:
        expr = args["--moe-layer-freq"]
        assert re.fullmatch(r"(\[[01]\]\*\d+\+?)+", expr)
        flags = sum(([int(f)] * int(n) for f, n in re.findall(r"\[([01])\]\*(\d+)", expr)), [])
        assert [i for i, f in enumerate(flags) if f] == list(m.moe_layers)


# --- deepspeed ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ds_config_cls():
    pytest.importorskip("deepspeed", reason="deepspeed not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    import deepspeed.comm as dscomm
    import deepspeed.ops
    import torch.distributed as tdist
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig reads the world size from deepspeed.comm, so a (1-process, gloo) group must exist; the data-
    # parallel size then comes from the mpu, as with Megatron-DeepSpeed. The CPU shared-memory all-reduce kernel
    # is a JIT C++ build (~40 s) that config parsing never uses: mark it unavailable.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    created = not tdist.is_initialized()
    if created:
        tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    yield DeepSpeedConfig
    if created:
        tdist.destroy_process_group()
        dscomm.comm.cdb = None


class _Mpu:
    """Megatron-style model-parallel unit: the one thing DeepSpeedConfig asks of it is the DP world size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.mark.parametrize("plan_name", all_plans_for("deepspeed"))
def test_deepspeed_config_loads(plan_name: str, ds_config_cls) -> None:
    plan = ALL_PLANS[plan_name]()
    text = _render_or_refusal(plan, "deepspeed")
    if text is None:
        return
    raw = json.loads(text)
    cfg = ds_config_cls(raw, mpu=_Mpu(plan.degrees.dp))
    assert cfg.world_size == plan.degrees.dp
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == \
        (plan.global_batch, plan.micro_batch, plan.grad_accum)
    assert cfg.zero_optimization_stage == plan.zero_stage
    assert cfg.bfloat16_config.enabled == (plan.dtype == "bf16")
    if plan.degrees.tp > 1:
        assert cfg.tensor_parallel_config.autotp_size == plan.degrees.tp
    if plan.degrees.ep > 1:
        assert cfg.expert_parallel_config.enabled and cfg.expert_parallel_config.autoep_size == plan.degrees.ep
        if plan.etp:  # AutoEP folding (module_inject/auto_ep_config.py); its default is 1
            assert cfg.expert_parallel_config.expert_tensor_parallel_size == plan.etp
    assert cfg.zero_config.zero_quantized_gradients == ("int8" in {b.method for b in plan.compression or ()}
                                                         and plan.zero_stage == 3)
    if plan.reduce_dtype and not plan.compression:  # the dtype the plan priced its gradient reduction in
        import torch
        assert cfg.communication_data_type == {"fp32": torch.float32, "bf16": torch.bfloat16}[plan.reduce_dtype]
    # The parser is strict where meshplan relies on it: a batch that does not multiply out is rejected.
    with pytest.raises(AssertionError):
        ds_config_cls({**raw, "train_batch_size": plan.global_batch + plan.micro_batch}, mpu=_Mpu(plan.degrees.dp))


# --- accelerate -----------------------------------------------------------------------------------------

def _variant(degrees: dict, **fields):
    def make():
        base = PLANS["fsdp8b"]()
        return base.model_copy(update={**fields, "degrees": dataclasses.replace(base.degrees, **degrees)})
    return make


# The reference plans cover MEGATRON_LM and FSDP; these two cover DDP (MULTI_GPU) and ZeRO-2 (DEEPSPEED).
ACCELERATE_PLANS = {**{k: ALL_PLANS[k] for k in all_plans_for("accelerate")},
                    "ddp8b": _variant({"dp_shard": 1, "dp_replicate": 8}, zero_stage=0),
                    "zero2_8b": _variant({}, zero_stage=2)}


@pytest.mark.parametrize("plan_name", list(ACCELERATE_PLANS))
def test_accelerate_config_loads(plan_name: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="accelerate not installed")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    plan = ACCELERATE_PLANS[plan_name]()
    text = _render_or_refusal(plan, "accelerate")
    if text is None:
        return
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    ns = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    ns, defaults, _ = _validate_launch_command(ns)
    assert ns.num_processes == plan.cluster.world_size and ns.num_machines == plan.cluster.nodes
    kind = defaults.distributed_type.value
    assert kind == {"ddp8b": "MULTI_GPU", "zero2_8b": "DEEPSPEED", "fsdp8b": "FSDP"}.get(plan_name, "MEGATRON_LM")
    d = plan.degrees
    if kind == "FSDP":
        assert ns.use_fsdp and int(ns.fsdp_version) == 2
        assert ns.fsdp_reshard_after_forward == (plan.zero_stage == 3)
        if defaults.parallelism_config:
            from accelerate.parallelism_config import ParallelismConfig

            pc = ParallelismConfig(dp_replicate_size=ns.parallelism_config_dp_replicate_size,
                                   dp_shard_size=ns.parallelism_config_dp_shard_size,
                                   tp_size=ns.parallelism_config_tp_size, cp_size=ns.parallelism_config_cp_size)
            assert pc.total_size == ns.num_processes
    elif kind == "MEGATRON_LM":
        assert ns.use_megatron_lm
        assert (ns.megatron_lm_tp_degree, ns.megatron_lm_pp_degree) == (d.tp, d.pp)
        assert ns.megatron_lm_num_micro_batches == plan.grad_accum
        if d.ep > 1:
            assert ns.megatron_lm_expert_model_parallel_size == d.ep
            assert ns.megatron_lm_expert_tensor_parallel_size == (plan.etp or d.tp)
        if plan.recompute.startswith("full"):
            n = _common.recompute_layers(plan)
            assert (ns.megatron_lm_recompute_method, ns.megatron_lm_recompute_num_layers) == \
                (("block", n) if n else ("uniform", 1))
    elif kind == "DEEPSPEED":
        assert ns.use_deepspeed and ns.zero_stage == plan.zero_stage
        assert ns.gradient_accumulation_steps == plan.grad_accum
    else:
        assert kind == "MULTI_GPU" and ns.multi_gpu and plan.zero_stage == 0
    recipe = _common.fp8_recipe(plan)
    want = "fp8" if recipe != "none" else {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[plan.dtype]
    assert ns.mixed_precision == want
    if recipe != "none":  # TE builds DelayedScaling; AO is torchao's tensorwise float8
        assert ns.fp8_backend == {"delayed": "TE", "tensorwise": "AO"}[recipe]


# --- torchtitan -----------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _torchtitan_modules():
    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        return "torchtitan not installed (pip install torchtitan==0.2.2)"
    from importlib.metadata import version

    ver = version("torchtitan")
    if not ver.startswith("0.2."):
        return f"torchtitan {ver} installed; the TOML target is for 0.2.x (0.3 dropped TOML job configs)"
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        # torchtitan/__init__.py imports its float8/MoE kernels, which need triton (a GPU compiler, absent on CPU
        # hosts); the config and parallel-dims modules need neither, so load them without the package __init__.
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["torchtitan"] = pkg
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    return ConfigManager, ParallelDims


def _torchtitan():
    """(ConfigManager, ParallelDims) of an installed torchtitan 0.2.x, or skip with the reason."""
    got = _torchtitan_modules()
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.mark.parametrize("plan_name", all_plans_for("torchtitan"))
def test_torchtitan_config_loads(plan_name: str, tmp_path: Path) -> None:
    ConfigManager, ParallelDims = _torchtitan()
    plan = ALL_PLANS[plan_name]()
    text = _render_or_refusal(plan, "torchtitan")
    if text is None:
        return
    path = tmp_path / "job.toml"
    path.write_text(text)
    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    p, t, d = cfg.parallelism, cfg.training, plan.degrees
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                        world_size=plan.cluster.world_size)  # asserts the product == world
    assert (dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp, dims.ep) == \
        (d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp, d.ep)
    dp = dims.dp_replicate * dims.dp_shard
    assert t.global_batch_size % (t.local_batch_size * dp) == 0
    accum = t.global_batch_size // (t.local_batch_size * dp)  # torchtitan/train.py v0.2.2
    n_mb = t.local_batch_size // p.pipeline_parallel_microbatch_size if d.pp > 1 else 1
    assert t.local_batch_size // (n_mb if d.pp > 1 else 1) == plan.micro_batch
    assert accum * n_mb == plan.grad_accum  # same number of micro-batches per step as the plan
    assert t.seq_len == plan.seq_len
    # torch.compile on exactly when the plan priced its kernels (stack=torchtitan); eager code runs with it off
    assert cfg.compile.enable == (plan.stack == "torchtitan")
    ac = cfg.activation_checkpoint
    if plan.recompute in ("none", "full"):
        assert ac.mode == plan.recompute
    elif _common.recompute_layers(plan):
        # layer-level SAC checkpoints every k-th block of a rank (torchtitan/distributed/activation_checkpoint.py):
        # N layers per virtual chunk on every pipeline rank, as the plan's full:N
        k = int(ac.selective_ac_option)
        assert ac.mode == "selective"
        assert {n // k for n in _common.rank_layers(plan)} == {_common.recompute_layers(plan) * d.vpp}
    else:
        assert (ac.mode, ac.selective_ac_option) == ("selective", "op")
    if d.pp > 1:
        want = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}.get(plan.schedule, "1F1B")
        assert p.pipeline_parallel_schedule == want
    if d.cp > 1:
        assert p.context_parallel_rotate_method == {"ring": "alltoall", "allgather": "allgather"}[plan.cp_kind]
    if d.ep > 1:
        assert dims.etp == (plan.etp or d.tp)
    recipe = _common.fp8_recipe(plan)
    if recipe == "mxfp8":
        assert cfg.model.converters == ["quantize.linear.mx"] and cfg.quantize.linear.mx.recipe_name == "mxfp8_cublas"
    elif recipe != "none":  # delayed runs tensorwise (named in the warnings)
        assert cfg.model.converters == ["quantize.linear.float8"]
        assert cfg.quantize.linear.float8.recipe_name == "tensorwise"
    else:
        assert cfg.model.converters == []
    if d.pp > 1 and p.pipeline_parallel_layers_per_stage:
        # torchtitan/distributed/pipeline_parallel.py: stages = ceil((L + first_less + last_less) / lps)
        stages = math.ceil((plan.model.num_layers + p.pipeline_parallel_first_stage_less_layers
                            + p.pipeline_parallel_last_stage_less_layers) / p.pipeline_parallel_layers_per_stage)
        assert stages == d.pp * d.vpp and stages % d.pp == 0
    if d.pp > 1 and p.module_fqns_per_model_part:
        assert [sum(f.startswith("layers.") for f in part) for part in p.module_fqns_per_model_part] == \
            [s.num_layers for s in plan.stages]


# --- kubeflow -------------------------------------------------------------------------------------------

def _pytorchjob_round_trip(job: dict) -> dict:
    """The manifest through the kubeflow-training SDK's PyTorchJob model (generated from the training-operator's
    OpenAPI schema, with the Kubernetes client's pod template): typed, required fields checked, and written back.
    A key the schema does not know is dropped on the way, so the round trip differs."""
    from kubeflow.training import ApiClient

    class _Response:  # ApiClient.deserialize reads an HTTP response's .data
        data = json.dumps(job)

    api = ApiClient()
    return api.sanitize_for_serialization(api.deserialize(_Response(), "KubeflowOrgV1PyTorchJob"))


@pytest.mark.parametrize("plan_name", all_plans_for("kubeflow"))
def test_kubeflow_manifest_is_a_pytorchjob(plan_name: str) -> None:
    pytest.importorskip("kubeflow.training", reason="kubeflow-training not installed")
    job = yaml.safe_load(render(ALL_PLANS[plan_name](), "kubeflow").text)
    assert _pytorchjob_round_trip(job) == job
    typo = json.loads(json.dumps(job))
    typo["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["envv"] = []
    assert _pytorchjob_round_trip(typo) != typo  # an unknown key is caught
    with pytest.raises(ValueError):
        _pytorchjob_round_trip({**job, "spec": {k: v for k, v in job["spec"].items() if k != "pytorchReplicaSpecs"}})


@pytest.mark.parametrize("plan_name", all_plans_for("kubeflow"))
def test_kubeflow_manifest(plan_name: str) -> None:
    plan = ALL_PLANS[plan_name]()
    job = yaml.safe_load(render(plan, "kubeflow").text)
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])  # RFC 1123 label
    spec = job["spec"]
    assert isinstance(spec["nprocPerNode"], str) and int(spec["nprocPerNode"]) == plan.cluster.devices_per_node
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert sum(r["replicas"] for r in replicas.values()) == plan.cluster.nodes  # operator's PET_NNODES
    for r in replicas.values():
        (container,) = r["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["ports"][0]["name"] == "pytorchjob-port"
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == plan.cluster.devices_per_node
        from torch.distributed.run import get_args_parser

        ns = get_args_parser().parse_args(container["command"][1:])
        assert ns.training_script == "examples/train_gpt.py"


def test_torchtitan_parser_is_strict(tmp_path: Path) -> None:
    """The ConfigManager rejects unknown keys, so the successful loads above do check the option names."""
    ConfigManager, _ = _torchtitan()
    path = tmp_path / "job.toml"
    path.write_text(render(PLANS["fsdp8b"](), "torchtitan").text.replace("tensor_parallel_degree",
                                                                        "tensor_parallel_size"))
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        ConfigManager().parse_args(["--job.config_file", str(path)])


def test_deepspeed_ulysses_config_loads(ds_config_cls) -> None:
    """cp > 1 becomes Ulysses sequence_parallel_size; the batch identity still holds over the dp group."""
    base = PLANS["fsdp8b"]()
    plan = base.model_copy(update={"global_batch": 32,
                                   "degrees": dataclasses.replace(base.degrees, dp_shard=4, cp=2)})
    raw = json.loads(render(plan, "deepspeed").text)
    cfg = ds_config_cls(raw, mpu=_Mpu(plan.degrees.dp))
    assert cfg.train_batch_size == 32 == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * 4
    assert raw["sequence_parallel_size"] * raw["data_parallel_size"] == plan.cluster.world_size


# Free searches under torchtitan's code whose best plans torchtitan is asked to load
TORCHTITAN_SEARCHES = [("qwen3-30b-a3b", "16x8xH100", 1024, 4096), ("llama-3.1-70b", "8x8xH100", 64, 131072),
                       ("mixtral-8x7b", "2x8xH100", 64, 4096)]


@pytest.mark.parametrize("model,cluster,batch,seq", TORCHTITAN_SEARCHES, ids=[s[0] for s in TORCHTITAN_SEARCHES])
def test_torchtitan_loads_what_a_free_search_under_it_recommends(model, cluster, batch, seq, tmp_path: Path) -> None:
    """The five best plans of a free search with ``--fix stack=torchtitan``, each exported and loaded by torchtitan's
    own ``ConfigManager``, its mesh validated by ``ParallelDims`` (which asserts the products and EP's borrowing)."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.layout.space import parse_fix
    from meshplan.planner.model.config import load_model
    from meshplan.planner.plan.build import to_plan
    from meshplan.planner.search.exact import search

    ConfigManager, ParallelDims = _torchtitan()
    work = Workload(load_model(model), load_cluster(cluster), batch, seq)
    ranked = search(work, parse_fix("stack=torchtitan"), top=5).ranked
    assert ranked
    for i, (layout, est) in enumerate(ranked):
        plan = to_plan(work, layout, est, f"{model}-{i}", model, "shipped")
        path = tmp_path / f"job{i}.toml"
        path.write_text(render(plan, "torchtitan").text)
        p = ConfigManager().parse_args(["--job.config_file", str(path)]).parallelism
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                            ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                            world_size=plan.cluster.world_size)
        assert (dims.dp_shard, dims.tp, dims.pp, dims.ep) == (layout.dp_shard, layout.tp, layout.pp, layout.ep)


def test_torchtitan_runs_gpt_oss_as_its_own_registered_model(tmp_path: Path) -> None:
    """A GPT-OSS plan exports to torchtitan v0.2.2's own gpt_oss model: the TOML loads, and the flavor it names in
    torchtitan's registry (``get_train_spec``) has the plan's layers, width, experts, top-k and window; that
    TrainSpec has no pipelining, so a pipelined plan is refused in one line."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.layout.space import parse_fix
    from meshplan.planner.model.config import load_model
    from meshplan.planner.plan.build import to_plan
    from meshplan.planner.search.exact import search

    ConfigManager, _ = _torchtitan()
    from torchtitan.protocols.train_spec import get_train_spec

    for preset, cluster in (("gpt-oss-20b", "2x8xH100"), ("gpt-oss-120b", "8x8xH100")):
        work = Workload(load_model(preset), load_cluster(cluster), 128, 4096)
        layout, est = search(work, parse_fix("stack=torchtitan,pp=1"), top=1).ranked[0]
        plan = to_plan(work, layout, est, preset, preset, "shipped")
        path = tmp_path / f"{preset}.toml"
        path.write_text(render(plan, "torchtitan").text)
        cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
        args = get_train_spec(cfg.model.name).model_args[cfg.model.flavor]
        m = work.model
        assert (args.n_layers, args.dim, args.moe_args.num_experts, args.moe_args.top_k, args.sliding_window_size) \
            == (m.num_layers, m.hidden_size, m.num_experts, m.experts_per_token, m.sliding_window)
        d = plan.degrees  # the same ranks, half of the sharded ones in a second pipeline stage
        piped = plan.model_copy(update={"degrees": dataclasses.replace(d, pp=2, dp_shard=d.dp_shard // 2)})
        with pytest.raises(MeshplanError, match="no pipelining_fn") as exc:
            render(piped, "torchtitan")
        assert "\n" not in str(exc.value)
