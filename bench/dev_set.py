"""The dev set: every published run of every ``*.jsonl`` in ``data/published_runs`` priced with its own layout
(``dev_runs.jsonl``: the Hopper sources S1, S1f, S5, T; ``blackwell_dev.jsonl``: Megatron-Bridge's B1, B2).

Run: python bench/dev_set.py [RUNS_DIR] [--json | --markdown]   (RUNS_DIR: data/published_runs by default)

Each in-scope row goes through ``meshplan.planner.search.job.plan_job``, the library call behind ``meshplan plan``,
with a ``--fix`` string pinning the row's layout, the row's HF config, an ``NxGxDEVICE`` cluster (``-NVL72`` racks
for GB200 / GB300), dtype, global batch and sequence length, and its source's stack profile. A row whose own
``meshplan_can_express`` begins with "no" is out of scope, unless meshplan maps it to a config (``HYBRID_CONFIGS``);
the others (the B rows' "hybrid Mamba" ones included) go to meshplan, which prices them or says what it cannot load.
Step time published = the source's seconds per step, else ``gbs*seq/(tokens_per_s_per_gpu*n_gpus)`` (the README's
convention); signed error = (predicted - published) / published, negative = predicted too fast. An MoE row priced on
an x86 host also carries its step at the other published x86 / Grace host speed (``planner.estimate.host_band``),
a row on a part with no sustained-load measurement its step at its lower-power sibling's measured share
(``sustained_band``), and each source says how many of the rows each open figure moves hold their published step
between the two prices (``host band holds``, ``sustained band holds``). The JSON summary adds the median |error| and,
for rows whose page footnote names a known kernel regression the run ran (``known_regressions``: priced and counted
in the mean like every other), their count and the mean |error| over the other rows.

``row_needs`` is the one place that says what a row needs, in the decisions' vocabulary (``pp_layout``, ``schedule``,
``etp``, ``fp8``, ``recompute``, ``cp_kind``, ``stack``, ...). A need becomes a ``--fix`` entry as soon as
meshplan's own ``--fix`` parser accepts it; until then the row is priced with the stated fallback (an
*approximated* decision, listed per row) or, where there is none, reported as *not expressible* with the
missing decision. A Megatron-Bridge table layout that cannot run (refused as out of memory, or against Megatron's
mesh rules) where the release's recipe ran another is priced at the recipe's, an approximated ``layout=recipe``
(``recipe_layout_row``); under ``--profile-only``, which reads no row's recipe, at the layout its profile's launcher
runs for the job the table states (its workload preset), an approximated ``layout=preset`` (``_price_at_preset``).
Nothing is fitted here: the harness only maps rows to inputs and reports.

A row of any other source (a run kept apart, from any publication, in the same fields) is priced from what it
states alone (``_stated_needs``): its model config, GPU (the catalogue part its ``gpu`` text or ``device`` names),
nodes and NVLink domain, degrees, batch, sequence, precision and, where given, ZeRO stage, recomputation and
sequence parallelism, under its ``stack`` profile or Megatron-Bridge's newest; the rest is meshplan's search. A row
lacking a fact or naming no catalogued GPU is reported as not expressible, saying which.
"""
from __future__ import annotations

import functools
import json
import re
import statistics
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import get_device
from meshplan.planner.layout.space import free_dispatcher

REPO = Path(__file__).resolve().parents[1]
# the repository's copy of the published runs (data/README.md); ../shared/published_runs is where new ones arrive
DEFAULT_RUNS = REPO / "data" / "published_runs"
GiB = 1024**3

# What the torchtitan ("T") rows of dev_runs.jsonl leave out, read from their sources. Keyed by row name; every
# entry names the table row it comes from. A = docs/performance.md @ 4d88a8a (64 A100-80GB; 405B on 128 H100
# "HBM2e based lower TDP SXM H100(95GB)"); B = benchmarks/llama3_h100_202412_torchtitan.md @ 820504e (Grand
# Teton: "96GB HBM2e with 2.4 TB/sec", "default 500W power limit", 400 Gb/s RDMA per GPU; torchtitan 9dec370).
A_TABLE, B_T1, B_T3 = ("Llama 3 performance numbers", "Table 1 (8 GPUs, local batch 2, selective AC)",
                       "Table 3 (128 GPUs, local batch 2, selective AC)")
GRAND_TETON = "H100 96GB HBM2e, 500 W"
TORCHTITAN_FACTS: dict[str, dict] = {
    "row39": dict(n_gpus=64, doc="A", table=A_TABLE, quote="| 8B | 1 | selective layer | 2904 | 56.8% |",
                  mfu=0.568, ac="layer", compile=False, memory_gib=None),
    "row40": dict(n_gpus=64, doc="A", table=A_TABLE, quote="| 8B | 1 | selective op | 2973 | 58.2% |",
                  mfu=0.582, ac="op", compile=False, memory_gib=None),
    "row41": dict(n_gpus=64, doc="A", table=A_TABLE, quote="| 70B | 1 | full | 331 | 51.7% |",
                  mfu=0.517, ac="full", compile=False, memory_gib=None),
    "row42": dict(n_gpus=128, doc="A", table="Llama 3.1 performance numbers",
                  quote="| 405B | 2 | full | 109 | 29.0%[^1] | None", mfu=0.290, ac="full", compile=False,
                  memory_gib=None, device="H100 SXM 95GB HBM2e, lower TDP"),
    "row45": dict(n_gpus=8, doc="B", table=B_T1, quote="| FSDP | 5,762 | 82.4 |", mfu=None, ac="op",
                  compile=False, memory_gib=82.4, device=GRAND_TETON),
    "row46": dict(n_gpus=8, doc="B", table=B_T1, quote="| FSDP + torch.compile | 6,667 | 77.0 |", mfu=None,
                  ac="op", compile=True, memory_gib=77.0, device=GRAND_TETON),
    "row52": dict(n_gpus=128, doc="B", table=B_T3, quote="| FSDP | 5,605 | 67.0 |", mfu=None, ac="op",
                  compile=False, memory_gib=67.0, device=GRAND_TETON),
    "row53": dict(n_gpus=128, doc="B", table=B_T3, quote="| FSDP + torch.compile | 6,514 | 62.0 |", mfu=None,
                  ac="op", compile=True, memory_gib=62.0, device=GRAND_TETON),
}
TORCHTITAN_DOCS = {"A": "pytorch/torchtitan docs/performance.md @ 4d88a8a",
                   "B": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md @ 820504e"}

# NeMo 24.07 runs were launched from NVIDIA/NeMo-Framework-Launcher @ tag 24.07 (8325688),
# launcher_scripts/conf/training/<model>.yaml: optimizer distributed_fused_adam with overlap_grad_sync and
# overlap_param_sync, sequence_parallel true wherever TP > 1, no activation checkpointing except nemotron_340b
# (activations_checkpoint_granularity: selective); userbuffer TP-comm overlap (ub_tp_comm_overlap) on where noted;
# fp8 runs: examples/training/*/h100/*_fp8*.sh set fp8=True, fp8_hybrid=True (TE DelayedScaling, HYBRID format,
# amax history 1024).
# Model states under apex's DistributedFusedAdam as NeMo container 24.07 (NeMo r2.0.0rc1) sets it up
# (nemo/collections/nlp/models/language_modeling/megatron_base_model.py, setup_optimization): the optimizer dtype is
# the conf's ``optim.dtype`` (default fp32); with a bf16 O2 model and fp32 optimizer NeMo sets
# store_param_remainders=True (optim_dtype=remainder); with ``optim.dtype: bf16`` (nemotron_340b.yaml and
# conf/peft/llama/sft.yaml at the tag) the bf16 weights are their own master (optim_dtype=bf16). Gradients live in
# apex's contiguous grad buffer, sized for every local parameter and kept whole (``_init_grad_buffer``): only the
# optimizer states are sharded, zero=1. The buffer's dtype is ``grad_sync_dtype`` (default: the optimizer dtype):
# bf16 where the example script sets +training.model.optim.grad_sync_dtype=bf16 (every gpt3 and llama h100 script)
# or the conf does (nemotron_340b, peft sft), fp32 otherwise (nemotron_8b/22b: neither does); bf16 is the nemo@24.07
# profile's, so only the fp32 rows count it. Pipeline sends overlapped with compute (``overlap_p2p_comm``, read only
# by the interleaved schedule; NeMo's default False) as each conf at the tag sets it: True in gpt3/175b,
# llama2_13b/70b, llama3_70b, nemotron_22b (Megatron-Core's own in the interleaved schedule, which the profile leaves
# it to); False in nemotron_340b (with batch_p2p_comm True); the other confs run no interleaved pipeline.
NEMO_CONF = {  # model column -> (launcher conf, recompute, ub_tp_comm_overlap, optim_dtype, grad_dtype, overlap_p2p)
    "GPT3-5B": ("gpt3/5b", "none", False, "remainder", "bf16", False),
    "GPT3-20B": ("gpt3/20b", "none", True, "remainder", "bf16", False),
    "GPT3-175B": ("gpt3/175b", "none", False, "remainder", "bf16", True),
    "LLAMA2-7B": ("llama/llama2_7b", "none", False, "remainder", "bf16", False),
    "LLAMA2-13B": ("llama/llama2_13b", "none", False, "remainder", "bf16", True),
    "LLAMA2-70B": ("llama/llama2_70b", "none", True, "remainder", "bf16", True),
    "LLAMA3-8B": ("llama/llama3_8b", "none", False, "remainder", "bf16", False),
    "LLAMA3-70B": ("llama/llama3_70b", "none", True, "remainder", "bf16", True),
    "Nemotron-8B": ("nemotron/nemotron_8b", "none", True, "remainder", "fp32", False),
    "Nemotron-22B": ("nemotron/nemotron_22b", "none", True, "remainder", "fp32", True),
    "Nemotron-340B": ("nemotron/nemotron_340b", "selective", False, "bf16", "bf16", False),
}
# AutoModel rows whose dev-set ``recompute`` is null (the config at e45812012 sets no activation_checkpointing),
# read from the config of the run itself: the MoE rows entered docs/performance-summary.md at NVIDIA-NeMo/Automodel
# 89e3a9fdd ('feat: Add performance summary document (#562)', 2025-10-06; the numbers never changed after), whose
# configs are examples/benchmark/configs/*.yaml at that commit; the 1024-GPU DeepSeek-V3 config first appears in
# PR #574 (bdb4dbc72, two days later). AutoModel's activation checkpointing wraps every decoder block whole
# (components/moe/parallelizer.py apply_ac: ptd_checkpoint_wrapper per block) = recompute=full.
AUTOMODEL_RUN_AC = {
    "automodel-gptoss-20b-8": ("full", "examples/benchmark/configs/gptoss_20b_te_deepep.yaml @ 89e3a9fdd: "
                               "activation_checkpointing: true (global_batch_size 256, local_batch_size 2, ep_size 8: "
                               "the table's row)"),
    "automodel-dsv3-1024": ("full", "examples/benchmark/configs/deepseek_v3_te_deepep_1024.yaml @ bdb4dbc72 (its first "
                            "version, PR #574): activation_checkpointing: true"),
    "automodel-nemotronv3-nano-8": ("full", "examples/benchmark/configs/nemotron_nano_v3_te_deepep.yaml @ 08a48f76c: "
                                    "activation_checkpointing: true (global_batch_size 512, local_batch_size 4, "
                                    "ep_size 8: the table's row)"),
    "automodel-nemotronv3-super-64": ("full", "examples/benchmark/configs/nemotron_super_v3_te_deepep.yaml @ "
                                      "e344133e4: activation_checkpointing: true (global_batch_size 512, "
                                      "local_batch_size 2, ep_size 64: the table's row)"),
    "automodel-nemotronv3-ultra-128": ("full", "examples/llm_benchmark/nemotron/nemotron_ultra_v3_te_deepep.yaml @ "
                                       "cb9765441 (its first version, PR #2539): activation_checkpointing: true "
                                       "(global_batch_size 256, local_batch_size 2, ep_size 64, dispatcher deepep, "
                                       "experts torch_mm: the table's row)"),
}
# What an AutoModel MoE run's FSDP2 exchanges over a step. At 89e3a9fdd, where the summary's first MoE rows ran, a
# block is gathered for its forward and again for its backward (components/moe/parallelizer.py apply_fsdp:
# reshard_after_forward=not pp_enabled) and a pipelined stage once per schedule run (torch.distributed.pipelining's
# backward_maybe_with_nosync): meshplan's zero=3 under fsdp=torch. PR #574 (bdb4dbc72, "Add fsdp optimizations for
# custom MoE models") added the benchmark's ``enable_fsdp_optimization``: recipes/llm/benchmark.py's
# prepare_for_grad_accumulation sets every FSDP module's reshard_after_backward and requires_gradient_sync False
# for all micro-batches but the last (components/moe/fsdp_mixin.py; under pipelining its patched
# backward_maybe_with_nosync does the same until the optimizer step's last backward), and the MoE blocks default to
# reshard_after_forward False: parameters gathered once a step and gradients reduce-scattered once, ZeRO-2's
# exchange (zero=2). The runs on that code whose configs turn both on (Super @ e344133e4 and Ultra @ cb9765441 set
# moe.reshard_after_forward: true, gathered again each forward):
AUTOMODEL_RUN_ZERO2 = {
    "automodel-dsv3-1024": "examples/benchmark/configs/deepseek_v3_te_deepep_1024.yaml @ bdb4dbc72: "
                           "parallelizer.reshard_after_forward: false, backend.enable_fsdp_optimization: true",
    "automodel-nemotronv3-nano-8": "examples/benchmark/configs/nemotron_nano_v3_te_deepep.yaml @ 08a48f76c: "
                                   "backend.enable_fsdp_optimizations: true, no moe.reshard_after_forward "
                                   "(MoEParallelizerConfig's default, False)",
}


# AutoModel runs whose config takes the fused linear cross-entropy (``linear_ce``) over the MaskedCrossEntropy of
# every other benchmark config (examples/benchmark/configs/*.yaml @ 89e3a9fdd, Super's @ e344133e4)
AUTOMODEL_RUN_LINEAR_CE = {
    "automodel-nemotronv3-ultra-128": "examples/llm_benchmark/nemotron/nemotron_ultra_v3_te_deepep.yaml @ cb9765441: "
                                      "loss_fn nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy "
                                      "(cut_cross_entropy's linear_cross_entropy): no logits stored",
}
# What an AutoModel run trains beyond its HF config, from the run's own config: Nemotron 3 Ultra's benchmark trains
# two MTP depths through its one physical MTP module (attention then MoE, mtp_use_repeated_layer).
AUTOMODEL_RUN_MTP = {
    "automodel-nemotronv3-ultra-128": ("2", "examples/llm_benchmark/nemotron/nemotron_ultra_v3_te_deepep.yaml @ "
                                       "cb9765441: num_nextn_predict_layers: 2, mtp_use_repeated_layer: true (one "
                                       "physical MTP module run at both depths); the table's 293 TFLOP/s at 815 "
                                       "tokens/s, 359.5 G per token, match two MTP passes (357.1 G; 332.6 G without)"),
}
# The finetuning table has no VP column; the launcher's SFT examples at the same tag set it, and fp8_params=true
# (weights kept as fp8 tensors): examples/peft/llama/h100/{7b_1node,13b_1node,70b_2node}.sh; the two pipelined ones
# also set overlap_p2p_comm=true (batch_p2p_comm=false), over conf/peft/llama/sft.yaml's False.
NEMO_SFT_VP = {"LLAMA2-7B": 1, "LLAMA2-13B": 10, "LLAMA2-70B": 20}


# The stack profile each source's runs were launched with (``meshplan stacks``): a row is priced from its table's
# facts plus its profile, and what it needs beyond both is a per-row setting, printed and counted. The torchtitan
# rows (2024-12, torchtitan 4d88a8a / 820504e) take the 0.2.2 profile, the nearest shipped: the values it sets
# (FSDP2, fp32 reduction, eager kernels without torch.compile, in-line pipeline sends) held then too
# (config_manager.py of 2024: mixed_precision_reduce choices ['float32']).
SOURCE_PROFILE = {"S1": "nemo@24.07", "S1f": "nemo@24.07", "S5": "automodel@89e3a9fdd", "T": "torchtitan@0.0.2"}


@dataclass(frozen=True)
class Need:
    """One decision a row needs, in the ``--fix`` vocabulary.

    ``fallback`` is what meshplan is given while it cannot express the need (``--fix`` entries, plus the special
    keys ``dtype`` and ``device``); ``None`` = no fallback, the row is not expressible. ``implied`` = today's
    meshplan already behaves this way without the key (e.g. ``schedule=interleaved`` follows from ``vpp > 1``).
    """

    key: str
    value: str
    why: str
    fallback: Optional[dict] = field(default_factory=dict)
    implied: bool = False
    stated: bool = False  # the row's own table states it (a quoted cell), so it is a fact, not a per-row setting


@dataclass(frozen=True)
class RowInputs:
    """What ``plan_job`` is called with for one row, and what it cannot yet be told."""

    name: str
    source: str
    model: Optional[str]  # path of the HF config
    cluster: str
    global_batch: int
    seq_len: int
    dtype: str
    fix: dict
    n_gpus: int
    published_step_s: float
    approximated: tuple[Need, ...] = ()
    missing: tuple[Need, ...] = ()  # needs with no fallback: the row is not expressible
    assumptions: tuple[str, ...] = ()
    out_of_scope: str = ""
    profile: str = ""  # the stack profile the row is priced with (SOURCE_PROFILE)
    from_profile: tuple[str, ...] = ()  # the needs its profile already sets, key=value
    per_row: tuple[str, ...] = ()  # the settings beyond the table's facts and the profile, key=value: why
    system: str = ""  # the source's system name (DGX-GB200, ...) where it gives one
    precision: str = ""  # the precision recipe (precision_group)
    can_express: str = "yes"  # the row's own meshplan_can_express (e.g. "hybrid Mamba"): priced if meshplan can
    lora: str = ""  # LoRA over a frozen base (``--lora``): the task's, not a layout decision
    moe: bool = False  # the model routes tokens to experts
    cuda_graphs: str = ""  # what the run captured in CUDA graphs (``bridge_cuda_graphs``; "" where unknown)
    task: str = "pretrain"  # what the job trains (``row_task``): a fact of the row's table, read by its profile

    @property
    def fix_string(self) -> str:
        return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.fix.items())


def meshplan_accepts(key: str, value: str) -> bool:
    """Whether ``--fix key=value`` is understood by meshplan's own parser (the one ``plan_job`` uses)."""
    from meshplan.planner.layout.space import parse_fix

    try:
        parse_fix(f"{key}={value}")
    except MeshplanError:
        return False
    return True


def n_gpus_of(row: dict) -> int:
    return int(row.get("n_gpus") or TORCHTITAN_FACTS.get(row["name"], {}).get("n_gpus")
               or row["tp"] * row["pp"] * row["dp"] * row["cp"])


def derived_step_s(row: dict) -> float:
    """gbs*seq/(tokens_per_s_per_gpu*n_gpus): the README's conversion of a published throughput, seconds."""
    return row["gbs"] * row["seq"] / (row["published"]["tokens_per_s_per_gpu"] * n_gpus_of(row))


def published_step_s(row: dict) -> float:
    if row.get("published", {}).get("step_time_s"):
        return float(row["published"]["step_time_s"])
    return derived_step_s(row)


def _quote_cells(row: dict) -> list[str]:
    """The cells of the row's quoted source table row."""
    return [c.strip() for c in row["published"]["quote"].strip().strip("|").split("|")]


# The rows' GPT-OSS configs are Mixtral-family stand-ins written when meshplan could not express GPT-OSS (README:
# no attention sinks, no 128-token sliding window); meshplan's presets are the models themselves (HF config.json of
# openai/gpt-oss-120b and -20b: alternating sliding and full attention, sinks, expert biases). Nemotron-4 340B's is a
# Llama-family stand-in of equal FLOPs (a gated MLP of 2/3 the width for its two-matrix squared-ReLU one); meshplan's
# preset is the model as NeMo 24.07's conf trains it (planner/presets/models/PROVENANCE.md).
REAL_MODEL_OF_STAND_IN = {"configs/gpt-oss-120b-approx.json": "gpt-oss-120b",
                          "configs/gpt-oss-20b-approx.json": "gpt-oss-20b",
                          "configs/nemotron4-340b-flopeq-approx.json": "nemotron-4-340b"}


def _config_path(row: dict, runs_dir: Path) -> Optional[str]:
    if row.get("config") in REAL_MODEL_OF_STAND_IN:
        return REAL_MODEL_OF_STAND_IN[row["config"]]
    if row.get("config"):
        path, named = (runs_dir / row["config"]).resolve(), str(row["config"])
        if not path.exists() and "/" not in named and not named.endswith(".json"):  # one of meshplan's model presets
            return named
        return str(path)
    # torchtitan rows name no config: Llama 3 / 3.1 shapes (the rows' own fields agree, tests/test_dev_set.py)
    by_layers = {32: "llama-3.1-8b-instruct.json", 80: "llama-3.1-70b-instruct.json"}
    if row.get("layers") in by_layers:
        return str((runs_dir.parent / "model_configs" / by_layers[row["layers"]]).resolve())
    if row.get("layers") == 126:
        return "llama-3.1-405b"  # meshplan's preset (planner/presets/models/llama-3.1-405b.json)
    return None


# The AutoModel Nemotron V3 rows carry no config: Nano and Super use the configs the Blackwell rows name
# (configs/PROVENANCE.md), Ultra meshplan's preset, transcribed from Megatron-LM's ModelOpt example
# (planner/presets/models/PROVENANCE.md).
HYBRID_CONFIGS = {"automodel-nemotronv3-nano-8": "configs/nemotron-3-nano-30b-a3b.json",
                  "automodel-nemotronv3-super-64": "configs/nemotron-3-super-120b-a12b.json",
                  "automodel-nemotronv3-ultra-128": "nemotron-3-ultra-550b-a55b"}


def in_scope(row: dict) -> bool:
    """Whether the dev set prices ``row``: its ``meshplan_can_express`` does not begin with "no", or meshplan maps
    it to a config (``HYBRID_CONFIGS``)."""
    return row["name"] in HYBRID_CONFIGS or not str(row.get("meshplan_can_express", "yes")).startswith("no")


# Megatron-Bridge's published runs (B1 pre-training, B2 fine-tuning; blackwell_dev.jsonl): each table section is one
# NeMo container, whose Megatron-Bridge release is the stack profile: its performance scripts, which launched the
# published runs (planner/presets/stacks/megatron-bridge-perf@<ver>, on the library's megatron-bridge@<ver>; 25.09's
# scripts add nothing to the library's defaults, so its rows take the library's profile).
# What a row states: model, GPUs and system, precision, GBS / MBS / sequence, FSDP, TP / PP / CP / VP / EP. The
# README's conventions (data/published_runs/README.md, "B1, B2"): FSDP > 0 = Megatron-FSDP optim_grads_params
# (zero=3), else the library recipes' distributed optimizer (zero=1); sp = TP > 1 (the perf scripts' rule); GB200 /
# GB300 = 4 GPUs per compute tray in NVL72 racks (nvlink_domain 72), B200 / B300 = 8 GPUs per node, NVLink domain 8.
def is_bridge_row(row: dict) -> bool:
    """A row of Megatron-Bridge's archive with the recipe behind it (one without is priced as any source's)."""
    pub = row.get("published")
    return (isinstance(pub, dict) and "Megatron-Bridge" in str(pub.get("source", "")) and bool(row.get("system"))
            and bool(row.get("recipe")))


def bridge_profile(row: dict) -> str:
    """``megatron-bridge-perf@26.06.01`` for a row of the ``## 26.06.01 NeMo Container`` section
    (``megatron-bridge@<ver>`` for a release whose performance scripts have no profile of their own: none now)."""
    version = row["container"].split()[-1]
    perf = f"megatron-bridge-perf@{version}"
    return perf if perf in _stack_refs() else f"megatron-bridge@{version}"


def bridge_cluster(row: dict, n_gpus: int, profile: str = "") -> tuple[str, str, bool]:
    """(cluster, note, whether the profile says it): ``16x4xGB200-NVL72`` (trays of 4 in NVL72 racks; a job need not
    fill its last rack) or ``8x8xB200``. A job over several racks runs as the launcher of stack profile ``profile``
    lays it (``StackProfile.placement``: Megatron-Bridge's perf scripts ask Slurm for segments of at most 18 nodes,
    each inside one rack: 256 GPUs as 4 racks of 64, ``64x4xGB200-NVL64``); a profile that says nothing spreads it
    evenly over the fewest racks that hold it, a per-row assumption the note states. Either way each expert-parallel
    group stays inside one rack, as the perf scripts require (``perf_plugins.py`` ``_set_nvl_domain_size``: HybridEP's
    ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` = EP, EP <= 72 asserted), which 256 GPUs packed 72 to a rack cannot
    do for EP 64."""
    device, gpn = row["system"].removeprefix("DGX-"), row["gpus_per_node"]
    domain = row.get("nvlink_domain") or gpn
    note, said = "", False
    if domain > gpn and n_gpus > domain:
        place = _placement(profile)
        per_rack = place.rack_gpus(n_gpus, gpn) if place else None
        if per_rack is not None and per_rack <= domain:
            note, said = (f"{n_gpus} GPUs in racks of {per_rack} (the profile's launcher: {place.source})", True)
            domain = per_rack
        else:
            racks = -(-n_gpus // domain)
            if n_gpus % racks == 0 and (n_gpus // racks) % gpn == 0 and n_gpus // racks < domain:
                note = (f"{n_gpus} GPUs spread evenly over {racks} NVL{domain} racks, {n_gpus // racks} each (the "
                        "page does not say; the perf scripts keep each EP group inside one rack)")
                domain = n_gpus // racks
    return f"{n_gpus // gpn}x{gpn}x{device}" + (f"-NVL{domain}" if domain > gpn else ""), note, said


def _placement(profile: str):
    """Stack profile ``profile``'s placement (``None``: no profile, or it says nothing)."""
    from meshplan.planner.layout.stacks import load_stacks

    return load_stacks().get(profile).placement if profile else None


# The table's precision word -> (meshplan dtype, low-precision recipe or "" for the dtype's own, note). The perf
# scripts' map (scripts/performance/utils/precision.py): bf16 -> bf16_mixed, fp8_cs ->
# bf16_with_fp8_current_scaling_mixed, fp8_mx -> bf16_with_mxfp8_mixed, nvfp4 -> bf16_with_nvfp4_mixed.
BRIDGE_PRECISION = (
    ("BF16", "bf16", "", ""),
    ("NVFP4", "nvfp4", "", ""),
    ("MXFP8", "fp8", "mxfp8", ""),
    ("FP8-MX", "fp8", "mxfp8", ""),
    ("FP8 with 32x32", "fp8", "mxfp8", "25.09 footnote '32x32 for both weights and activations' on GB200/B200: "
     "the 25.11 table labels the same run FP8-MX; priced as MXFP8 (no 32x32 recipe in meshplan)"),
    # the perf scripts' other fp8 compute dtypes (scripts/performance/utils/precision.py: fp8_sc is
    # bf16_with_fp8_subchannel_scaling_mixed, block-wise; r0.1.0's fp8_ds delayed scaling), before FP8 itself
    ("FP8-SC", "fp8", "blockwise", ""),
    ("FP8-DS", "fp8", "delayed", ""),
    ("FP8", "fp8", "tensorwise", ""),  # FP8 (26.02+, the FP8_CS presets) and FP8-CS (25.11): current scaling
    ("not stated", "fp8", "tensorwise", "25.09 main value, no precision column: FP8 implied by the footnote, "
     "taken as current scaling (FP8-CS, as 25.11 labels it)"),
)


def bridge_cuda_graphs(row: dict) -> str:
    """What a Megatron-Bridge preset captured in CUDA graphs, as the summary groups rows: ``whole iteration``,
    ``partial`` (per-layer graphs), ``mixers only`` (per-layer graphs of the attention and Mamba mixers alone: every
    MoE block eager), ``none`` (``cuda_graph_impl`` none, or r0.1.0's ``cuda_graphs`` flag off), or ``unstated`` (the
    preset sets neither: the library default, none). Read from the row's quoted preset
    (``workload_settings``, r0.1.0's perf-matrix ``settings``) by the library's own reading
    (``planner.search.workloads.preset_graphs``); ``BRIDGE_GRAPHS`` maps them to meshplan's ``cuda_graphs``
    decision, which prices the host time an MoE layer's token-count sync exposes."""
    from meshplan.planner.search.workloads import preset_graphs

    rec = row["recipe"]
    said = preset_graphs(rec.get("workload_settings") or rec.get("settings") or {})
    return {"iteration": "whole iteration", "layers": "partial", "mixers": "mixers only", "none": "none",
            None: "unstated"}[said]


# bridge_cuda_graphs' mode -> meshplan's cuda_graphs decision (``none`` is Megatron-Bridge's default,
# ``cuda_graph_impl`` "none", which no preset needs to say)
BRIDGE_GRAPHS = {"whole iteration": "iteration", "partial": "layers", "mixers only": "mixers", "none": "none",
                 "unstated": "none"}


def bridge_precision(row: dict) -> tuple[str, str, str]:
    """(dtype, fp8 recipe, note) of a Megatron-Bridge row from its ``precision_recipe``."""
    said = row["precision_recipe"]
    for prefix, dtype, recipe, note in BRIDGE_PRECISION:
        if said.startswith(prefix):
            return dtype, recipe, note
    raise MeshplanError(f"{row['name']}: precision_recipe '{said}' is none of the table's words")


def bridge_recompute(row: dict, pp: int = 1) -> tuple[str, list[Need], str]:
    """(recompute, needs, note) from the row's recipe: the library recipes' default is no recomputation
    (recompute_granularity None); ``selective`` with ``recompute_modules`` recomputes only the modules named
    (Megatron-Core TransformerConfig.recompute_modules, meshplan's ``recompute_modules`` decision; core_attn alone is
    meshplan's "selective", an empty list recomputes nothing); CPU offloading of activations
    (``cpu_offloading_num_layers``) is ``offload_layers``, except where the table's layout is pipelined: Megatron-Core
    refuses CPU offloading with pp > 1 (TransformerConfig.__post_init__), so a recipe that differs from the row there
    cannot have run it."""
    said = str(row.get("recompute") or "")
    off = re.search(r"CPU offloading of (\d+) layers", said)
    if off and pp > 1:
        return "none", [], (f"recipe {row['recipe'].get('match')} offloads {off.group(1)} layers, which "
                            f"Megatron-Core refuses at the table's pp={pp}: priced without offloading")
    if off:
        return "none", [Need("offload_layers", off.group(1), "the preset offloads the activations of "
                             f"{off.group(1)} layers to host memory (cpu_offloading_num_layers)", {})], ""
    mods = re.search(r"recompute_modules=\[([^\]]*)\]", said)
    if not said.startswith("selective") or not mods:
        return "none", [], "recompute none (library recipe default recompute_granularity=None)"
    names = [m.strip(" '\"") for m in mods.group(1).split(",") if m.strip()]
    if not names:
        return "none", [], "selective with recompute_modules=[]: nothing recomputed"
    if names == ["core_attn"]:
        return "selective", [], ""
    return "selective", [Need("recompute_modules", "+".join(names), f"selective recomputation of {names} (preset "
                              "recompute_modules)", {"recompute": "none"})], ""


# Megatron-Bridge's DeepSeek-V3 library recipe picks the pipeline layout by (pp, vp) when the preset gives none
# (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, layout_map, read at 05d003fb): decoder layers per virtual
# stage, the embedding on the first and the MTP module and loss on the last.
DEEPSEEK_V3_LAYOUTS = {(4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
                       (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,)}
# Kimi-K2's (61 layers): recipes/kimi/kimi_k2.py _get_kimi_k2_pipeline_layout (v0.3.1 to v0.5.1, lines 30-39), which
# the perf scripts' kimi_llm_pretrain.py calls with the preset's pp and vp when the preset sets no pp_layout: the
# same map as DeepSeek-V3's, plus (2, 8)
KIMI_K2_LAYOUTS = {**DEEPSEEK_V3_LAYOUTS, (2, 8): (4,) * 15 + (1,)}
# row model prefix -> (its library layouts, how the reason names them, what the last stage holds beside its layers)
LIBRARY_LAYOUTS = (("DeepSeekV3", DEEPSEEK_V3_LAYOUTS, "DeepSeek-V3 library recipe layout_map", "MTP+loss"),
                   ("Kimi", KIMI_K2_LAYOUTS, "Kimi-K2 library recipe _get_kimi_k2_pipeline_layout", "loss"))


# Megatron-Bridge's library pretrain recipes that set CommOverlapConfig(tp_comm_overlap=True), which the perf
# scripts' recipe functions keep for every precision but NVFP4 ("tp_comm_overlap = False if precision == 'nvfp4'
# else cfg.comm_overlap.tp_comm_overlap"); Megatron-Bridge turns it on where TP >= 2 with sequence parallelism
# (training/comm_overlap.py, CommOverlapConfig._get_model_comm_overlap_cfgs). Read at each tag in a clone of
# NVIDIA-NeMo/Megatron-Bridge, src/megatron/bridge/recipes/llama/llama3.py. Row model -> the function and its lines.
LIBRARY_TP_COMM_OVERLAP = {
    "LLAMA3_70B": "llama3_70b_pretrain_config, tp_comm_overlap=True (llama3.py line 302 at v0.2.0-v0.3.0, 738 at "
                  "v0.3.1-v0.4.x, 739 at v0.5.x)",
    "LLAMA3.1_405B": "llama31_405b_pretrain_config, tp_comm_overlap=True (llama3.py line 416 at v0.2.0-v0.3.0, 1189 "
                     "at v0.3.1-v0.4.x, 1203 at v0.5.x)"}


# Megatron-Bridge r0.1.0 (NeMo 25.09) ran its perf configs through scripts/performance/run_script.py, which sets
# sequence parallelism at TP > 1 (utils/helpers.py line 169) and keeps TP overlap on: the Llama recipes through their
# library default, Qwen3 explicitly. Row model (its name's first word) -> the line that sets it.
R010_TP_COMM_OVERLAP = {
    "LLAMA3_70B": "llama3_70b_pretrain_config (line 52) leaves comm_overlap None and recipes/llama/llama3_70b.py "
                  "line 221 sets CommOverlapConfig(tp_comm_overlap=True)",
    "LLAMA3.1_405B": "llama31_405b_pretrain_config (line 54) leaves comm_overlap None and recipes/llama/"
                     "llama31_405b.py line 237 sets CommOverlapConfig(tp_comm_overlap=True)",
    "Qwen3_235B_a22B": "qwen3_235b_a22b_pretrain_config(comm_overlap_config=CommOverlapConfig(tp_comm_overlap="
                       "True)), line 114"}


def _r010_model(row: dict) -> str:
    return row["model"].split()[0]


def bridge_pp_layout(row: dict, pp: int, vpp: int) -> Optional[Need]:
    """The pipeline split the row's recipe states (preset ``pp_layout``, or DeepSeek-V3's and Kimi-K2's library
    layout maps)."""
    from meshplan.planner.layout.splits import format_pp_layout, megatron_layout_stages

    said = (row["recipe"].get("workload_settings") or {}).get("pp_layout")
    if said:
        stages = megatron_layout_stages(said)
        why = f"preset pp_layout '{said}' ({row['recipe'].get('workload_config')})"
    else:
        hit = next(((layouts[(pp, vpp)], name, tail) for prefix, layouts, name, tail in LIBRARY_LAYOUTS
                    if row["model"].startswith(prefix) and (pp, vpp) in layouts), None)
        if hit is None:
            return None
        stages, name, tail = hit
        why = f"{name}({pp}, {vpp}): E+{stages[0]} | ... | {stages[-1]}+{tail}"
    if len(stages) != pp * vpp or sum(stages) != row["layers"]:
        return Need("pp_layout", said or str(stages), "the recipe's pipeline layout does not fit pp x vpp", None)
    if min(stages) < 1:  # e.g. the H100 presets' 'Et|(tt|)*30mL': the MTP module and the loss alone on the last
        near = _fill_empty_stages(stages)
        return Need("pp_layout", said or str(stages), f"{why}: a virtual stage holds no decoder layer, which "
                    "meshplan's split cannot hold; priced at the nearest split, a layer moved into it",
                    None if near is None else {"pp_layout": format_pp_layout(near)})
    return Need("pp_layout", format_pp_layout(stages), why, None)


def _fill_empty_stages(stages: list[int]) -> Optional[list[int]]:
    """``stages`` with each stage of no decoder layer given one from the nearest stage holding two or more (the
    earlier on a tie); ``None`` where no stage can spare one."""
    out = list(stages)
    for i, n in enumerate(out):
        if n:
            continue
        donors = [k for k, m in enumerate(out) if m > 1]
        if not donors:
            return None
        k = min(donors, key=lambda k: (abs(k - i), k > i))
        out[k], out[i] = out[k] - 1, 1
    return out


def _recipe_says(row: dict, text: str) -> bool:
    """Whether one of the recipe function's ``cfg.*`` assignments (with its helpers expanded) contains ``text``."""
    return any(text in s for s in row["recipe"].get("recipe_function_settings") or [])


def bridge_needs(row: dict, tp: int, pp: int, vpp: int, ep: int) -> tuple[int, bool, str, str, list[Need], list[str]]:
    """(zero, sp, recompute, dtype, needs, assumptions) of a Megatron-Bridge row: its table's facts, then what its
    performance recipe (``recipe``: the preset's workload settings and the recipe function's assignments) sets
    beyond the stack profile, each a ``Need`` the harness counts."""
    rec, ws = row["recipe"], row["recipe"].get("workload_settings") or {}
    where = f"{rec.get('release')} {rec.get('workload_config') or rec.get('perf_matrix_entry')}"
    zero = int((row.get("layout_assumptions") or {}).get("zero", 1))
    dtype, fp8, note = bridge_precision(row)
    recompute, needs, rnote = bridge_recompute(row, pp)
    assumptions = [f"recipe {where} ({rec.get('match')}); zero={zero} ("
                   + ("table FSDP column: Megatron-FSDP optim_grads_params" if zero == 3 else
                      "library recipes' distributed optimizer") + f"); sp={tp > 1}"]
    assumptions += [a for a in (note, rnote) if a] + known_regressions(row)
    if fp8:
        needs.append(Need("fp8", fp8, f"table precision '{row['precision_recipe']}'", {}, stated=True))
    if ws.get("cutedsl_fused_grouped_mlp"):
        needs.append(Need("moe_fused_mlp", "true", "preset cutedsl_fused_grouped_mlp: Megatron-Core's fused grouped "
                          "MLP (use_transformer_engine_op_fuser, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1)", {}))
    graphs = BRIDGE_GRAPHS[bridge_cuda_graphs(row)]
    said = ws.get("cuda_graph_scope") or (rec.get("settings") or {}).get("cuda_graphs")
    if graphs != "none" or row.get("num_experts"):
        # implied where meshplan's free search takes the same (space.free_cuda_graphs: per-layer graphs on an MoE
        # model unless it recomputes in full), or where it prices nothing (a dense layer has no sync)
        from meshplan.planner.layout.layout import Layout
        from meshplan.planner.layout.space import free_cuda_graphs

        pinned = {nd.key: nd.value for nd in needs}
        probe = Layout(recompute="selective" if "recompute_modules" in pinned else (recompute or "none"),
                       recompute_modules=pinned.get("recompute_modules", ""),
                       offload_layers=int(pinned.get("offload_layers", 0)))
        free = free_cuda_graphs(probe) if row.get("num_experts") else graphs
        needs.append(Need("cuda_graphs", graphs, f"preset cuda_graph_impl {ws.get('cuda_graph_impl')!r}, scope "
                          f"{said!r}" + ("" if graphs != "layers" or "attn" in str(said) else
                                         ": the attention eager, its host time unpriced either way"), {},
                          implied=graphs == free or not row.get("num_experts")))
    if dtype == "fp8":  # the fp8 precision configs keep the weights in fp8 (the profile's fp8_params) unless the
        # recipe function turns it off (Kimi-K2 under dist_muon with MXFP8)
        off = _recipe_says(row, "fp8_param_gather = False")
        needs.append(Need("fp8_params", "false" if off else "true", "recipe function: fp8_param_gather = False"
                          if off else "fp8_param_gather = True in the release's fp8 precision configs", {}))
    if _recipe_says(row, "ddp.grad_reduce_in_fp32 = False"):
        needs.append(Need("grad_dtype", "bf16", "the model's common configs set ddp.grad_reduce_in_fp32 = False "
                          "(bf16 gradient buffers and reduction)", {}))
    if tp > 1 and not (dtype == "nvfp4" and _recipe_says(row, "tp_comm_overlap = False if precision == 'nvfp4'")):
        if _recipe_says(row, "tp_comm_overlap=True") or _recipe_says(row, "tp_comm_overlap=bool("):
            needs.append(Need("tp_overlap", "true", "CommOverlapConfig(tp_comm_overlap=True) in the recipe function",
                              {}))
        elif _recipe_says(row, "else cfg.comm_overlap.tp_comm_overlap") and row["model"] in LIBRARY_TP_COMM_OVERLAP:
            needs.append(Need("tp_overlap", "true", f"the perf recipe keeps the library recipe's tp_comm_overlap: "
                              f"{LIBRARY_TP_COMM_OVERLAP[row['model']]}", {}))
        elif rec.get("release") == "r0.1.0" and _r010_model(row) in R010_TP_COMM_OVERLAP:
            needs.append(Need("tp_overlap", "true", f"r0.1.0 scripts/performance/run_script.py: "
                              f"{R010_TP_COMM_OVERLAP[_r010_model(row)]}", {}))
    etp = ws.get("expert_tensor_parallel_size")
    if ep > 1 and etp and etp != tp:
        needs.append(Need("etp", str(etp), f"preset expert_tensor_parallel_size {etp}", None))
    if ep > 1 and ws.get("moe_a2a_overlap"):
        needs.append(Need("moe_overlap", "true", "preset moe_a2a_overlap: expert all-to-alls overlapped with the "
                          "other micro-batch's compute", {}))
    if ep > 1:  # no flex backend in the preset: Megatron's alltoall dispatcher; implied where meshplan's free
        # search takes the same (``space.free_dispatcher``: Hybrid-EP on Blackwell)
        backend = ws.get("moe_flex_dispatcher_backend")
        said = f"preset moe_flex_dispatcher_backend '{backend}'" if backend else "preset sets no flex backend: alltoall"
        value = backend or "alltoall"
        if (backend and _recipe_says(row, "moe_token_dispatcher_type = 'alltoall'")
                and not _recipe_says(row, "apply_flex_dispatcher_backend")
                and bridge_cuda_graphs(row) != "whole iteration"):
            # the recipe function sets the all-to-all last: Megatron-Core reads no flex backend then
            # (``planner.search.workloads.dispatcher_of``)
            said, value = f"{said}, but the recipe function sets moe_token_dispatcher_type = 'alltoall'", "alltoall"
        needs.append(Need("moe_dispatcher", value, said, {},
                          implied=value == free_dispatcher(get_device(row.get("system") or row["gpu"]))))
    if ws.get("fp8_dot_product_attention"):
        needs.append(Need("attention_dtype", "fp8", "preset fp8_dot_product_attention: Transformer Engine's fp8 "
                          "attention", {}))
    lay = bridge_pp_layout(row, pp, vpp)
    if lay:
        needs.append(lay)
    needs += _bridge_model_needs(row)
    return zero, tp > 1, recompute, dtype, needs, assumptions


# Kernel regressions a page footnote names, with what their own issue measured and whether meshplan prices them
KNOWN_REGRESSIONS = {
    "cudnn-frontend#256": "NVIDIA/cudnn-frontend issue 256: grouped_gemm_dglu_wrapper_sm100 (the MXFP8 grouped "
    "GEMM + dGLU + dbias kernel, the backward of the preset's cutedsl_fused_grouped_mlp) ran 10x slower from "
    "cudnn-frontend 1.24.0 on GB200-class GPUs; priced from the profile's pin of that release (cudnn_frontend=1.24: "
    "the kernel at PR #322's 1362.768 us against 155.632 us fixed, costmodel.cudnn_dglu)",
}


REGRESSION_NOTE = "page footnote names a known regression"  # how ``known_regressions`` begins its assumption lines


def known_regressions(row: dict) -> list[str]:
    """The assumption lines for the known kernel regressions a row's page footnotes name."""
    notes = row.get("notes") or ""
    return [f"{REGRESSION_NOTE}: {v}" for k, v in KNOWN_REGRESSIONS.items() if k in notes]


def _bridge_model_needs(row: dict) -> list[Need]:
    """What the model or task adds: DeepSeek-V3's and Nemotron 3 Super's MTP modules, Nemotron 3 Super's last layers
    kept in bf16 under NVFP4, 25.09's token dropping, Kimi-K2's Muon, SFT packing, LoRA."""
    needs = []
    if "(w/o MTP)" in row["model"]:  # the table's own label turns the recipe's MTP layer off
        needs.append(Need("mtp", "0", "the table's model label '(w/o MTP)'", {}, stated=True))
    if "(w/o MTP)" not in row["model"] and row["model"].startswith("DeepSeekV3"):
        needs.append(Need("mtp", "1", "Megatron-Bridge's DeepSeek-V3 recipe sets mtp_num_layers = 1 (the table's "
                          "TFLOP/s match with one MTP layer)", {}))
    if row["model"].startswith("Nemotron_3_Super"):
        needs.append(Need("mtp", "2", "Megatron-Bridge's Nemotron 3 Super recipe sets mtp_num_layers = 2 over its one "
                          "repeated MTP module (recipes/nemotronh/nemotron_3_super.py line 94, v0.4.0 to v0.5.1; the "
                          "table's TFLOP/s per token, 85.0-85.4 G, match two MTP passes: 84.9 G); it keeps the MTP "
                          "block in bf16 (keep_mtp_spec_in_bf16), priced at the row's precision", {}))
    if row["model"].startswith("Nemotron_3_Super") and bridge_precision(row)[0] == "nvfp4":
        needs.append(Need("bf16_last_layers", "14", "the perf scripts' Nemotron 3 Super NVFP4 precision "
                          "(nemotron_3_super_bf16_with_nvfp4_mixed, training/mixed_precision.py v0.4.0 to v0.5.1; "
                          "v0.4.0 set it in scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py): "
                          "first_last_layers_bf16 with num_layers_at_end_in_bf16 = 14; its te_quant.cfg module "
                          "overrides (attention and latent projections in bf16, Mamba out_proj in MXFP8) are not "
                          "priced", {}))
    if "(tokendrop)" in row["model"]:  # 25.09 = r0.1.0, whose run_script.py set these for the token-drop runs (its
        # profile carries them by model and GPU: a row whose profile agrees counts them from the profile)
        needs.append(Need("moe_capacity", "1", "25.09 '(tokendrop)': scripts/performance/run_script.py @ r0.1.0 "
                          "lines 80 / 109 / 116 apply_moe_token_drop (training/utils/moe_token_drop.py lines 20-21: "
                          "capacity factor 1.0, padded to capacity)", {}))
        if row["model"].startswith("DeepSeekV3"):
            needs.append(Need("shared_overlap", "true", "run_script.py @ r0.1.0 line 89: moe_shared_expert_overlap = "
                              "True on B200 / GB200", {}))
            needs.append(Need("recompute_modules", "mla_up_proj", "run_script.py @ r0.1.0 lines 93 / 96: "
                              "recompute_modules = ['mla_up_proj']", {"recompute": "none"}))
    if row["model"].startswith("Kimi"):
        needs.append(Need("optimizer", "muon", "'Muon optimizer was used for pre-training Kimi-K2': meshplan prices "
                          "Adam's states and step", {}))
    if row.get("task") == "sft":
        needs.append(Need("packing", "per-document attention", "packed sequences (packed_sequence_size = seq): "
                          "attention spans each packed document, not the whole sequence", {}))
    return needs


def bridge_lora(row: dict) -> str:
    """``--lora`` of a Megatron-Bridge LoRA row, a fact of its task (the table's PEFT section): rank 16
    (``llama3_70b_peft_config``: "70B uses dim=16") on the modules the performance recipe targets
    (``cfg.peft.target_modules = ['linear_qkv']``), else LoRA's default four."""
    if row.get("task") != "lora":
        return ""
    targets = "qkv" if _recipe_says(row, "target_modules = ['linear_qkv']") else ""
    return "16" + (f":{targets}" if targets else "")


def _nemo_needs(row: dict, src: str, tp: int, pp: int, cp: int, vpp: int) -> tuple:
    """(zero, sp, recompute, dtype, needs, assumptions, vpp) of a NeMo 24.07 row (S1, S1f): Megatron-Core +
    Transformer Engine in fp8, as the launcher confs and the SFT example scripts at tag 24.07 set it up."""
    needs: list[Need] = []
    assumptions: list[str] = []
    conf, recompute, ub, optim_dtype, grad_dtype, p2p = NEMO_CONF[row["model"].split(" (")[0]]
    zero, sp = 1, tp > 1
    dtype = "fp8"  # the table's "at FP8 precision": meshplan's fp8 workload (linear GEMMs in fp8, TE's recipe)
    if src == "S1f":  # conf/peft/llama/sft.yaml: optim.dtype bf16, grad_sync_dtype bf16
        optim_dtype, grad_dtype = "bf16", "bf16"
    assumptions.append(f"launcher conf {conf}.yaml @ NeMo-Framework-Launcher 24.07: distributed_fused_adam "
                       f"(apex: optimizer states sharded, whole contiguous grad buffer) -> zero=1, "
                       f"optim_dtype={optim_dtype}, grad_dtype={grad_dtype}; sp={sp}; recompute={recompute}")
    needs.append(Need("optim_dtype", optim_dtype, "apex DistributedFusedAdam as NeMo r2.0.0rc1 sets it up "
                      "(store_param_remainders for an fp32 optimizer over bf16 weights; optim.dtype bf16: the "
                      "bf16 weights are the master)", {}))
    needs.append(Need("grad_dtype", grad_dtype, "apex grad_sync_dtype (launcher conf / fp8 example script; "
                      "default: the optimizer dtype)", {}))
    if src == "S1f":
        vpp = NEMO_SFT_VP[row["model"].split(" (")[0]]
        p2p = vpp > 1  # the example scripts of the interleaved SFT runs set overlap_p2p_comm=true
        assumptions.append(f"finetuning table has no VP/CP column: cp=1, vpp={vpp} from the launcher's SFT "
                           "example at tag 24.07")
        needs.append(Need("packing", "per-document attention", "SQuAD packed to 4096 tokens: attention spans "
                          "each packed document, not the whole sequence", {}))
        needs.append(Need("fp8_params", "true", "weights held as fp8 tensors (++peft.model.fp8_params=true) with "
                          "a bf16 master shard in the optimizer (NeMo: store_params=True): meshplan drops the "
                          "16-bit weights and counts the bf16 optimizer at 4/dp B, where NeMo keeps 6/dp B",
                          {}))
    needs.append(Need("fp8", "delayed", "TE DelayedScaling, HYBRID (E4M3 fwd / E5M2 bwd), amax history 1024: "
                      "linear GEMMs in fp8, attention and optimizer in bf16/fp32", {"dtype": "fp8"}))
    needs.append(Need("stack", "megatron", "Megatron-Core + TE fused kernels", {}))
    needs.append(Need("attention", "flash2", "the launcher's env_vars export NVTE_FUSED_ATTN=0 ('Disable cudnn FA "
                      "until we've tested it more', launcher_scripts/conf/config.yaml @ 24.07): TE's "
                      "DotProductAttention skips cuDNN fused attention and runs FlashAttention-2", {}))
    if pp > 1 and vpp > 1:
        needs.append(Need("pp_overlap", str(p2p).lower(), f"overlap_p2p_comm: {p2p} ({conf}.yaml or the SFT "
                          "example script at tag 24.07; NeMo's default False)", {},
                          implied=p2p))  # overlapped is Megatron-Core's own in the interleaved schedule
    if ub:
        needs.append(Need("tp_overlap", "true", "ub_tp_comm_overlap: TP collectives overlapped with the GEMMs "
                          "(Transformer Engine userbuffers)", {}))
    if cp > 1:
        needs.append(Need("cp_kind", "ring", "Megatron-Core/TE context parallel, cp_comm_type p2p", {},
                          implied=True))
    return zero, sp, recompute, dtype, needs, assumptions, vpp


def states_fake_gate(row: dict) -> bool:
    """Whether the row's publication says its runs route through NeMo AutoModel's fake balanced gate (the
    AutoModel performance summary: 'Fake balanced gate is enabled'), which sends a token's copies to adjacent
    experts (``moe_router=contiguous``)."""
    return "fake balanced gate is enabled" in str((row.get("published") or {}).get("source", "")).lower()


AUTOMODEL_KERNEL_WORDS = (("FlexAttn", "attention", "flex"), ("TorchSDPA", "attention", "flash2"),
                          ("DeepEP", "moe_dispatcher", "deepep"))
"""The Kernel Optimizations cell of AutoModel's table, in meshplan's words: FlexAttention; PyTorch SDPA, whose first
backend is its FlashAttention-2 kernel (``torch._C._get_sdp_priority_order``); DeepEP's dispatch."""


def automodel_table_facts(row: dict) -> dict:
    """What an AutoModel table row states beyond its degrees and batch, as a row of a source without a mapping states
    it: its FSDP column (a size above 1: FSDP2's fully_shard, zero=3), its Kernel Optimizations cell
    (``AUTOMODEL_KERNEL_WORDS``) and, on a pipelined row, its GA column: the table's own arithmetic, GBS = LBS x GA x
    the data-parallel size with LBS the micro-batches of one pipeline schedule (DeepSeek-V3 on 1,024 GPUs: 8,192 = 8 x
    4 x 256 at PP 4), makes GA the schedule's runs per step (``pp_runs``); {} for a row of any other table."""
    header = str((row.get("published") or {}).get("location", ""))
    if "| FSDP |" not in header or "Kernel Optimizations" not in header:
        return {}
    names = [c.strip() for c in header.split("header", 1)[1].strip().strip("|").split("|")]
    cells = dict(zip(names, _quote_cells(row)))
    out = {"zero": 3} if cells.get("FSDP", "-").isdigit() and int(cells["FSDP"]) > 1 else {}
    if cells.get("PP", "1").isdigit() and int(cells["PP"]) > 1 and cells.get("GA", "1").isdigit() \
            and int(cells["GA"]) > 1:
        out["pp_runs"] = int(cells["GA"])
    kernels = cells.get("Kernel Optimizations", "")
    for word, key, value in AUTOMODEL_KERNEL_WORDS:
        if word in kernels and key not in out:
            out[key] = value
    return out


def _automodel_needs(row: dict, dp: int, tp: int, pp: int, cp: int, ep: int, profile_only: bool = False) -> tuple:
    """(zero, sp, recompute, needs, assumptions) of a NeMo AutoModel row (S5): FSDP2 + TE kernels + DeepEP, bf16."""
    name, la = row["name"], row.get("layout_assumptions") or {}
    needs: list[Need] = []
    assumptions: list[str] = []
    zero, sp = 3, False
    if name in AUTOMODEL_RUN_ZERO2 and not profile_only:  # the run's own code and config, not the profile's
        zero = 2
        assumptions.append(f"zero=2: {AUTOMODEL_RUN_ZERO2[name]}")
    said = str(la.get("recompute", row.get("recompute") or ""))
    # the source's config states activation checkpointing for some rows; where it says nothing (recompute
    # null), meshplan chooses (a free decision), as a user planning that run would let it
    recompute = "full" if said.startswith("full") else ("none" if said or "false" in row.get("notes", "")
                                                          else None)
    if recompute is None and name in AUTOMODEL_RUN_AC:
        recompute, where = AUTOMODEL_RUN_AC[name]
        assumptions.append(f"recompute={recompute}: {where}")
    assumptions.append(f"FSDP2 = zero={zero} over the FSDP size {dp}; recompute="
                       f"{recompute or 'not stated: chosen by meshplan'}")
    if "ep" in la:
        assumptions.append(f"ep={ep} (table '-', config ep_size)")
    if name in AUTOMODEL_RUN_MTP:
        depths, where = AUTOMODEL_RUN_MTP[name]
        needs.append(Need("mtp", depths, where, {}))
    if name in AUTOMODEL_RUN_LINEAR_CE:
        needs.append(Need("linear_ce", "true", AUTOMODEL_RUN_LINEAR_CE[name], {}))
    kernels = _quote_cells(row)[13]
    needs.append(Need("fsdp", "torch", "AutoModel shards with torch FSDP2 fully_shard (components/moe/"
                      "parallelizer.py apply_fsdp, components/distributed/parallelizer.py @ 89e3a9fdd), not "
                      "Megatron-FSDP", {}))
    needs.append(Need("stack", "megatron" if "TE" in kernels else "torchtitan",
                      f"AutoModel, Kernel Optimizations '{kernels}': FSDP2 with Transformer Engine's "
                      "kernels (fused norms, SwiGLU, parallel cross-entropy) = meshplan's megatron kernel set",
                      {}))
    stated = automodel_table_facts(row)
    if pp > 1:
        needs.append(Need("pp_overlap", "false", "torch.distributed.pipelining's interleaved schedule "
                          "(PipelineScheduleMulti._step_microbatches) waits for each time step's batched sends "
                          "and receives (_wait_batch_p2p(_batch_p2p(ops))) before the next compute", {}))
    if stated.get("pp_runs"):  # each gradient-accumulation step runs the whole pipeline schedule once
        ga = stated["pp_runs"]
        needs.append(Need("pp_runs", str(ga), f"table GA {ga}: AutoModel's benchmark loop (recipes/llm/"
                          "benchmark.py @ 89e3a9fdd) calls _forward_backward_step per GA step, which runs "
                          "schedule.step on its local batch (recipes/llm/train_ft.py): one pipeline fill and "
                          "drain, one FSDP gather and reduce-scatter per run", {}, stated=True))
    if cp > 1:  # HF model with sdpa under torch's context_parallel, rotate method "allgather"
        needs.append(Need("cp_kind", "allgather", "torch context_parallel, cp_rotate_method='allgather' "
                          "(AutoModel components/distributed/cp_utils.py @ e45812012)", {}, implied=True))
    if stated.get("attention"):  # TorchSDPA's flash2: the backend order of meshplan's torch (the run's: unstated)
        needs.append(Need("attention", stated["attention"], f"Kernel Optimizations '{kernels}' "
                          "(AUTOMODEL_KERNEL_WORDS)", {}, stated=True))
    elif cp > 1:
        needs.append(Need("attention", "flash2", "torch context_parallel runs PyTorch SDPA (flash backend: "
                          "FlashAttention-2), not TE attention", {}))
    if row.get("num_experts"):
        needs.append(Need("etp", "1", "expert tensor parallel 1 (TP 1)", {}, implied=True))
        # AutoModel's own MoE models are cast whole to bf16 at initialisation (initialize_weights(dtype=
        # torch.bfloat16) ends in self.to(dtype): components/models/{deepseek_v3,qwen3_moe,gpt_oss}/model.py
        # @ 89e3a9fdd, called by components/checkpoint/checkpointing.py) and the configs' optimizer is
        # torch.optim.Adam, whose moments take the parameter's dtype: bf16 moments, the bf16 weights their own
        # master (4 B per parameter)
        needs.append(Need("optim_dtype", "bf16", "bf16 model under torch.optim.Adam (AutoModel @ 89e3a9fdd)",
                          {}))
        if stated.get("moe_dispatcher"):
            needs.append(Need("moe_dispatcher", stated["moe_dispatcher"], f"Kernel Optimizations '{kernels}'", {}))
        # AutoModel's MoE apply_fsdp shards the blocks with MixedPrecisionPolicy(param_dtype=bf16,
        # reduce_dtype=float32) (components/moe/parallelizer.py @ 89e3a9fdd): dense gradients reduced in fp32;
        # the routed experts' own fully_shard over the expert-shard mesh takes no policy: bf16
        needs.append(Need("reduce_dtype", "fp32", "AutoModel MoE apply_fsdp: MixedPrecisionPolicy(reduce_dtype="
                          "torch.float32)", {}))
        if (dp * cp * tp) // ep > 1:
            needs.append(Need("expert_reduce_dtype", "bf16", f"the routed experts' FSDP over "
                              f"{(dp * cp * tp) // ep} ranks reduces in bf16 (fully_shard without mp_policy); "
                              "meshplan prices every gradient at the one reduce_dtype, fp32", {}))
        if states_fake_gate(row):
            needs.append(Need("moe_router", "contiguous", "the table's 'Fake balanced gate is enabled': AutoModel's "
                              "FakeBalancedGate sends token t to experts t*topk .. t*topk+topk-1 (components/moe/"
                              "layers.py @ 89e3a9fdd)", {}, stated=True))
        needs.append(Need("moe_overlap", "false", "DeepEP's normal dispatch/combine kernels, not overlapped "
                          "with another micro-batch's compute (no DualPipe in AutoModel)", {}, implied=True))
        if row.get("shared_experts"):
            needs.append(Need("shared_overlap", "true", "AutoModel MoE.forward runs the shared experts on a side "
                              "stream during the routed experts' dispatch and combine (components/moe/layers.py "
                              "@ 89e3a9fdd: 'Execute shared experts in a separate stream to overlap compute "
                              "with the communication for grouped experts')", {}))
    else:  # a dense model under FSDP2Manager: its default policy reduces in bf16
        needs.append(Need("reduce_dtype", "bf16", "AutoModel FSDP2Manager's default MixedPrecisionPolicy("
                          "reduce_dtype=torch.bfloat16) (components/distributed/config.py @ 2013a4dd6, where the "
                          "row entered the table; its config sets no mp_policy)", {}))
    return zero, sp, recompute, needs, assumptions


TORCHTITAN_HBM2E_DEVICE = "H100-SXM-96GB-500W"  # the catalogue's 500 W HBM2e part (costmodel/data/devices.yaml)


def torchtitan_recompute(row: dict) -> str:
    """``--fix recompute`` of a torchtitan row's activation checkpointing (``TORCHTITAN_FACTS`` ``ac``): op-level
    (``op``), every second layer whole (selective layer AC, ``full:L/2``) or every layer (``full``)."""
    ac = TORCHTITAN_FACTS[row["name"]]["ac"]
    return {"op": "op", "layer": f"full:{row['layers'] // 2}"}.get(ac, "full")


def _torchtitan_needs(row: dict, n: int, dp: int, tp: int, device: str) -> tuple:
    """(zero, sp, recompute, needs, assumptions, device) of a torchtitan row (T): FSDP2 (+TP), bf16."""
    name = row["name"]
    needs: list[Need] = []
    assumptions: list[str] = []
    facts = TORCHTITAN_FACTS[name]
    zero, sp = 3, tp > 1  # torchtitan's TP plan shards the norms with SequenceParallel (parallelize_llama.py)
    assumptions.append(f"{TORCHTITAN_DOCS[facts['doc']]}, {facts['table']}: {facts['quote']}")
    assumptions.append(f"FSDP2 = zero=3 over dp={dp}; n_gpus {n} from the source")
    recompute = "full" if facts["ac"] == "full" else "selective"
    if facts["ac"] != "full":
        why = ("torchtitan selective_ac_option='op': saves matmul outputs except every second mm, and SDPA"
               if facts["ac"] == "op" else
               "torchtitan selective layer AC (selective_ac_option='2'): every second layer fully checkpointed")
        needs.append(Need("recompute", torchtitan_recompute(row), why, {"recompute": "selective"}, stated=True))
    needs.append(Need("reduce_dtype", "fp32", "torchtitan reduces gradients in fp32, its only choice "
                      "(config_manager.py, 2024: --training.mixed_precision_reduce default float32, choices "
                      "['float32']; FSDP2 MixedPrecisionPolicy.reduce_dtype)", {}))
    needs.append(Need("stack", "torchtitan" if facts["compile"] else "eager",
                      "FSDP2 + torch.compile" if facts["compile"] else
                      "FSDP2 without torch.compile: torchtitan's pure-PyTorch RMSNorm, SwiGLU and complex RoPE "
                      "run one kernel per op", {}, stated=True))
    if facts.get("device"):
        device = TORCHTITAN_HBM2E_DEVICE
        assumptions.append(f"device {facts['device']} -> {device}" + (
            "" if "500" in facts["device"] else " (doc A says 'lower TDP' without the figure: taken as the "
            "500 W part of doc B)"))
    return zero, sp, recompute, needs, assumptions, device


# A source the harness has no mapping of its own for (a run kept apart from the dev set, from any publication) is
# priced from what its row states alone: model config, GPU, GPUs per node and NVLink domain, the degrees, batch,
# sequence, precision and, where the row gives them, ZeRO stage, recomputation and sequence parallelism; the rest is
# left to meshplan's search under the row's ``stack`` profile (``name`` or ``name@version``), else this default.
STATED_DEFAULT_STACK = "megatron-bridge"
# What a row's precision words say of its fp8 recipe, first match wins (none: the stack profile's own recipe)
STATED_FP8_RECIPE = (("mxfp8", "mxfp8"), ("fp8-mx", "mxfp8"), ("fp8-cs", "tensorwise"),
                     ("current scaling", "tensorwise"), ("tensorwise", "tensorwise"), ("delayed", "delayed"),
                     ("blockwise", "blockwise"))
# What a row of such a source must state to be priced (``n_gpus`` or ``dp``, and a published step time or throughput,
# are checked apart), and which of them are counts
STATED_FIELDS = ("name", "source_id", "gpu", "tp", "pp", "cp", "mbs", "gbs", "seq", "dtype", "config", "published")
STATED_COUNTS = ("tp", "pp", "cp", "mbs", "gbs", "seq", "n_gpus", "dp", "ep", "pp_interleave", "layers",
                 "gpus_per_node", "nvlink_domain", "num_experts")


def stated_row_problem(row: dict) -> str:
    """Why a row of a source without its own mapping cannot be priced ("" when it can): the facts it lacks, those
    that are not what they must be (positive counts and figures, a config path or preset name), and GPU counts that
    do not add up. Its ZeRO stage, sequence parallelism and recomputation may be free text, as the dev set's own rows
    hold them (``_stated_needs`` reads them where they are meshplan's words and says which it did not)."""
    lacks = [f for f in STATED_FIELDS if row.get(f) in (None, "")]
    if not (row.get("n_gpus") or row.get("dp")):
        lacks.append("n_gpus (or dp)")
    pub = row.get("published")
    if isinstance(pub, dict) and not (pub.get("step_time_s") or pub.get("tokens_per_s_per_gpu")):
        lacks.append("published.step_time_s (or published.tokens_per_s_per_gpu)")
    if lacks:
        return f"row lacks {', '.join(lacks)}"
    bad = [f"{f}={row[f]!r}" for f in STATED_COUNTS if row.get(f) is not None and not _positive(row[f], int)]
    bad += [f"published={pub!r}"] if not isinstance(pub, dict) else [
        f"published.{k}={pub[k]!r}" for k in ("step_time_s", "tokens_per_s_per_gpu")
        if pub.get(k) is not None and not _positive(pub[k], (int, float))]
    bad += [] if isinstance(row["config"], str) else [f"config={row['config']!r}"]
    if bad:
        return f"row has {', '.join(bad)}: not what the field holds"
    return _stated_counts_problem(row)


def _positive(value, kinds) -> bool:
    return isinstance(value, kinds) and not isinstance(value, bool) and value > 0


def _stated_counts_problem(row: dict) -> str:
    """Where a row's GPU counts do not add up: tp x pp x cp not dividing its GPUs, a stated dp against them, GPUs
    that do not fill whole nodes."""
    n, model_par = n_gpus_of(row), row["tp"] * row["pp"] * row["cp"]
    if n % model_par:
        return f"row's tp*pp*cp = {model_par} does not divide its {n} GPUs"
    if row.get("dp") and row.get("n_gpus") and row["dp"] != n // model_par:
        return f"row's dp={row['dp']} is not n_gpus / (tp*pp*cp) = {n} / {model_par}"
    gpn = row.get("gpus_per_node")
    if gpn and n > gpn and n % gpn:
        return f"row's {n} GPUs do not fill whole nodes of gpus_per_node={gpn}"
    return ""


def is_stated_row(row: dict) -> bool:
    """Whether a row comes from a source without a mapping of its own here (priced by ``_stated_needs``)."""
    return not is_bridge_row(row) and row.get("source_id") not in SOURCE_PROFILE


def _config_spec(cfg: str):
    """The model config ``cfg`` as meshplan loads it (a row that does not state its layers or experts)."""
    from meshplan.planner.model.config import load_model

    return load_model(cfg)


def stated_device(row: dict) -> str:
    """The catalogued device a row's ``device`` names, else the one its ``gpu`` text names: runs of up to three of
    its words looked up, the longest runs that name one winning ('A100 40GB' -> A100-40GB, not A100's 80 GB part;
    'GB300 (DGX-GB300, NVL72)' -> GB300); a clear error where none, or two different ones, match."""
    if row.get("device"):
        return get_device(str(row["device"])).name
    words = [w for w in re.split(r"[\s(),/;]+", str(row["gpu"])) if w]
    found: set = set()
    for n in (3, 2, 1):
        for i in range(len(words) - n + 1):
            try:
                found.add(get_device("-".join(words[i:i + n])).name)
            except MeshplanError:
                continue
        if found:
            break
    if len(found) != 1:
        what = f"names {' and '.join(sorted(found))}" if found else "names no catalogued device (meshplan devices)"
        raise MeshplanError(f"row {row['name']}: gpu '{row['gpu']}' {what}; state one in the row's 'device'")
    return found.pop()


def stack_lora(profile: str, cfg: str) -> tuple[str, str]:
    """(``--lora`` text, why) of a LoRA row that states no rank: the adapters stack profile ``profile`` trains by
    default for ``cfg``'s model (``planner.search.workloads.lora_default``, as ``meshplan plan --task lora`` takes
    them).

    Raises:
        MeshplanError: the profile states none (the row is then not expressible, saying so).
    """
    from meshplan.planner.layout.stacks import load_stacks
    from meshplan.planner.search.workloads import lora_default

    found = lora_default(load_stacks().get(profile), _config_spec(cfg))
    if found is None:
        raise MeshplanError(f"its task is LoRA and it states no rank, nor does stack profile {profile} (name it as "
                            "meshplan plan --lora takes it: rank[:targets])")
    return found.value, f"lora={found.value}: stack profile {profile}'s LoRA default ({found.source})"


def stated_profile(row: dict) -> str:
    """The stack profile a row of a source without its own mapping is priced with: its ``stack`` (a profile's name,
    its newest version, or ``name@version``), else ``STATED_DEFAULT_STACK``'s newest."""
    from meshplan.planner.layout.stacks import load_stacks

    return load_stacks().get(str(row.get("stack") or STATED_DEFAULT_STACK)).ref


# Decisions a row of a source without a mapping may state by name (``meshplan plan --fix`` words): the router its
# publication names (AutoModel's fake balanced gate), the attention kernel, the MoE dispatcher and the pipeline
# schedule's runs per step (AutoModel's GA column)
STATED_DECISIONS = ("moe_router", "attention", "moe_dispatcher", "pp_runs")


def _stated_needs(row: dict, tp: int) -> tuple:
    """(zero, sp, recompute, dtype, needs, assumptions, device) of a row from a source the harness has no mapping
    for: each decision the row states, as a stated need; what it leaves out stays ``None`` (left to the search)."""
    device = stated_device(row)
    dtype = str(row["dtype"]).lower()
    needs: list[Need] = []
    said = {k: row[k] for k in ("zero", "sp", "recompute") if row.get(k) is not None}
    zero = said.get("zero") if said.get("zero") in (0, 1, 2, 3) and not isinstance(said.get("zero"), bool) else None
    sp = said.get("sp") if isinstance(said.get("sp"), bool) else (False if tp == 1 else None)
    ac = said.get("recompute")
    recompute = ac if isinstance(ac, str) and meshplan_accepts("recompute", ac) else None
    words = str(row.get("precision_recipe") or "").lower()
    recipe = next((r for word, r in STATED_FP8_RECIPE if word in words), "") if dtype == "fp8" else ""
    if recipe:
        needs.append(Need("fp8", recipe, f"the row's precision '{row['precision_recipe']}'", {}, stated=True))
    read = {"zero": zero, "sp": sp, "recompute": recompute}
    if isinstance(row.get("compile"), bool):  # torchtitan's --training.compile, read under its profiles alone
        said["compile"] = row["compile"]
        if stated_profile(row).startswith("torchtitan@"):
            kernels = "torchtitan" if row["compile"] else "eager"
            needs.append(Need("stack", kernels, f"the row's torch.compile {'on' if row['compile'] else 'off'} "
                              "(torchtitan --training.compile)", {}, stated=True))
            read["compile"] = row["compile"]
        else:
            read["compile"] = None
    for key in STATED_DECISIONS:  # a kernel or dispatcher the row names, in meshplan's words
        value = row.get(key)
        if value is not None and not meshplan_accepts(key, str(value)):
            said[key], value = value, None  # named unread below
        if value:
            needs.append(Need(key, str(value), f"the row's {key} '{value}'", {}, stated=True))
        read[key] = value
    facts = [f"{k}={v}" for k, v in read.items() if v is not None]
    facts += [f"{k}={row[k]}" for k in ("gpus_per_node", "nvlink_domain") if row.get(k)]
    unread = [f"{k}={v!r}" for k, v in said.items() if read[k] != v]
    stated_facts = ", ".join(facts) or "no ZeRO stage, sequence parallelism or recomputation"
    assumptions = [f"a source without a mapping of its own: priced from what its row states ({stated_facts}), the "
                   f"rest left to the search; device {device} from gpu '{row.get('device') or row['gpu']}'"
                   + (f"; not meshplan's words, so not read: {', '.join(unread)}" if unread else "")]
    return zero, sp, recompute, dtype, needs, assumptions, device


def stated_cluster(row: dict, n_gpus: int, device: str) -> tuple[str, str]:
    """(cluster, how the job was spread over racks where the row does not say) of a row without its own mapping:
    its ``gpus_per_node`` and ``nvlink_domain``, else a GB200 / GB300 part's NVL72 rack of 4-GPU trays (the
    NVLink domain those parts ship in as DGX systems; ``bridge_cluster`` spreads a job over the fewest racks) or 8
    GPUs per node in a domain of its node."""
    rack = get_device(device).family.endswith("nvl72")
    gpn = min(n_gpus, row.get("gpus_per_node") or (4 if rack else 8))  # a job inside one node: its GPUs of it
    if n_gpus % gpn:
        raise MeshplanError(f"row {row['name']}: its {n_gpus} GPUs do not fill whole nodes of {gpn} {device}s; state "
                            "its gpus_per_node")
    domain = row.get("nvlink_domain") or (72 if rack else gpn)
    return bridge_cluster({"system": device, "gpus_per_node": gpn, "nvlink_domain": domain}, n_gpus)[:2]


def _resolve(needs: list[Need], stack_sets: dict, fix: dict, device: str, dtype: str,
             profile_only: bool = False) -> tuple:
    """(approximated, missing, from_profile, per_row, device, dtype): each need the stack profile sets already, each
    one ``--fix`` takes (added to ``fix``, a per-row setting unless implied or stated), and each meshplan cannot
    express, priced by its fallback (which may change the device or the dtype) or missing. ``profile_only``: a
    per-row setting is not pinned but left to meshplan (listed in ``per_row`` all the same)."""
    approximated, missing, from_profile, per_row = [], [], [], []
    for nd in needs:
        if meshplan_accepts(nd.key, nd.value) and stack_sets.get(nd.key) == nd.value:
            from_profile.append(f"{nd.key}={nd.value}")
        elif meshplan_accepts(nd.key, nd.value):
            counted = not (nd.implied or nd.stated)
            if profile_only and counted and nd.key not in TASK_FACTS:
                fix.pop(nd.key, None)  # left to the search, not to the harness's own default (attention="flash")
            else:
                fix[nd.key] = nd.value
            if counted:
                per_row.append(f"{nd.key}={nd.value}: {nd.why}")
        elif nd.fallback is None:
            missing.append(nd)
        else:
            fb = dict(nd.fallback)
            device = fb.pop("device", device)
            dtype = fb.pop("dtype", dtype)
            fix.update(fb)
            if not nd.implied:
                approximated.append(nd)
    return approximated, missing, from_profile, per_row, device, dtype


# Per-row settings that say what the job trains rather than how it is laid out: MTP modules, token dropping and
# layers kept in bf16 under a low-precision recipe. ``--profile-only`` keeps them pinned (the search would price a
# different job without them: it never adds MTP modules), as it keeps LoRA.
TASK_FACTS = frozenset({"mtp", "moe_capacity", "bf16_last_layers"})

# Sources whose tables state the run's activation recomputation (torchtitan's performance.md gives each row's
# activation checkpointing); the others' comes from launch files, which ``--profile-only`` does not read
RECOMPUTE_IN_TABLE = frozenset({"T"})


def row_needs(row: dict, runs_dir: Path, profile_only: bool = False) -> RowInputs:
    """Map one dev-set row to meshplan's inputs: the one function later issues extend.

    The layout the source states is pinned as is; what it leaves unsaid comes from the stack's launch files
    (NeMo launcher confs, AutoModel / torchtitan configs) and is listed under ``assumptions``. ``profile_only``:
    the row as a run meshplan has never seen is priced, from its table's facts and its stack profile alone: every
    per-row decision is left to meshplan's search (still listed in ``per_row``) but what the job trains
    (``TASK_FACTS``), and so is recomputation where the table does not state it (``RECOMPUTE_IN_TABLE``). The cluster
    stays as ``bridge_cluster`` gives it: how a job's GPUs sat in racks is the allocation meshplan is handed, not a
    decision it makes (packed 72 to a rack, 256 GPUs would split EP 64 groups over the racks' InfiniBand).
    """
    src, name = row["source_id"], row["name"]
    if name in HYBRID_CONFIGS:  # hybrid Mamba rows: the row names no config; the Blackwell set's (README B1)
        from meshplan.planner.model.config import load_model

        spec = load_model(_config_path({"config": HYBRID_CONFIGS[name]}, runs_dir))
        row = {**row, "config": HYBRID_CONFIGS[name], "meshplan_can_express": "yes",
               "num_experts": spec.num_experts, "layers": spec.num_layers}
    n = n_gpus_of(row)
    step = published_step_s(row)
    can = row.get("meshplan_can_express", "yes")
    if isinstance(can, str) and can.startswith("no"):
        return RowInputs(name, src, None, "", row["gbs"], row["seq"], "", {}, n, step, out_of_scope=can)
    la = row.get("layout_assumptions") or {}
    tp, pp, cp = row["tp"], row["pp"], row["cp"]
    dp = n // (tp * pp * cp)
    vpp = row.get("pp_interleave") or 1
    ep = row.get("ep") or la.get("ep") or 1
    gpu = row["gpu"]
    device = "A100-80GB" if "A100" in gpu else "H100"
    dtype = "bf16"
    if is_bridge_row(row):
        zero, sp, recompute, dtype, needs, assumptions = bridge_needs(row, tp, pp, vpp, ep)
    elif src in ("S1", "S1f"):
        zero, sp, recompute, dtype, needs, assumptions, vpp = _nemo_needs(row, src, tp, pp, cp, vpp)
    elif src == "S5":
        zero, sp, recompute, needs, assumptions = _automodel_needs(row, dp, tp, pp, cp, ep, profile_only)
    elif src == "T":
        zero, sp, recompute, needs, assumptions, device = _torchtitan_needs(row, n, dp, tp, device)
    else:
        zero, sp, recompute, dtype, needs, assumptions, device = _stated_needs(row, tp)
    if vpp > 1:
        needs.append(Need("schedule", "interleaved", f"interleaved 1F1B, {vpp} virtual stages", {}, implied=True))
    stated = is_stated_row(row)
    cfg = _config_path(row, runs_dir)
    spec = _config_spec(cfg) if stated else None
    L = row.get("layers") or spec.num_layers
    is_moe = bool(row.get("num_experts")) or bool(spec and spec.is_moe)
    profile = SOURCE_PROFILE.get(src) or (stated_profile(row) if stated else bridge_profile(row))
    task = row_task(row)
    if ep > 1 and (dp * cp) % ep and not any(nd.key == "etp" for nd in needs):
        needs.append(Need("etp", "1", f"ep={ep} over dp={dp} x cp={cp}: the expert mesh folded independently of "
                          "the dense mesh (MoE parallel folding)", None))
    if cfg and "approx" in cfg:
        needs.append(Need("arch", Path(cfg).stem, row.get("notes", "").split("arch approx for meshplan: ")[-1], {}))
    dp_shard = dp if zero else 1
    fix = dict(dp=dp, dp_replicate=dp // dp_shard, dp_shard=dp_shard, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep,
               mbs=la.get("mbs") or row["mbs"], zero=zero, recompute=recompute, sp=sp, attention="flash")
    for key, said in (("recompute", recompute), ("zero", zero), ("sp", sp)):
        if said is None:  # unstated (a source without its own mapping): the search's
            del fix[key]
    if zero is None:
        del fix["dp_replicate"], fix["dp_shard"]
    if stated and row.get("ep") is None:  # a source that does not say its expert parallelism leaves it to the search
        del fix["ep"]
    if (stated or is_bridge_row(row)) and row.get("pp_interleave") is None and pp > 1:
        # nor its virtual pipeline stages (no VP column, or a Megatron-Bridge table's 'n/a' on a pipelined row):
        # the search's, or the launcher's workload preset's
        del fix["vpp"]
    pinned_fp8 = next((nd.value for nd in needs if nd.key == "fp8"), "")
    gpn = row.get("gpus_per_node") or 8
    cluster, spread, placed = f"{n // gpn}x{gpn}x{device}", "", False
    if is_bridge_row(row):
        cluster, spread, placed = bridge_cluster(row, n, profile)
    elif stated:
        cluster, spread = stated_cluster(row, n, device)
    lora = bridge_lora(row) if is_bridge_row(row) else (str(row.get("lora") or "") if stated else "")
    lora_why = ""
    if stated and row.get("task") == "lora" and not lora:  # a LoRA table that states no rank: the stack's own
        lora, lora_why = stack_lora(profile, cfg)
    stack_sets, preset, preset_sets = _stack_sets(profile, cfg, dtype, is_moe, task, pinned_fp8, fix,
                                                  (cluster, row["gbs"], n, bool(lora)))
    if fix.get("recompute") is not None and preset_sets.get("recompute") == fix["recompute"]:
        del fix["recompute"]  # the preset's, with its module list (a pinned kind would drop the profile's list)
    elif ("recompute" in stack_sets and "recompute" not in preset_sets
          and str(row.get("recompute") or "").startswith("none stated")):
        del fix["recompute"]  # the recipe states none; what its launcher sets (the profile's) holds
    if "attention" in stack_sets or stated:
        del fix["attention"]  # the stack's attention kernel is the profile's (or, unstated, the search's)
    if (L % pp or (vpp > 1 and L % (pp * vpp))) and not any(nd.key == "pp_layout" for nd in needs) and not (
            "pp_layout" in stack_sets or "pp_layout" in preset_sets):
        # uneven, and neither the profile nor its preset has this mesh's split (a recipe's layout map): the
        # profile's rule, else Megatron's default rule where the virtual stages are known (left to the search,
        # they take the profile's split for the mesh it picks, or its own)
        stack_split = stack_sets.get("pp_split")
        if stack_split:
            needs.append(Need("pp_split", stack_split, f"{L} layers over pp={pp} x vpp={vpp} virtual stages: uneven, "
                              "split by the stack's own rule", {}))
        elif "vpp" in fix:
            needs.append(_uneven_split(L, pp, vpp))
    approximated, missing, from_profile, per_row, device, dtype = _resolve(needs, stack_sets, fix, device, dtype,
                                                                           profile_only)
    if "recompute_modules" in fix:  # the module list is what selective recomputation re-runs
        fix["recompute"] = "selective"
    if profile_only and src not in RECOMPUTE_IN_TABLE and not stated:  # a run meshplan never saw: the search's
        fix.pop("recompute", None)
    if profile_only:  # and what it captured in CUDA graphs (space.free_cuda_graphs: per-layer graphs where allowed)
        fix.pop("cuda_graphs", None)
    if spread and placed:
        from_profile.append(f"cluster={cluster}")
        assumptions.append(f"cluster={cluster}: {spread}")
    elif spread:
        per_row.append(f"cluster={cluster}: {spread}")
    if preset is not None:
        assumptions.append(f"profile {profile}: workload preset {preset}")
    if lora_why:
        from_profile.append(f"lora={lora}")
        assumptions.append(lora_why)
    return RowInputs(name, src, cfg, cluster, row["gbs"], row["seq"], dtype, fix, n, step,
                     tuple(approximated), tuple(missing), tuple(assumptions), profile=profile,
                     from_profile=tuple(from_profile), per_row=tuple(per_row), system=row.get("system", ""),
                     precision=precision_group(row), can_express=str(can),
                     lora=lora,
                     moe=is_moe,
                     cuda_graphs=bridge_cuda_graphs(row) if is_bridge_row(row) else "", task=task)


def row_task(row: dict) -> str:
    """What a row's job trains, as its table states it: NeMo 24.07's fine-tuning table (S1f) and Megatron-Bridge's
    SFT rows fine-tune every weight (``sft``); LoRA rows train adapters (``--lora``) and every other row
    pre-trains."""
    return "sft" if row["source_id"] == "S1f" or row.get("task") == "sft" else "pretrain"


def _uneven_split(num_layers: int, pp: int, vpp: int) -> Need:
    """The split of ``num_layers`` over ``pp * vpp`` virtual stages the source leaves unsaid: Megatron's
    account-for-embedding/loss rule (``splits.balanced_split``; a first or last virtual stage may hold the embedding
    or the loss alone), or not expressible where even that leaves a virtual stage empty. A per-row setting: left
    free, meshplan's search balances the stages by their priced time instead (``planner.search.exact``), which is
    not what Megatron runs."""
    from meshplan.planner.layout.splits import balanced_split, format_pp_layout

    why = (f"{num_layers} layers over pp={pp} x vpp={vpp} virtual stages: uneven, the source does not give the split; "
           "Megatron's account-for-embedding/loss split assumed")
    try:
        return Need("pp_layout", format_pp_layout(balanced_split(num_layers, pp * vpp)), why, None)
    except MeshplanError:
        return Need("pp_layout", f"{num_layers}+2 over {pp * vpp}", why + ": more virtual stages than the layers, "
                    "the embedding and the loss", None)


def precision_group(row: dict) -> str:
    """The row's precision recipe for the per-precision summary: BF16, FP8-CS, MXFP8 or NVFP4 (Hopper rows: their
    dtype)."""
    if not is_bridge_row(row):
        return str(row.get("dtype") or "")
    dtype, fp8, _ = bridge_precision(row)
    return {"": dtype.upper(), "tensorwise": "FP8-CS", "mxfp8": "MXFP8", "blockwise": "FP8-SC",
            "delayed": "FP8-DS"}[fp8]


@functools.lru_cache(maxsize=None)
def _stack_refs() -> frozenset:
    """``name@version`` of every shipped stack profile, read once."""
    from meshplan.planner.layout.stacks import load_stacks

    return frozenset(load_stacks().profiles)


def _stack_sets(profile: str, cfg: Optional[str], dtype: str, is_moe: bool, task: str, fp8: str = "",
                fix: Optional[dict] = None, job: Optional[tuple] = None) -> tuple[dict[str, str], Optional[str], dict]:
    """(what stack profile ``profile`` sets for the row, its workload preset's name, what that preset set), as
    ``plan_job`` lays them (``planner.search.workloads.stack_values``): the preset chosen from the degrees the row's
    table states (``fix``) and ``job`` = (cluster, global batch, GPUs, LoRA); a row without a config takes the
    profile's general values alone."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.layout.stacks import load_stacks
    from meshplan.planner.search.workloads import JobFacts, stack_values

    if not cfg:
        return _profile_defaults(profile, dtype, is_moe, fp8, task), None, {}
    pinned = {k: v for k, v in (fix or {}).items() if k in ("tp", "pp", "vpp", "cp", "ep", "mbs", "sp")}
    if fp8:
        pinned["fp8"] = fp8
    facts = None
    if job is not None:
        cluster, global_batch, n_gpus, lora = job
        facts = JobFacts(load_cluster(cluster).device.name, global_batch, n_gpus, lora)
    sets, preset, by_preset = stack_values(load_stacks().get(profile), _config_spec(cfg), dtype, pinned, task, facts)
    return sets, (preset.name if preset else None), by_preset


@functools.lru_cache(maxsize=None)
def _profile_defaults(profile: str, dtype: str, is_moe: bool, fp8: str = "", task: str = "pretrain") -> dict[str, str]:
    """What stack profile ``profile`` sets for a ``dtype`` ``task`` run of a MoE or dense model under the fp8 recipe
    the row pins (``fp8``; "": the profile's own) as ``--fix`` text; read once per profile, dtype, kind, recipe and
    task (the catalogue is parsed from its YAML files on every ``load_stacks``)."""
    from meshplan.planner.layout.stacks import load_stacks

    return load_stacks().get(profile).defaults(dtype, is_moe, fp8, task)


@dataclass
class RowResult:
    name: str
    source: str
    published_step_s: Optional[float]  # None: a row too incomplete to say it
    status: str  # priced | not expressible | refused OOM | out of scope
    detail: str = ""
    predicted_step_s: Optional[float] = None
    error: Optional[float] = None  # signed, (predicted - published) / published
    breakdown: dict = field(default_factory=dict)  # compute / exposed comm / bubble / other, seconds
    memory_gib: Optional[float] = None
    memory_limit_gib: Optional[float] = None
    published_memory_gib: Optional[float] = None  # peak memory the source reports (torchtitan 2024-12 tables)
    inputs: dict = field(default_factory=dict)
    host_speed_step_s: Optional[float] = None  # the step at the other published x86 host speed (host_band), if it moves
    sustained_step_s: Optional[float] = None  # the step at the lower-power sibling's sustained share (sustained_band)


def in_band(r: RowResult, other_s: float) -> bool:
    """Whether a priced row's published step lies between its price and ``other_s``, its price at an open figure's
    other published value (``planner.estimate.host_band``, ``sustained_band``)."""
    lo, hi = sorted((r.predicted_step_s, other_s))
    return lo <= r.published_step_s <= hi


def band_counts(rs: list[RowResult], attr: str) -> tuple[int, int]:
    """(rows the open figure ``attr`` names moves by more than 1%, those whose published step lies in the band)."""
    band = [r for r in rs if r.status == "priced" and getattr(r, attr)
            and abs(getattr(r, attr) / r.predicted_step_s - 1) > 0.01]
    return len(band), sum(in_band(r, getattr(r, attr)) for r in band)


def price_row(row: dict, runs_dir: Path, out_dir: Path, profile_only: bool = False) -> RowResult:
    """Price one row through ``plan_job`` with its layout pinned (``profile_only``: see ``row_needs``). A Bridge
    row whose table layout cannot run (refused as out of memory, or against Megatron's mesh rules) and whose
    release's recipe runs another layout is priced at the recipe's, approximated (``recipe_layout_row``; under
    ``profile_only`` at its launcher's preset layout, ``_price_at_preset``). A row of a
    source without its own mapping that lacks a fact, or names no catalogued GPU, is reported as not expressible,
    saying why (the other rows still price); so is a row of a mapped source that meshplan cannot read (a system it
    does not catalogue, a precision word it does not know)."""
    if is_stated_row(row) and not str(row.get("meshplan_can_express", "yes")).startswith("no"):
        problem = stated_row_problem(row)
        step = None if problem else published_step_s(row)  # a row with a problem may give no usable time
        if not problem:
            try:  # what the row names (GPU, config, stack) and its nodes, as meshplan reads them
                return _price_as_stated(row, runs_dir, out_dir, profile_only)
            except MeshplanError as exc:
                problem = str(exc)
        return RowResult(str(row.get("name") or "?"), str(row.get("source_id") or "?"), step, "not expressible",
                         problem)
    try:
        res = _price_as_stated(row, runs_dir, out_dir, profile_only)
    except MeshplanError as exc:  # one row meshplan cannot read does not stop the others
        return RowResult(str(row.get("name") or "?"), str(row.get("source_id") or "?"), published_step_s(row),
                         "not expressible", str(exc))
    if res.status not in ("refused OOM", "not expressible") or res.inputs.get("missing"):
        return res
    if profile_only:
        return _price_at_preset(row, runs_dir, out_dir, res) if is_bridge_row(row) else res
    swap = recipe_layout_row(row)
    if swap is None:
        return res
    alt, why = swap
    out = _price_as_stated(alt, runs_dir, out_dir, profile_only)
    if out.status != "priced":
        return res
    out.inputs["approximated"] = [f"layout=recipe: {why}; the table's: {res.status}, {res.detail}",
                                  *out.inputs["approximated"]]
    out.detail = f"table layout {res.status} ({res.detail}): priced at its recipe's"
    return out


# The --fix keys of a row's layout that ``_price_at_preset`` leaves to the launcher's workload preset
PRESET_LAYOUT_KEYS = frozenset({"dp", "dp_replicate", "dp_shard", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "sp"})


def _price_at_preset(row: dict, runs_dir: Path, out_dir: Path, res: RowResult) -> RowResult:
    """``profile_only``: a Bridge row whose table layout cannot run (``res``: refused as out of memory, or against
    Megatron's mesh rules) priced at the layout its profile's launcher runs for the job the table states (its model,
    GPUs, batch and precision pick the workload preset, whose degrees and micro-batch then hold:
    ``planner.search.workloads``), approximated; ``res`` where that does not price either. The profile-only twin of
    ``recipe_layout_row``, which reads the row's own recipe match instead."""
    out = _price_as_stated(row, runs_dir, out_dir, True, free_layout=True)
    if out.status != "priced":
        return res
    out.inputs["approximated"] = [f"layout=preset: {out.detail}; the table's: {res.status}, {res.detail}",
                                  *out.inputs["approximated"]]
    out.detail = f"table layout {res.status} ({res.detail}): priced at its launcher's preset layout ({out.detail})"
    return out


# The layout fields a recipe match may name (README: ``recipe.match`` = 'closest (differs: {field: {table, recipe}})')
# -> the row's own key for each
RECIPE_LAYOUT_KEYS = {"tp": "tp", "pp": "pp", "vp": "pp_interleave", "cp": "cp", "ep": "ep", "mbs": "mbs"}


def recipe_layout_row(row: dict) -> Optional[tuple[dict, str]]:
    """(the row at its release's recipe layout, why) where the table's layout columns differ from the recipe the
    release ran (``recipe.match`` 'closest (differs: ...)'), else ``None``. Used only where the table's layout cannot
    run: a published table that lists a layout no GPU can hold was not what ran (26.02.01's Llama 3 70B NVFP4 on GB300:
    TP1 PP1 at MBS 2 without FSDP or recomputation, 131 GiB of bf16 weights, as much gradient and 80 layers'
    activations on a 276 GiB GPU, where every release's recipe and the 26.02 table run PP4 VP5 MBS1)."""
    rec = row.get("recipe") or {}
    said = re.fullmatch(r"closest \(differs: (\{.*\})\)", str(rec.get("match", "")))
    if not is_bridge_row(row) or not said:
        return None
    differs = {k: v for k, v in json.loads(said.group(1)).items() if k in RECIPE_LAYOUT_KEYS}
    if not differs:
        return None
    alt = dict(row, layout_assumptions={k: v for k, v in (row.get("layout_assumptions") or {}).items()
                                        if k not in RECIPE_LAYOUT_KEYS.values()})
    for k, v in differs.items():
        alt[RECIPE_LAYOUT_KEYS[k]] = v["recipe"] or (1 if k == "vp" else v["recipe"])
    where = f"{rec.get('release')} {rec.get('workload_config') or rec.get('perf_matrix_entry')}"
    return alt, f"{where} runs " + ", ".join(f"{k} {v['recipe']} (table {v['table']})" for k, v in differs.items())


def _price_as_stated(row: dict, runs_dir: Path, out_dir: Path, profile_only: bool,
                     free_layout: bool = False) -> RowResult:
    """One row through ``plan_job`` (``price_row``); ``free_layout``: its layout degrees unpinned
    (``PRESET_LAYOUT_KEYS``), so a workload preset's hold, and the priced layout named in ``detail``."""
    from meshplan.planner.search.job import PlanRequest, plan_job

    inp = row_needs(row, runs_dir, profile_only)
    if free_layout:
        inp = replace(inp, fix={k: v for k, v in inp.fix.items() if k not in PRESET_LAYOUT_KEYS})
    res = RowResult(inp.name, inp.source, inp.published_step_s, "", inputs=_inputs_dict(inp),
                    published_memory_gib=TORCHTITAN_FACTS.get(inp.name, {}).get("memory_gib"))
    if inp.out_of_scope:
        res.status, res.detail = "out of scope", inp.out_of_scope
        return res
    try:
        out = plan_job(PlanRequest.of(inp.model, inp.cluster, inp.global_batch, inp.seq_len, fix=inp.fix_string,
                                      stack=inp.profile, top=1, dtype=inp.dtype, name="devset", lora=inp.lora,
                                      task=inp.task, breakdown=True,
                                      out=out_dir / (re.sub(r"[^\w.-]", "_", inp.name) + ".yaml")))
    except MeshplanError as exc:
        msg = str(exc)
        miss = re.search(r"misses by ([\d.]+) GiB", msg)
        if inp.missing:
            res.status = "not expressible"
            res.detail = "; ".join(f"{m.key} ({m.value})" for m in inp.missing) + f" — meshplan: {msg}"
        elif miss:
            res.status, res.detail = "refused OOM", f"misses by {float(miss.group(1)):.1f} GiB"
            _diagnose(res, inp)
        else:
            said = "" if inp.can_express == "yes" else f"{inp.can_express} — "  # the row's own word, e.g. hybrid Mamba
            res.status, res.detail = "not expressible", f"{said}meshplan: {msg}"
        return res
    if inp.missing:  # meshplan priced a layout the row does not have
        res.status = "not expressible"
        res.detail = "; ".join(f"{m.key} ({m.value})" for m in inp.missing)
        return res
    r = out.rows[0]
    preset = next((n for n in out.notes if "workload preset" in n), "")
    if free_layout and not preset:  # no preset sets the layout: the search chose it, not the launcher
        res.status, res.detail = "not expressible", "no workload preset of its profile runs this job"
        return res
    res.status = "priced"
    if free_layout:
        res.detail = f"{r['layout']}; {preset}"
    res.predicted_step_s = r["step_time_s"]
    res.error = r["step_time_s"] / inp.published_step_s - 1.0
    res.breakdown = {"compute_s": r["compute_s"], "exposed_comm_s": r["exposed_comm_s"], "bubble_s": r["bubble_s"],
                     "other_s": out.plan.prediction.breakdown.other_s,
                     "memory_bytes": dict(out.plan.prediction.memory_bytes or {})}
    res.memory_gib = r["peak_memory_bytes"] / GiB
    bands = out.breakdown or {}
    if bands.get("host_speed"):  # the step at the other published x86 / Grace host speed (estimate.host_band)
        res.host_speed_step_s = bands["host_speed"]["step_time_s"]
    if bands.get("sustained"):  # the step at the lower-power sibling's sustained share (estimate.sustained_band)
        res.sustained_step_s = bands["sustained"]["step_time_s"]
    return res


def _diagnose(res: RowResult, inp: RowInputs) -> None:
    """For a refused row: the same layout priced by meshplan's estimator anyway (what it would predict), with the
    row's stack profile under its pins as ``plan_job`` takes them."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.estimate.select import estimator_for
    from meshplan.planner.layout.space import enumerate_layouts, parse_fix
    from meshplan.planner.model.config import load_model
    from meshplan.planner.search.job import profile_pins
    from meshplan.planner.search.workloads import JobFacts

    work = Workload(load_model(inp.model), load_cluster(inp.cluster), inp.global_batch, inp.seq_len, inp.dtype,
                    lora=inp.lora)
    pins, _, _ = profile_pins(inp.profile, inp.dtype, work.model, parse_fix(inp.fix_string), inp.task,
                              JobFacts(work.cluster.device.name, inp.global_batch, work.cluster.world_size,
                                       bool(inp.lora)))
    estimator = estimator_for(work.cluster)
    ests = [estimator.estimate(work, lay) for lay in enumerate_layouts(
        work.model, work.cluster.world_size, work.cluster.devices_per_node, inp.global_batch, inp.seq_len, pins)]
    est = min(ests, key=lambda e: e.memory.total_bytes)  # the closest miss, as meshplan's refusal names it
    res.breakdown = {"step_time_s_if_it_fit": est.step_time_s, "compute_s": est.compute_s,
                     "exposed_comm_s": est.exposed_comm_s, "bubble_s": est.bubble_s, "other_s": est.other_s,
                     "memory_bytes": est.memory.as_dict()}
    res.memory_gib, res.memory_limit_gib = est.memory.total_bytes / GiB, est.memory_limit_bytes / GiB


def _inputs_dict(inp: RowInputs) -> dict:
    d = asdict(inp)
    d["fix"] = inp.fix_string
    d["approximated"] = [f"{n.key}={n.value}: {n.why}" for n in inp.approximated]
    d["missing"] = [f"{n.key}={n.value}: {n.why}" for n in inp.missing]
    return d


def load_rows(runs_dir: Path, files: Optional[tuple[str, ...]] = None) -> list[dict]:
    """Every row of every ``*.jsonl`` in ``runs_dir`` (sorted by file name; or only the named ``files``), each
    keeping its own ``source_id``."""
    if files is None:
        paths = sorted(runs_dir.glob("*.jsonl")) if runs_dir.is_dir() else []
        if not paths:
            raise MeshplanError(f"{runs_dir}: no *.jsonl of published runs there")
    else:
        paths = [runs_dir / f for f in files]
    rows = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise MeshplanError(f"{path}: cannot read ({exc.strerror})") from None
        for i, line in enumerate(lines, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise MeshplanError(f"{path}:{i}: not JSON ({exc.msg})") from None
    return rows


def summary_groups(results: list[RowResult]) -> list[tuple[str, list[RowResult]]]:
    """Per source, then all; for sources that name their systems (B1, B2) also per system and per precision
    recipe (``B1 DGX-GB300``, ``B1 MXFP8``)."""
    rs = [r for r in results if r.status != "out of scope"]
    out = []
    for src in sorted({r.source for r in rs}):
        mine = [r for r in rs if r.source == src]
        out.append((src, mine))
        systems = sorted({r.inputs.get("system", "") for r in mine} - {""})
        precisions = sorted({r.inputs.get("precision", "") for r in mine} - {""})
        if systems:
            out += [(f"{src} {x}", [r for r in mine if r.inputs.get("system") == x]) for x in systems]
            out += [(f"{src} {x}", [r for r in mine if r.inputs.get("precision") == x]) for x in precisions]
        out += _graph_groups(src, mine)
    return out + [("all", rs)]


# The CUDA-graph groups of a source's MoE rows (``bridge_cuda_graphs``): host time, which meshplan does not price,
# is what a whole-iteration graph removes
GRAPH_GROUPS = (("whole iteration", ("whole iteration",)), ("partial", ("partial",)), ("mixers only", ("mixers only",)),
                ("none or unstated", ("none", "unstated")))


def _graph_groups(src: str, rows: list[RowResult]) -> list[tuple[str, list[RowResult]]]:
    """``B1 MoE, CUDA graphs: whole iteration`` and the like, for a source whose MoE rows say their graphs."""
    moe = [r for r in rows if r.inputs.get("moe") and r.inputs.get("cuda_graphs")]
    groups = [(f"{src} MoE, CUDA graphs: {label}", [r for r in moe if r.inputs["cuda_graphs"] in modes])
              for label, modes in GRAPH_GROUPS]
    return [g for g in groups if g[1]]


def _footnoted(r: RowResult) -> bool:
    """Whether the row's page footnote names a known regression the run ran (``known_regressions``)."""
    return any(a.startswith(REGRESSION_NOTE) for a in r.inputs.get("assumptions", ()))


def summarize(results: list[RowResult]) -> list[dict]:
    """Per source and group (``summary_groups``): counts by status, mean and median |error|, worst, median signed
    over the priced rows, the rows a page footnote marks as a known regression and the mean without them,
    approximated decisions and per-row settings."""
    out = []
    for s, rs in summary_groups(results):
        errs = [r.error for r in rs if r.status == "priced"]
        # rows whose page footnote names a known kernel regression they ran: priced and counted in the mean; the
        # mean over the others beside it
        others = [abs(r.error) for r in rs if r.status == "priced" and not _footnoted(r)]
        out.append({
            "source": s, "rows": len(rs), "priced": len(errs),
            "not_expressible": sum(r.status == "not expressible" for r in rs),
            "refused_oom": sum(r.status == "refused OOM" for r in rs),
            "mean_abs_error": statistics.fmean(abs(e) for e in errs) if errs else None,
            "worst_error": max(errs, key=abs) if errs else None,
            "median_signed_error": statistics.median(errs) if errs else None,
            "median_abs_error": statistics.median(abs(e) for e in errs) if errs else None,
            "known_regression_rows": len(errs) - len(others),
            "mean_abs_error_outside_known_regressions": statistics.fmean(others) if others else None,
            "profiles": sorted({r.inputs.get("profile", "") for r in rs}),
            "per_row_settings_median": statistics.median(n) if (n := [len(r.inputs.get("per_row", ()))
                                                                      for r in rs]) else None,
            "per_row_settings_total": sum(len(r.inputs.get("per_row", ())) for r in rs),
            "approximated_rows": sum(bool(r.inputs.get("approximated")) for r in rs if r.status == "priced"),
            # rows whose step an open figure's other value moves by more than 1%, and of those, the ones whose
            # published step lies between the two prices (band_counts)
            **dict(zip(("host_band_rows", "host_band_holds_published"), band_counts(rs, "host_speed_step_s"))),
            **dict(zip(("sustained_band_rows", "sustained_band_holds_published"),
                       band_counts(rs, "sustained_step_s"))),
        })
    return out


def run(runs_dir: Path, files: Optional[tuple[str, ...]] = None,
        profile_only: bool = False) -> tuple[list[RowResult], list[dict]]:
    """Price every row of ``runs_dir`` (or of the named ``files`` there) and summarize."""
    with tempfile.TemporaryDirectory() as tmp:
        results = [price_row(row, runs_dir, Path(tmp), profile_only) for row in load_rows(runs_dir, files)]
    return results, summarize(results)


def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


ROW_COLUMNS = ("row", "src", "published s", "predicted s", "error", "status", "approximated", "per-row settings")
SUMMARY_COLUMNS = ("source", "rows", "priced", "not expressible", "refused OOM", "mean |error|", "median |error|",
                   "worst", "median signed", "profile", "per-row settings (median)", "priced approximated",
                   "host band holds", "sustained band holds")


def table_cells(results: list[RowResult], summary: list[dict]) -> tuple[list[list[str]], list[list[str]]]:
    """The two tables (rows, per source) as strings, shared by the rich and the Markdown rendering."""
    rows = []
    for r in results:
        if r.status == "out of scope":
            continue
        status = r.status if r.status == "priced" else f"{r.status}: {r.detail}"
        approx = ", ".join(a.split(": ")[0] for a in r.inputs.get("approximated", []))
        per_row = ", ".join(a.split(": ")[0] for a in r.inputs.get("per_row", ()))
        rows.append([r.name, r.source, "" if r.published_step_s is None else f"{r.published_step_s:.3f}",
                     "" if r.predicted_step_s is None else f"{r.predicted_step_s:.3f}", _pct(r.error), status, approx,
                     per_row])
    per_source = [[x["source"], str(x["rows"]), str(x["priced"]), str(x["not_expressible"]), str(x["refused_oom"]),
                   "" if x["mean_abs_error"] is None else f"{100 * x['mean_abs_error']:.1f}%",
                   "" if x["median_abs_error"] is None else f"{100 * x['median_abs_error']:.1f}%",
                   _pct(x["worst_error"]), _pct(x["median_signed_error"]), _profiles_cell(x["profiles"]),
                   f"{x['per_row_settings_median']:g} ({x['per_row_settings_total']} in all)",
                   str(x["approximated_rows"]),
                   *(f"{x[f'{b}_band_holds_published']} of {x[f'{b}_band_rows']}" if x[f"{b}_band_rows"] else "-"
                     for b in ("host", "sustained"))]
                  for x in summary]
    return rows, per_source


def _profiles_cell(profiles: list[str]) -> str:
    """``a@1, a@2, a@3, b@1`` as ``a@1 .. a@3 (3), b@1``: each stack whose versions make more than two of the list
    (Megatron-Bridge's containers) as its range."""
    from meshplan.planner.layout.stacks import _version_key

    by_name: dict[str, list[str]] = {}
    for p in profiles:
        name, _, version = p.partition("@")
        by_name.setdefault(name, []).append(version)
    cells = []
    for name, vers in by_name.items():
        vers.sort(key=_version_key)
        cells.append(f"{name}@{vers[0]} .. {vers[-1]} ({len(vers)})" if len(vers) > 2 else
                     ", ".join(f"{name}@{v}" for v in vers))
    return ", ".join(cells)


def render(results: list[RowResult], summary: list[dict], console: Console) -> None:
    rows, per_source = table_cells(results, summary)
    for title, cols, body in (("dev set: published step time vs meshplan, each run's own layout", ROW_COLUMNS, rows),
                              ("per source (priced rows)", SUMMARY_COLUMNS, per_source)):
        t = Table(title=title)
        for col in cols:
            t.add_column(col, overflow="fold", justify="left" if col in ("row", "src", "source", "status",
                                                                          "approximated", "profile",
                                                                          "per-row settings") else "right")
        for cells in body:
            t.add_row(*cells)
        console.print(t)
    skipped = [r.name for r in results if r.status == "out of scope"]
    if skipped:
        console.print(f"out of scope (no config): {', '.join(skipped)}", highlight=False)


def markdown(results: list[RowResult], summary: list[dict]) -> str:
    rows, per_source = table_cells(results, summary)
    out = []
    for cols, body in ((ROW_COLUMNS, rows), (SUMMARY_COLUMNS, per_source)):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |")
        out.append("|" + "---|" * len(cols))
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
        out.append("")
    return "\n".join(out)


def main(
    runs_dir: Annotated[Path, typer.Argument(help="Folder with dev_runs.jsonl and configs/")] = DEFAULT_RUNS,
    json_out: Annotated[bool, typer.Option("--json", help="Print rows and summary as JSON")] = False,
    md: Annotated[bool, typer.Option("--markdown", help="Print the two tables as Markdown")] = False,
    profile_only: Annotated[bool, typer.Option(
        "--profile-only", help="Price each row as a run meshplan has never seen: its table's facts and its stack "
        "profile alone, every per-row setting left to meshplan's search")] = False,
) -> None:
    """Price every in-scope dev-set row with its own layout and compare with the published step time."""
    try:
        results, summary = run(runs_dir, profile_only=profile_only)
    except MeshplanError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    fitted = fitted_rows()
    if json_out:
        print(json.dumps({"rows": [asdict(r) for r in results], "summary": summary, "fitted": fitted}, indent=2,
                         default=str))
        return
    if md:
        print(markdown(results, summary) + "\n" + fitted_markdown(fitted))
        return
    render(results, summary, Console())
    render_fitted(fitted, Console())


FITTED_COLUMNS = ("constant", "fitted on", "in sample", "held out", "held-out error", "dev-set step times used")
NO_STEP_FITS = ("No constant is fitted to a dev-set step time, so each source's leave-one-source-out error is its "
                "error above.")


def fitted_rows() -> list[dict]:
    """Every fitted or measured constant behind the prices (``costmodel.fitted``), with its held-out error."""
    from meshplan.costmodel.api import Pricer
    from meshplan.costmodel.fitted import fitted_constants

    return fitted_constants(Pricer.shipped())


def _fitted_cells(fitted: list[dict]) -> list[list[str]]:
    def pct(x):
        return "" if x is None else f"{x:.1f}%"
    return [[f["constant"], f["fitted_on"], pct(f["in_sample_error_pct"]), f["held_out"],
             pct(f["held_out_error_pct"]), str(f["step_times_used"])] for f in fitted]


def render_fitted(fitted: list[dict], console: Console) -> None:
    t = Table(title="what the prices were fitted to (error on kernel timings: learned classes MAPE, grouped "
                    "share median)")
    for col in FITTED_COLUMNS:
        t.add_column(col, overflow="fold")
    for cells in _fitted_cells(fitted):
        t.add_row(*cells)
    console.print(t)
    console.print(NO_STEP_FITS, highlight=False)


def fitted_markdown(fitted: list[dict]) -> str:
    out = ["| " + " | ".join(FITTED_COLUMNS) + " |", "|" + "---|" * len(FITTED_COLUMNS)]
    out += ["| " + " | ".join(cells) + " |" for cells in _fitted_cells(fitted)]
    return "\n".join(out + ["", NO_STEP_FITS])


if __name__ == "__main__":
    typer.run(main)
