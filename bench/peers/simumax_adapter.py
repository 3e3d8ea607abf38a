"""SimuMax (github.com/MooreThreads/SimuMax) on a dev-set row: row -> its model/strategy/system inputs -> step time.

SimuMax takes three JSON-shaped inputs (its docs/model.md, docs/strategy.md, docs/system.md). ``model_config`` and
``strategy_config`` build the first two from a ``peer_rows.Row`` with the standard library only (unit-tested
without SimuMax); ``system_config`` derives a DGX H100 / DGX A100 file from the system files SimuMax ships, and
``predict`` imports SimuMax from a checkout path and runs ``PerfLLM`` as its tutorial does.

SimuMax ships no H100 system file (configs/system/ at 4dcaae5 holds a100_pcie.json and b200_bf16_ceperm.json). Its
docs/system.md says to "copy the nearest existing config", then update the machine fields and network section. So
the H100 file is derived at run time from the checkout, never stored here:
* accelerator section (per-op efficiency factors, per-shape tables, memory-bound efficiencies) from one shipped file,
  ``base`` = "b200" (the nearest NVSwitch / FP8-generation machine) or "a100" (the reference machine of SimuMax's
  examples); peak TFLOP/s, HBM bandwidth and capacity replaced by the datasheet figures in ``MACHINES``;
* networks section from b200_bf16_ceperm.json, SimuMax's only NVLink/NVSwitch file (a100_pcie.json is PCIe), with
  its bandwidth fields set from the datasheet. ``inter_node.bandwidth.gbps`` is PER NODE: SimuMax divides it by
  ``num_per_node`` for p2p and EP all-to-all ("bw of the single network card", simumax/core/config.py
  ``compute_net_op_time``) and by min(8, tp*cp) for dense DP collectives. A DGX H100 node has 8x 400 Gb/s NICs, so
  the field is 8 * 400 / 8 = 400 GB/s, not 50.
SimuMax writes bandwidths as datasheet "GB/s" and divides by 1024**3 (its own b200 file uses 900 for NVLink5 and its
tools/efficency_test uses 3350 for H100 HBM3); the derived files follow that convention.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from peer_rows import NotExpressible, Prediction, Row, ceil_to, from_checkout, map_row

PEER = "simumax"
SHIPPED = {"b200": "configs/system/b200_bf16_ceperm.json", "a100": "configs/system/a100_pcie.json"}
NETWORKS_FROM = "b200"  # the only shipped NVLink/NVSwitch network section


@dataclass(frozen=True)
class Machine:
    """Datasheet figures a SimuMax system file needs; GB/s as SimuMax writes them (see the module docstring)."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_gbps: float
    mem_gb: int
    nvlink_gbps: float  # per GPU per direction
    nic_gbits: float  # one NIC's line rate
    nics_per_node: int
    gpus_per_node: int = 8

    @property
    def inter_node_gbps_per_node(self) -> float:
        """SimuMax's inter_node field: the whole node's network, NICs x line rate / 8 bits."""
        return self.nics_per_node * self.nic_gbits / 8


MACHINES = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOP/s and FP8 3,958 TFLOP/s *with sparsity*, i.e.
    # 989.4 / 1978.9 dense; HBM3 3.35 TB/s; 80 GB; NVLink 900 GB/s bidirectional = 450 per direction (SimuMax's
    # tools/efficency_test run_one_click_benchmark.py uses 450 and 3350 for H100 too). NVIDIA DGX H100 datasheet:
    # 8x single-port ConnectX-7 400 Gb/s InfiniBand for compute.
    "H100": Machine("dgx_h100", 989.4, 1978.9, 3350.0, 80, 450.0, 400.0, 8),
    # NVIDIA A100 datasheet (SXM4 80GB): BF16 312 TFLOP/s dense, HBM2e 2,039 GB/s, NVLink 600 GB/s bidirectional;
    # DGX A100 datasheet: 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand. (A100 has no FP8: SimuMax's own a100
    # file writes 2x bf16 for fp8 ops; unused here, no A100 row is fp8.)
    "A100": Machine("dgx_a100", 312.0, 624.0, 2039.0, 80, 300.0, 200.0, 8),
}


def system_config(shipped: dict[str, dict], gpu: str, base: str) -> tuple[dict, str]:
    """A SimuMax system dict for ``gpu`` ("H100"/"A100") and a one-line provenance.

    ``shipped`` maps "b200"/"a100" to the parsed files of ``SHIPPED``. A100 rows always take the a100 accelerator
    section (measured on A100); H100 rows take ``base``'s.
    """
    m = MACHINES[gpu]
    accel_from = "a100" if gpu == "A100" else base
    src_a, src_n = shipped[accel_from], shipped[NETWORKS_FROM]
    accel = copy.deepcopy(src_a["accelerator"])
    accel["mem_gbs"] = m.mem_gb
    ops = accel["op"]
    for name, op in ops.items():
        op["tflops"] = m.fp8_tflops if name.startswith("fp8_") else m.bf16_tflops
    for name, op in ops.items():
        # b200_bf16_ceperm.json leaves fp8 efficiency at 0 (not measured); a100_pcie.json's convention is the
        # fp8 op's default efficiency = its bf16 twin's default. Apply that convention where the file has 0.
        if name.startswith("fp8_") and not op.get("efficient_factor"):
            op["efficient_factor"] = ops[name[len("fp8_"):]]["efficient_factor"]
    for bw in accel["bandwidth"].values():
        bw["gbps"] = m.hbm_gbps
    nets = copy.deepcopy(src_n["networks"])
    for key in ("low_intra_node", "high_intra_node"):
        nets[key]["bandwidth"]["gbps"] = m.nvlink_gbps
    nets["inter_node"]["bandwidth"]["gbps"] = m.inter_node_gbps_per_node
    out = {"sys_name": f"{m.name}_from_{accel_from}", "num_per_node": m.gpus_per_node, "accelerator": accel,
           "FC8": src_n.get("FC8", False), "networks": nets}
    how = (f"derived: accelerator of {SHIPPED[accel_from]}, networks of {SHIPPED[NETWORKS_FROM]}, "
           f"{gpu} datasheet peaks/HBM/NVLink, inter_node {m.inter_node_gbps_per_node:g} GB/s per node "
           f"({m.nics_per_node}x {m.nic_gbits:g} Gb/s)")
    return out, how


def model_config(row: Row) -> tuple[dict, list[str]]:
    """SimuMax model dict (docs/model.md fields) and the approximations it carries."""
    if row.out_of_scope:
        raise NotExpressible(f"dev set: {row.out_of_scope}")
    approx: list[str] = []
    layers = row.layers
    if row.pp > 1 and row.vp > 1 and layers % (row.pp * row.vp):
        # SimuMax needs every stage's layer count divisible by the interleaving size (perf_llm.py
        # get_num_layers_to_build), so uneven virtual chunks cannot be written; pad to whole chunks.
        layers = ceil_to(layers, row.pp * row.vp)
        approx.append(f"{layers - row.layers} extra layer(s) priced ({row.layers} -> {layers}): SimuMax needs "
                      f"layers divisible by pp*vp = {row.pp * row.vp}")
    m = {
        "model_type": "moe" if row.moe else "dense",
        "model_name": row.name,
        "hidden_size": row.hidden,
        "head_num": row.heads,
        "kv_head_num": row.kv_heads,
        "head_size": row.head_dim,
        "intermediate_size": row.ffn or row.moe_ffn,
        "layer_num": layers,
        "vocab_size": row.vocab,
        "use_swiglu": bool(row.gated_mlp),
    }
    if row.moe:
        m.update(expert_num=row.num_experts, topk=row.top_k, moe_ffn_hidden_size=row.moe_ffn,
                 moe_shared_expert_intermediate_size=(row.shared_experts * row.moe_ffn if row.shared_experts
                                                      else None),
                 dense_layers=row.first_dense_layers)
    if row.mla:
        m.update(attention_type="mla", qk_head_dim=row.mla["qk_nope_head_dim"],
                 qk_pos_emb_head_dim=row.mla["qk_rope_head_dim"], v_head_dim=row.mla["v_head_dim"],
                 q_lora_rank=row.mla["q_lora_rank"], kv_lora_rank=row.mla["kv_lora_rank"])
    return m, approx


def strategy_config(row: Row) -> tuple[dict, list[str]]:
    """SimuMax strategy dict (docs/strategy.md fields) and the approximations it carries."""
    if row.out_of_scope:
        raise NotExpressible(f"dev set: {row.out_of_scope}")
    if row.gbs % (row.dp * row.mbs):
        raise NotExpressible(f"gbs {row.gbs} is not a multiple of dp*mbs = {row.dp * row.mbs}")
    approx: list[str] = []
    s = {
        "seq_len": row.seq, "micro_batch_size": row.mbs, "micro_batch_num": row.microbatches,
        "dtype": "bf16", "fp8": row.dtype == "fp8", "world_size": row.n_gpus,
        "tp_size": row.tp, "cp_size": row.cp, "pp_size": row.pp, "ep_size": row.ep, "etp_size": 1,
        "enable_sequence_parallel": row.sp and row.tp > 1, "interleaving_size": row.vp,
        "use_flash_sdp": True, "use_math_sdp": False,
        # 1 = Megatron's distributed optimizer; FSDP2 rows say 3, which SimuMax uses for memory only.
        "zero_state": row.zero,
    }
    if row.zero >= 2:
        approx.append("ZeRO-3/FSDP2: SimuMax shards weights in memory but prices DP traffic as ZeRO-1 (one "
                      "reduce-scatter + one all-gather per step; config.py: 'zero_state 2 and 3 ... ignored')")
    layers = row.layers
    every_layer = ceil_to(layers, row.pp * row.vp)  # >= the layer count model_config prices (it may pad)
    if row.pp > 1 and row.vp == 1 and layers % row.pp:
        # SimuMax's own strategy search splits uneven models this way (perf_llm.py check_pp_valid).
        s["num_layers_in_last_pipeline_stage"] = layers - math_ceil(layers, row.pp) * (row.pp - 1)
    if row.pp > 1 and row.vp > 1:
        # SimuMax's analysis_cost() refuses async VPP: "use pp_comm_async=False for perf timing" (its message).
        s["pp_comm_async"] = False
        approx.append("interleaved PP priced with pp_comm_async=False (SimuMax's perf timing has no async VPP)")
    if row.cp > 1:
        # The runs use ring attention (Megatron cp_comm_type p2p / torch context_parallel). SimuMax's timing path
        # implements only cp_comm_type a2a (its all_gather branch raises NotImplementedError in dense_module.py).
        s["cp_comm_type"] = "a2a"
        approx.append("CP ring (p2p) exchange priced as SimuMax's a2a CP, the only CP kind its timing implements")
    if row.recompute == "full":
        s.update(enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=every_layer)
    elif row.recompute == "selective" and row.stack == "megatron":
        # Megatron's selective recompute = core attention only: SimuMax's sdp_only granularity.
        s.update(enable_recompute=True, recompute_granularity="sdp_only", recompute_layer_num=every_layer)
    else:
        s.update(enable_recompute=False, recompute_granularity=None, recompute_layer_num=0)
        if row.recompute == "selective":
            approx.append("torchtitan op-level selective AC priced as no recompute (SimuMax has no op-level "
                          "policy; the matmul outputs it saves are what SimuMax stores)")
    if row.tp_comm_overlap:
        approx.append("TP comm overlap (userbuffers) not priced: SimuMax has no TP-overlap option")
    return s, approx


def math_ceil(a: int, b: int) -> int:
    return -(-a // b)


def _simumax(checkout: Path):
    """SimuMax's config classes and PerfLLM, imported from ``checkout`` (the folder holding simumax/)."""
    config, perf = from_checkout(checkout, "simumax/core/perf_llm.py", "simumax.core.config", "simumax.core.perf_llm")
    return config.ModelConfig, config.StrategyConfig, config.SystemConfig, perf.PerfLLM


def load_shipped(checkout: Path) -> dict[str, dict]:
    """The shipped system files of ``SHIPPED``, parsed."""
    return {k: json.loads((checkout / rel).read_text(encoding="utf-8")) for k, rel in SHIPPED.items()}


_GB = re.compile(r"([0-9.]+)\s*(GB|MB|KB|B)$")


def _gb(text: str) -> float:
    m = _GB.search(str(text).strip())
    if not m:
        return float("nan")
    return float(m.group(1)) * {"GB": 1, "MB": 1 / 1024, "KB": 1 / 1024**2, "B": 1 / 1024**3}[m.group(2)]


def predict(row: Row, checkout: Path, base: str = "b200", shipped: dict | None = None) -> Prediction:
    """Run SimuMax's PerfLLM on ``row``; the step time is tokens per step / (its tokens/s/GPU * GPUs)."""
    pred, inputs = map_row(row, f"{PEER}:{base}", model_config, strategy_config)
    if inputs is None:
        return pred
    model, strat = inputs
    system, pred.system_file = system_config(shipped or load_shipped(checkout), row.gpu, base)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ModelConfig, StrategyConfig, SystemConfig, PerfLLM = _simumax(checkout)
            perf = PerfLLM()
            perf.configure(strategy_config=StrategyConfig.init_from_dict(strat),
                           model_config=ModelConfig.init_from_dict(model),
                           system_config=SystemConfig.init_from_dict(system))
            perf.run_estimate()
            cost = perf.analysis_cost().data
            mem = perf.analysis_mem().data
    except Exception as exc:  # noqa: BLE001 - any failure inside the peer is its answer for this row
        pred.status, pred.reason = "error", f"{type(exc).__name__}: {exc}".strip()[:300]
        return pred
    tokens = float(cost["all_tokens_per_iter"])
    pred.predicted_step_s = tokens / (float(cost["throughput_per_accelerator"]) * row.n_gpus)
    pred.status = "approx" if pred.approximations else "ok"
    peak = max((_gb(v.get("peak_mem", "")) for v in mem.values() if isinstance(v, dict)), default=float("nan"))
    if not math.isnan(peak) and peak > MACHINES[row.gpu].mem_gb:
        pred.notes.append(f"SimuMax peak memory {peak:.1f} GB > {MACHINES[row.gpu].mem_gb} GB")
    missed = sum(len(v) for v in perf.system.miss_efficiency.values())
    if missed:
        pred.notes.append(f"{missed} op shape(s) at the file's default efficiency (not in its per-shape table)")
    for msg in sorted({str(w.message) for w in caught}):
        if "zero_state 2 and 3" in msg:
            pred.notes.append(f"SimuMax: {msg}")
    return pred
