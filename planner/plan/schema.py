"""The ``Plan``: every decision meshplan makes for one job, plus the prediction and the versions that made it.

A plan is a value (pydantic model, frozen). It is saved as YAML under ``plans/`` and is the only input of the
exporters (``planner.export``) and of ``meshplan check``. Its degrees are ``planner.layout.layout.Degrees``
(torchtitan's
``ParallelDims`` naming: world = dp_replicate * dp_shard * cp * tp * pp; ep borrows from dp_shard * cp).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from meshplan.core.atomic import write_atomic
from meshplan.core.bounds import BoundedInt, Count, FiniteFloat, NonNegFloat, PositiveInt
from meshplan.core.errors import MeshplanError, validation_line
from meshplan.core.yamlio import load_yaml_file
from meshplan.planner.layout.decisions import DECISIONS, PLAN_SCHEDULES
from meshplan.planner.layout.layout import Degrees

# A plan's name becomes a file name under plans/, a job name and a word in generated shell scripts: letters,
# digits, '.', '_' and '-', starting with a letter or digit (so never '..', '/' or anything a shell expands).
PLAN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# Version of the plan file's format (the fields of ``Plan`` and what they mean), printed by ``meshplan plan --json``:
# raised when a field changes meaning or a required one is added; plans of older versions still load.
PLAN_SCHEMA_VERSION = 1
# HF ``model_type`` values are identifiers (``llama``, ``qwen3_moe``, ``gpt_neox``); exporters map them to
# launcher names and classes.
MODEL_TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

_ATTENTION_NOTE = "attention="  # how plans before the ``attention`` field recorded it (a note, parsed back)

__all__ = ["Breakdown", "BucketCompression", "ClusterRef", "Degrees", "DeviceGroupRef", "ModelRef", "Plan",
           "Prediction", "Stage", "load_plan"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelRef(_Frozen):
    """What exporters need to know of the model, copied from ``ModelSpec`` when the plan is made."""

    name: str
    source: str  # preset name or path of the config.json it came from
    model_type: str = Field(pattern=MODEL_TYPE_PATTERN)
    num_params: Count  # 0 = not recorded (hand-made plans in tests)
    hidden_size: PositiveInt
    num_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    ffn_hidden_size: PositiveInt
    vocab_size: PositiveInt
    num_experts: Count = 0
    experts_per_token: Count = 0
    # Shape details the launch-config exporters need (planner.export); 0 / None / () = not recorded, and the
    # exporter then leaves the target's default and says so. Names follow planner.model.spec.ModelSpec.
    head_dim: Count = 0  # q/k head dim; 0 = hidden_size / num_attention_heads
    moe_ffn_hidden_size: Count = 0
    num_shared_experts: Count = 0
    moe_layers: tuple[Count, ...] = ()  # indices of MoE layers; () with num_experts > 0 = every layer
    tied_embeddings: Optional[bool] = None
    q_lora_rank: Count = 0  # MLA (DeepSeek-V2/V3); 0 = not MLA
    kv_lora_rank: Count = 0
    qk_rope_head_dim: Count = 0
    v_head_dim: Count = 0
    rope_theta: NonNegFloat = 0.0  # config.json rope_theta; 0 = not recorded (plans written before it was)
    rope_scaling_type: str = ""  # "llama3", "yarn", ...; "" = unscaled or not recorded
    rope_scaling_factor: NonNegFloat = 0.0
    qkv_bias: bool = False  # biases on the q/k/v projections (``ModelSpec.qkv_bias``)
    qk_norm: bool = False  # RMSNorm on q and k (``ModelSpec.qk_norm``)
    rotary_percent: float = Field(1.0, gt=0.0, le=1.0)  # share of each head RoPE rotates (``ModelSpec``)
    sliding_window: Count = 0  # keys a sliding-window layer attends to (``ModelSpec.sliding_window``); 0 = none
    window_layers: tuple[Count, ...] = ()  # the layers that use it, 0-based (``ModelSpec.window_layers``)
    attention_sinks: bool = False  # one learned sink logit per head (GPT-OSS, ``ModelSpec.attention_sinks``)
    glu_clamp: NonNegFloat = 0.0  # the gated activation's inputs clamped to this (GPT-OSS); 0 = none
    shared_expert_ffn_hidden_size: Count = 0  # total shared-expert width; 0 = num_shared_experts x the expert's
    moe_latent_size: Count = 0  # LatentMoE's expert width (Nemotron 3 Super); 0 = none
    layer_pattern: str = Field("", pattern=r"^[M*\-E]*$")  # a hybrid's blocks, one per layer (``ModelSpec``)
    mamba_heads: Count = 0  # Mamba-2 heads, head dim, state size and groups of a hybrid's mixers
    mamba_head_dim: Count = 0
    mamba_state: Count = 0
    mamba_groups: Count = 0
    gdn_layers: tuple[Count, ...] = ()  # the layers mixed by Gated DeltaNet, 0-based (``ModelSpec.gdn_layers``)
    gdn_key_heads: Count = 0  # its key heads, value heads, their widths and its conv kernel (``ModelSpec``)
    gdn_value_heads: Count = 0
    gdn_key_head_dim: Count = 0
    gdn_value_head_dim: Count = 0
    gdn_conv_kernel: Count = 0
    attn_output_gate: bool = False  # the attention's output gated by q_proj's second half (Qwen3-Next, Qwen3.5)
    shared_expert_gate: bool = False  # a sigmoid gate on the shared expert's output (Qwen2-MoE, Qwen3-Next)


class DeviceGroupRef(_Frozen):
    nodes: PositiveInt
    devices_per_node: PositiveInt
    device: str


class ClusterRef(_Frozen):
    spec: str  # what the user passed: shorthand ("16x8xH100", "local:2") or a file path
    groups: tuple[DeviceGroupRef, ...]

    @property
    def world_size(self) -> int:
        return sum(g.nodes * g.devices_per_node for g in self.groups)

    @property
    def nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def devices_per_node(self) -> int:
        """Devices per node (the largest group's value when groups differ)."""
        return max(g.devices_per_node for g in self.groups)


class Stage(_Frozen):
    """One pipeline stage: a contiguous run of layers on one device group."""

    first_layer: Count
    num_layers: Count  # 0 only for a first stage holding just the embedding or a last one holding just the loss
    device_group: Count = 0


class BucketCompression(_Frozen):
    """Gradient compression of one bucket (ByteComp-style)."""

    bucket: Count
    size_bytes: Count
    method: Literal["none", "fp16", "bf16", "int8", "topk", "powersgd"] = "none"
    param: NonNegFloat = 0.0  # top-k ratio or PowerSGD rank
    two_level: bool = False
    where: Literal["gpu", "cpu"] = "gpu"


class Breakdown(_Frozen):
    """Per-step time split, seconds. ``compute_s + exposed_comm_s + bubble_s + other_s == step_time_s``."""

    compute_s: FiniteFloat
    exposed_comm_s: FiniteFloat
    bubble_s: FiniteFloat
    other_s: FiniteFloat = 0.0


class Prediction(_Frozen):
    step_time_s: NonNegFloat
    tokens_per_s: NonNegFloat
    tflops_per_device: NonNegFloat  # model FLOPs (no recompute) / step / device, in TFLOP/s
    hw_tflops_per_device: NonNegFloat  # incl. recompute (Narayanan et al. 2021 count), TFLOP/s
    mfu: NonNegFloat
    peak_memory_bytes: Count
    breakdown: Breakdown
    memory_bytes: dict[str, BoundedInt] = Field(default_factory=dict)  # weights, grads, optimizer, activations, ...
    costmodel: str = "roofline"


class _PlanBody(_Frozen):
    """What a plan does; its fields (``Plan``) are made below, the decisions' from ``planner.layout.decisions``."""

    @model_validator(mode="before")
    @classmethod
    def _attention_from_note(cls, data):
        """A plan written before ``attention`` was a field kept it as the note ``attention=X``: read it into the
        field (the note dropped), so old plan files load as the same plan."""
        if isinstance(data, dict) and "attention" not in data and isinstance(data.get("notes"), (list, tuple)):
            said = [n for n in data["notes"] if isinstance(n, str) and n.startswith(_ATTENTION_NOTE)]
            if said:
                data = {**data, "attention": said[-1][len(_ATTENTION_NOTE):],
                        "notes": [n for n in data["notes"] if n not in said]}
        return data

    @property
    def grad_accum(self) -> int:
        """Micro-batches per step per pipeline (global / (micro * dp))."""
        return self.global_batch // (self.micro_batch * self.degrees.dp)

    def precision_summary(self) -> str:
        """``layers 0-59 int4, 60-79 bf16``: the per-layer precision in runs ("" when every layer is ``dtype``)."""
        if not self.layer_precision:
            return ""
        runs: list[list] = []
        for i, p in enumerate(self.layer_precision):
            if runs and runs[-1][2] == p:
                runs[-1][1] = i
            else:
                runs.append([i, i, p])
        return "layers " + ", ".join(f"{a}-{b} {p}" if a != b else f"{a} {p}" for a, b, p in runs)

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        for key, default in OMIT_AT_DEFAULT.items():
            if data.get(key) == default:
                del data[key]
        text = yaml.safe_dump(data, sort_keys=False)
        summary = self.precision_summary()
        if summary:  # the precision that runs, at the top: `dtype` below is the activations' and the 16-bit layers'
            text = f"# precision per layer: {summary} (dtype below: activations and KV cache)\n" + text
        return text

    def __eq__(self, other: object) -> bool:
        # the same plan read from two files is the same plan: source_path is where it was read, not what it is
        return isinstance(other, _PlanBody) and self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(self.to_yaml())

    def from_file(self, path: str | Path) -> "_PlanBody":
        """This plan, recording the file it was read from (``source_path``; never written into a plan file)."""
        return self.model_copy(update={"source_path": str(path)})

    def save(self, path: str | Path) -> Path:
        """Write the plan as YAML atomically."""
        return write_atomic(path, self.to_yaml())


def _decision_fields(*names: str) -> dict:
    """Plan fields of the decisions ``names`` (all optional ones when none are named), typed from the registry."""
    chosen = names or [n for n, d in DECISIONS.items() if d.plan_field and d.plan_optional]
    out = {}
    for n in chosen:
        d = DECISIONS[n]
        if d.plan_field == "schedule":  # the plan names the schedule that runs (the layout's "" is 1F1B)
            out["schedule"] = (Literal[PLAN_SCHEDULES], "1f1b")
        else:
            out[d.plan_field] = (d.plan_type(), ... if n == "micro_batch" else d.default)
    return out


_PLAN_FIELDS = {
    "name": (str, Field(pattern=PLAN_NAME_PATTERN)),
    "model": (ModelRef, ...),
    "cluster": (ClusterRef, ...),
    "global_batch": (int, Field(ge=1)),
    **_decision_fields("micro_batch"),
    "seq_len": (int, Field(ge=1)),
    "degrees": (Degrees, ...),
    **_decision_fields("sequence_parallel", "zero_stage", "recompute", "pipeline_schedule", "attention"),
    "dtype": (str, "bf16"),
    # LoRA adapters over a frozen base (``meshplan plan --lora``, ``planner.model.peft``): a property of the job;
    # "" = every weight trained
    "lora": (str, Field("", pattern=r"^$|^[1-9][0-9]{0,4}(:(qkv|proj|fc1|fc2)(\+(qkv|proj|fc1|fc2))*)?$")),
    # The decisions added after plan schema 1 was first written: left out of the file while at their default, so
    # plans of older meshplan versions and their golden exports stay byte-identical.
    **_decision_fields(),
    # The stack profile the plan was made with (``meshplan plan --stack``, ``planner.layout.stacks``); "" = none.
    "stack_profile": (str, Field("", pattern=r"^$|^[a-z0-9][a-z0-9._-]*@[A-Za-z0-9][A-Za-z0-9._-]*$")),
    "explain": (Optional[dict], None),  # ``meshplan plan --explain``: planner.estimate.explain's breakdown
    "layer_precision": (Optional[tuple[str, ...]], None),
    "stages": (Optional[tuple[Stage, ...]], None),
    "compression": (Optional[tuple[BucketCompression, ...]], None),
    "prediction": (Optional[Prediction], None),
    "meshplan_version": (str, "0+unknown"),
    "notes": (tuple[str, ...], ()),
    # The file this plan was read from (``load_plan``), so an export launches that file; never written to one.
    "source_path": (Optional[str], Field(None, exclude=True)),
}
Plan = create_model("Plan", __base__=_PlanBody, __module__=__name__, **_PLAN_FIELDS)
Plan.__doc__ = """Every decision meshplan makes for one job (``planner.layout.decisions``), the workload, the
prediction and the versions that made it."""
OMIT_AT_DEFAULT = {**{d.plan_field: d.default for d in DECISIONS.values() if d.plan_field and d.plan_optional},
                   "stack_profile": "", "explain": None, "lora": ""}
"""Plan fields left out of the file while at these values."""


def load_plan(path: str | Path) -> Plan:
    """Read a plan YAML file.

    Raises:
        MeshplanError: the file is missing, not YAML, or not a plan (names the first bad field).
    """
    p = Path(path)
    try:
        raw = load_yaml_file(p)
    except FileNotFoundError:
        raise MeshplanError(f"{p}: plan file not found") from None
    if not isinstance(raw, dict):
        raise MeshplanError(f"{p}: not a meshplan plan (expected a mapping at the top level)")
    try:
        return Plan.model_validate(raw).from_file(p)
    except ValidationError as exc:
        raise MeshplanError(f"{p}: not a valid plan: {validation_line(exc)}") from None
