"""bench/peers: a dev-set row becomes SimuMax / Calculon inputs that carry the row's published layout.

Truths: the dev set README's layout table (GPUs, TP/PP/VP/CP/EP/DP, GBS/MBS/seq), torchtitan's own statements of
world size and global batch for its rows, published parameter counts (Llama-2-70B 68,976,648,192 and Llama-3.1-8B
8,030,261,248, Hugging Face transformers' count of the released checkpoints), NVIDIA's DGX H100 datasheet (8x 400 Gb/s
ConnectX-7 per node, NVLink 900 GB/s bidirectional). The mapping tests need neither peer. The tests marked ``peer``
load a peer's own config parser or network model from a checkout named by MESHPLAN_SIMUMAX / MESHPLAN_CALCULON and
skip when it is not there (the peers are not installed in CI).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, data_path

sys.path.insert(0, str(REPO / "bench" / "peers"))
import calculon_adapter as ca
import simumax_adapter as sa
from peer_rows import NotExpressible, load_rows


@pytest.fixture(scope="module")
def rows():
    return {r.name: r for r in load_rows(data_path("published_runs", "dev_runs.jsonl"))}


def readme_layouts() -> dict[str, dict]:
    """The README's per-source tables: name -> GPUs, TP, PP, VP, CP, EP, DP (None where it says '?'), GBS, MBS, seq."""
    out = {}
    for line in data_path("published_runs", "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 9 or not re.match(r"^(nemo|automodel)", cells[0]):
            continue
        lay = {k.lower(): (None if v == "?" else int(v)) for k, v in re.findall(r"(TP|PP|VP|CP|EP|DP)(\d+|\?)",
                                                                                 cells[3])}
        gbs, mbs, seq = (int(x) for x in cells[4].split("/"))
        out[cells[0]] = dict(gpus=int(cells[2].split()[0]), gbs=gbs, mbs=mbs, seq=seq, **lay)
    return out


def test_readme_tables_cover_the_megatron_and_automodel_rows(rows):
    lay = readme_layouts()
    assert len(lay) == 25  # 12 S1 + 3 S1f + 10 S5 (README: "12 pre-train + 3 SFT", "10")
    assert set(lay) <= set(rows)


def test_simumax_strategy_has_the_published_layout(rows):
    for name, want in readme_layouts().items():
        row = rows[name]
        if row.out_of_scope:
            with pytest.raises(NotExpressible, match="hybrid Mamba"):
                sa.strategy_config(row)
            continue
        s, _ = sa.strategy_config(row)
        assert s["world_size"] == want["gpus"], name
        assert (s["tp_size"], s["pp_size"], s["cp_size"]) == (want["tp"], want["pp"], want["cp"]), name
        # SimuMax's dp_size is world_size / (tp * pp * cp) (simumax/core/config.py StrategyConfig.dp_size)
        assert s["world_size"] // (s["tp_size"] * s["pp_size"] * s["cp_size"]) == want["dp"], name
        if want["vp"] is not None:  # "VP?": the table does not say (peer_rows takes it from the launch scripts)
            assert s["interleaving_size"] == want["vp"], name
        if want["ep"] is not None:
            assert s["ep_size"] == want["ep"], name
        # SimuMax's global_batch_size = micro_batch_size * micro_batch_num * dp_size
        assert (s["micro_batch_size"], s["seq_len"]) == (want["mbs"], want["seq"]), name
        assert s["micro_batch_size"] * s["micro_batch_num"] * want["dp"] == want["gbs"], name


def test_calculon_execution_has_the_published_layout_or_says_why_not(rows):
    expressed = 0
    for name, want in readme_layouts().items():
        row = rows[name]
        if row.out_of_scope or row.moe or want["cp"] > 1:
            reason = "hybrid Mamba" if row.out_of_scope else ("mixture of experts" if row.moe else "context par")
            with pytest.raises(NotExpressible, match=reason):
                ca.execution(row)
            continue
        exe, _ = ca.execution(row)
        app, _ = ca.application(row)
        expressed += 1
        assert exe["num_procs"] == want["gpus"] == exe["tensor_par"] * exe["pipeline_par"] * exe["data_par"], name
        assert (exe["tensor_par"], exe["pipeline_par"], exe["data_par"]) == (want["tp"], want["pp"], want["dp"])
        if want["vp"] is not None:
            assert exe["pipeline_interleaving"] == want["vp"], name
        assert (exe["batch_size"], exe["microbatch_size"], app["seq_size"]) == (want["gbs"], want["mbs"],
                                                                                 want["seq"]), name
    assert expressed == 13  # S1 without its two CP rows, and the three SFT rows


# torchtitan's own words for its rows (world size, global batch):
# docs/performance.md @ 4d88a8a: "64 A100 (80GB)", "global batch size = local batch size 1 * number of FSDP ranks 64
#   = 64"; 405B: "128 H100 GPUs", "global batch size = local batch size 2 * number of FSDP ranks 16 = 32".
# benchmarks/llama3_h100_202412_torchtitan.md: Table 1 "8 GPUs. Local batch size 2, global batch size 16"; Table 3
#   "128 GPUs. Local batch size 2, global batch size 256".
TORCHTITAN = {"row39": (64, 64), "row40": (64, 64), "row41": (64, 64), "row42": (128, 32), "row45": (8, 16),
              "row46": (8, 16), "row52": (128, 256), "row53": (128, 256)}


def test_torchtitan_rows_keep_their_world_size_and_global_batch(rows):
    for name, (gpus, gbs) in TORCHTITAN.items():
        row = rows[name]
        assert row.n_gpus == gpus and row.gbs == gbs, name
        s, _ = sa.strategy_config(row)
        assert s["world_size"] == gpus and s["micro_batch_size"] * s["micro_batch_num"] * row.dp == gbs, name
        exe, _ = ca.execution(row)
        assert exe["num_procs"] == gpus and exe["batch_size"] == gbs, name
    # Table 1 "FSDP | 5,762" tokens/s/GPU on 8 GPUs, 16 x 8192 tokens per step: the README's step-time convention
    assert rows["row45"].published_step_s == pytest.approx(16 * 8192 / (5762 * 8), rel=1e-9)


@pytest.mark.parametrize("name, published_params", [
    ("nemo2407-llama2-70b", 68_976_648_192),  # GQA (8 KV heads) + SwiGLU, TP4
    ("row45", 8_030_261_248),  # Llama-3.1-8B: GQA + SwiGLU, vocabulary 128256
])
def test_calculon_block_keeps_the_real_block_weights(rows, name, published_params):
    """Calculon has MHA and a 2-matrix MLP; the FLOP-equivalent feedforward keeps every block GEMM (and weight)."""
    row = rows[name]
    app, approx = ca.application(row)
    h, a, d = app["hidden"], app["attn_heads"], app["attn_size"]
    calculon_block = 4 * h * a * d + 2 * h * app["feedforward"]  # calculon/llm/llm.py: Q, K, V, MLP block linears
    # what Calculon does not model: untied input/output embeddings, two norms per block, the final norm
    outside = 2 * row.vocab * h + (2 * row.layers + 1) * h
    assert calculon_block * row.layers + outside == published_params
    assert any("FLOP-equivalently" in x for x in approx)


def test_simumax_model_has_the_published_shape(rows):
    m, approx = sa.model_config(rows["automodel-dsv3-256"])
    # DeepSeek-V3 (arXiv 2412.19437 §4.2): 61 layers, first 3 dense, 256 routed + 1 shared expert, top-8, MLA with
    # q_lora 1536, kv_lora 512, 128 heads of 128 + 64 rope dims; PP4 x VP8 needs whole chunks in SimuMax
    assert (m["expert_num"], m["topk"], m["dense_layers"], m["attention_type"]) == (256, 8, 3, "mla")
    assert (m["q_lora_rank"], m["kv_lora_rank"], m["qk_head_dim"], m["qk_pos_emb_head_dim"]) == (1536, 512, 128, 64)
    assert m["moe_shared_expert_intermediate_size"] == m["moe_ffn_hidden_size"] == 2048
    assert m["layer_num"] == 64 and "61 -> 64" in approx[0]


def _shipped_like() -> dict[str, dict]:
    """The two shipped SimuMax system files reduced to the fields the derivation touches (their real shape)."""
    op = lambda eff: {"tflops": 1.0, "efficient_factor": eff}
    net = {"processor_usage": 0.0, "bandwidth": {"efficient_factor": 1.0, "gbps": 900.0, "latency_us": 35},
           "op": {}}
    accel = {"backend": "cuda", "mem_gbs": 80, "mode": "roofline",
             "op": {"default": op(0.4), "matmul": op(0.5), "fp8_matmul": op(0)},
             "bandwidth": {"default": {"efficient_factor": 0.7, "gbps": 8000.0, "latency_us": 30}}}
    return {"b200": {"accelerator": accel, "FC8": False,
                     "networks": {"intra_with_pcie": False, "low_intra_node": net, "high_intra_node": dict(net),
                                  "inter_node": {**net, "bandwidth": {**net["bandwidth"], "gbps": 200}}}},
            "a100": {"accelerator": accel, "networks": {}}}


def test_simumax_h100_file_carries_dgx_h100_figures():
    system, how = sa.system_config(_shipped_like(), "H100", "b200")
    # DGX H100: 8 NICs x 400 Gb/s = 3200 Gb/s = 400 GB/s for the node; SimuMax's field is per node
    assert system["networks"]["inter_node"]["bandwidth"]["gbps"] == 8 * 400 / 8 == 400
    assert system["networks"]["high_intra_node"]["bandwidth"]["gbps"] == 900 / 2  # NVLink4, per direction
    assert system["num_per_node"] == 8 and "400 GB/s per node" in how
    op = system["accelerator"]["op"]
    assert op["matmul"]["tflops"] == pytest.approx(1979 / 2, rel=1e-3)  # datasheet 1,979 TFLOP/s with sparsity
    assert op["fp8_matmul"]["efficient_factor"] == op["matmul"]["efficient_factor"]  # unmeasured fp8 -> bf16's


# --- with the peers' own code (skipped unless a checkout is named) -----------------------------------------------

def _checkout(var: str, marker: str) -> Path:
    path = os.environ.get(var)
    if not path or not (Path(path) / marker).exists():
        pytest.skip(f"{var} does not name a checkout (peers are not installed here)")
    return Path(path)


def test_simumax_parses_every_mapped_row_and_prices_a_nic_at_50_gbytes(rows):
    ck = _checkout("MESHPLAN_SIMUMAX", "simumax/core/perf_llm.py")
    try:
        ModelConfig, StrategyConfig, SystemConfig, PerfLLM = sa._simumax(ck)
    except ImportError as exc:
        pytest.skip(f"SimuMax's dependencies are missing here: {exc}")
    shipped = sa.load_shipped(ck)
    for row in rows.values():
        if row.out_of_scope:
            continue
        perf = PerfLLM()
        perf.configure(strategy_config=StrategyConfig.init_from_dict(sa.strategy_config(row)[0]),
                       model_config=ModelConfig.init_from_dict(sa.model_config(row)[0]),
                       system_config=SystemConfig.init_from_dict(sa.system_config(shipped, row.gpu, "a100")[0]))
    m = ModelConfig.init_from_dict(sa.model_config(rows["nemo2407-llama2-70b"])[0])
    assert m.param_numel == 68_976_648_192
    system = SystemConfig.init_from_dict(sa.system_config(shipped, "H100", "b200")[0])
    size = 1 << 30
    t_ms = system.compute_net_op_time("p2p", size, comm_num=2, net="inter_node")
    net = system.networks["inter_node"]
    eff = net.op["p2p"].efficient_factor or net.bandwidth.efficient_factor
    gbytes_per_s = size / ((t_ms - net.bandwidth.latency_us / 1e3) / 1e3) / 1024**3 / eff
    assert gbytes_per_s == pytest.approx(400 / 8)  # one ConnectX-7: 400 Gb/s


def test_calculon_accepts_every_expressible_row(rows):
    ck = _checkout("MESHPLAN_CALCULON", "calculon/llm/llm.py")
    try:
        calculon, Llm = ca._calculon(ck)
    except ImportError as exc:
        pytest.skip(f"Calculon's dependencies are missing here: {exc}")
    for row in rows.values():
        try:
            app, _ = ca.application(row)
            exe, _ = ca.execution(row)
        except NotExpressible:
            continue
        syst = calculon.System(calculon.io.read_json_file(str(ck / ca.SYSTEMS[row.gpu])))
        model = Llm(Llm.Application(app), None)
        model.compile(syst, Llm.Execution.from_json(exe))  # raises Llm.Error on a layout Calculon rejects
