"""Qwen3-Next and Qwen3.5 (``qwen3_next``, ``qwen3_5_text``, ``qwen3_5_moe_text``): Gated DeltaNet layers beside
gated attention, counted, priced and refused as the published sources have them.

The independent figures: transformers' own ``Qwen3NextForCausalLM`` built from the bundled config (every parameter,
on the meta device) and the model card's "80B in total and 3B activated"; Megatron-Bridge's own FLOP count of a
Gated DeltaNet layer (``training/utils/flop_utils.py`` @ v0.5.1, evaluated by hand below); FLA's published GB200
timings of ``chunk_gated_delta_rule`` (``costmodel/data/published/fla_chunk_gdn_gb200.json``), which price each
shape left out of the fit. What Megatron-Bridge's own Qwen3-Next bridge makes of the config is checked in
tests/test_export_bridge.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.costmodel import gdn
from meshplan.costmodel.devices import get_device
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import PRESET_DIR, load_model, spec_from_config
from meshplan.planner.model.flops import gdn_macs_per_token

PRESET = "qwen3-next-80b-a3b"


# The bundled config cut to two of its four-layer periods and 16 experts (top-2): transformers builds the whole 80B
# model's 73k modules in half a minute, this in a second, and every count below is per layer, expert and head.
SMALL = {"num_hidden_layers": 8, "num_experts": 16, "num_experts_per_tok": 2}


def _config(**update) -> dict:
    return json.loads((PRESET_DIR / f"{PRESET}.json").read_text()) | update


@pytest.fixture(scope="module")
def hf_small():
    """(config dict, transformers' own Qwen3-Next causal LM of it on the meta device: no weights allocated)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = _config(**SMALL)
    config = Qwen3NextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        return cfg, config, Qwen3NextForCausalLM(config)


def test_counts_are_transformers_own_and_the_model_cards(hf_small) -> None:
    """Every parameter transformers creates (Gated DeltaNet's projections, conv, dt_bias, A_log and gated norm; the
    gated attention's twice-wide q_proj; the shared expert's gate), the active count as the experts transformers
    holds leave it, and the layers it makes linear attention; the bundled model at the card's 80B total, 3B
    activated."""
    cfg, config, model = hf_small
    m = spec_from_config(cfg, where="q.json", name="q", source="q.json")
    assert m.num_params == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    idle = config.num_experts - config.num_experts_per_tok
    assert m.active_params == m.num_params - experts * idle // config.num_experts
    assert m.gdn_layers == tuple(i for i, k in enumerate(config.layer_types) if k == "linear_attention")
    full = load_model(PRESET)
    assert (round(full.num_params / 1e9), int(full.active_params // 1e9)) == (80, 3)


# Qwen3.5's text decoders as transformers 5.24.0's own Qwen3_5MoeForCausalLM / Qwen3_5ForCausalLM count them, built
# on the meta device from the bundled configs' values (2026-11-30; CI's transformers 4.57 has no Qwen3.5 class):
# (total, active) parameters, the names' 35B-A3B and 9B
QWEN35_TRANSFORMERS_5_24 = {"qwen3.5-35b-a3b": (34_660_610_688, 3_454_988_928),
                            "qwen3.5-9b": (8_953_803_264, 8_953_803_264)}


@pytest.mark.parametrize("preset,counts", QWEN35_TRANSFORMERS_5_24.items())
def test_qwen35_counts_are_transformers_5s(preset: str, counts: tuple[int, int]) -> None:
    m = load_model(preset)
    assert (m.num_params, m.active_params) == counts
    assert (m.rotary_percent, m.rope_theta) == (0.25, 1e7)  # read from rope_parameters
    assert m.gdn_layers == tuple(i for i in range(m.num_layers) if (i + 1) % 4)


def test_qwen35_vision_language_configs_are_refused_by_name() -> None:
    """A Qwen3.5 checkpoint's own config.json wraps the decoder in a vision-language model: refused in one line that
    says which part to save."""
    cfg = json.loads((PRESET_DIR / "qwen3.5-35b-a3b.json").read_text())
    with pytest.raises(MeshplanError, match="text_config") as exc:
        spec_from_config({"model_type": "qwen3_5_moe", "text_config": cfg}, where="q.json", name="q", source="q.json")
    assert str(exc.value).startswith("q.json: ") and "\n" not in str(exc.value)


def test_layer_kinds_follow_layer_types() -> None:
    """Three Gated DeltaNet layers, then one of attention, each with its MoE (the config's interval 4); a
    ``layer_types`` list given is read as it stands; a wrong one is refused in one line naming the file."""
    m = load_model(PRESET)
    assert [m.layer_kind(i) for i in range(8)] == ["GE", "GE", "GE", "*E"] * 2
    cfg = _config()
    mine = ["full_attention"] + ["linear_attention"] * 47
    spec = spec_from_config(cfg | {"layer_types": mine}, where="q.json", name="q", source="q.json")
    assert spec.layer_kind(0) == "*E" and spec.layer_kind(47) == "GE"
    for bad in (["linear_attention"] * 3, ["sliding_attention"] * 48):
        with pytest.raises(MeshplanError, match="layer_types") as exc:
            spec_from_config(cfg | {"layer_types": bad}, where="q.json", name="q", source="q.json")
        assert str(exc.value).startswith("q.json: ") and "\n" not in str(exc.value)


def test_a_gdn_layers_flops_are_megatron_bridges() -> None:
    """Megatron-Bridge's ``gdn_layer_flops`` per token for Qwen3-Next (h 2048, q/k 16 x 128, v 32 x 128, conv 4):
    2048 (2 2048 + 2 4096 + 2 32) + 4 (2 2048 + 4096) + 32 128^2 4 + 2048 4096 multiply-adds."""
    assert gdn_macs_per_token(load_model(PRESET)) == 35_815_424


def _loo(rows: list[dict], column: str, i: int) -> float:
    """Row ``i``'s time (ms) as the fit over the other rows prices it, constant included."""
    t0, s = gdn.fit([r for j, r in enumerate(rows) if j != i], column)
    return (t0 + s * gdn.gdn_flops(gdn.row_op(rows[i]))) * 1e3


@pytest.mark.parametrize("column,bound", [("chunk_gdn_fwd_ms", 0.11), ("chunk_gdn_fwdbwd_ms", 0.27)])
def test_the_fit_prices_each_shape_left_out(column: str, bound: float) -> None:
    """Leave one of FLA's six GB200 shapes out, fit the other five, price it: within 11% forward and 27% forward and
    backward (the worst is the tiny head-dim-64 shape), the bounds ``costmodel.gdn`` states."""
    rows = gdn.published_rows()
    errors = [abs(_loo(rows, column, i) / r[column] - 1) for i, r in enumerate(rows)]
    assert max(errors) <= bound, errors


def test_the_gb200_price_is_the_measured_time_less_the_per_call_constant() -> None:
    """On the GB200 an op's price is the fit's GPU work (forward, and forward + backward less forward) plus the
    kernels' launch floors: the measured time less the fit's constant, within the fit's own residual (8% forward,
    16% forward + backward over all six shapes)."""
    rows, dev = gdn.published_rows(), get_device("GB200")
    (t_f, _), (t_fb, _) = gdn.fit(rows, "chunk_gdn_fwd_ms"), gdn.fit(rows, "chunk_gdn_fwdbwd_ms")
    for r in rows:
        fwd = gdn.time_s(gdn.row_op(r), dev) - gdn.FWD_KERNELS * gdn.KERNEL_LAUNCH_S
        bwd = gdn.time_s(gdn.row_op(r, backward=True), dev) - gdn.BWD_KERNELS * gdn.KERNEL_LAUNCH_S
        assert fwd + t_f == pytest.approx(r["chunk_gdn_fwd_ms"] * 1e-3, rel=0.08)
        assert fwd + bwd + t_fb == pytest.approx(r["chunk_gdn_fwdbwd_ms"] * 1e-3, rel=0.16)


def test_a_gdn_layers_gemms_are_its_weights(hf_small) -> None:
    """The forward GEMMs of a Gated DeltaNet layer and of a gated-attention layer at tp 2 multiply by exactly the
    weights transformers gives their mixers (in_proj_qkvz, in_proj_ba and out_proj; q_proj with its gate, k_proj,
    v_proj and o_proj), over tp; the scan runs on this rank's 16 of 32 value heads."""
    cfg, _, model = hf_small
    m = spec_from_config(cfg, where="q.json", name="q", source="q.json")
    lay = Layout(tp=2, sequence_parallel=True)
    for layer, module, names in ((0, "linear_attn", ("in_proj_qkvz", "in_proj_ba", "out_proj")),
                                 (3, "self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"))):
        mixer = layer_ops(m, layer, lay, 4096).blocks[0]
        weights = sum(op.shape[1] * op.shape[2] for op in mixer if op.kind == "matmul" and not op.backward)
        hf = getattr(model.model.layers[layer], module)
        assert weights == sum(getattr(hf, n).weight.numel() for n in names) // 2
    scans = [op for op in layer_ops(m, 0, lay, 4096).compute if op.kind == "gdn"]
    assert [op.shape for op in scans] == [(1, 16, 4096, 128, 128)]


def test_splits_megatron_core_cannot_run_are_refused(runner, tmp_path) -> None:
    """Megatron-Core's GatedDeltaNet splits its heads over tp and has no context parallelism: a pinned cp is refused
    in one line (exit 2), and a free search never proposes one."""
    m = load_model(PRESET)
    assert m.split_problem(2, 1) == "" and "key heads" in m.split_problem(32, 1)
    assert "no context parallelism" in m.split_problem(1, 2)
    r = runner.invoke(app, ["plan", "-m", PRESET, "-c", "2x8xH100", "-b", "64", "-s", "8192", "--fix", "cp=2",
                            "--out", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "GatedDeltaNet has no context parallelism" in r.output
    assert r.output.count("\n") == 1
    r = runner.invoke(app, ["plan", "-m", PRESET, "-c", "2x8xH100", "-b", "64", "-s", "8192", "--json", "--top",
                            "20", "--out", str(tmp_path / "y.yaml")])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert plans and {p["cp"] for p in plans} == {1}


def test_exports(runner, tmp_path) -> None:
    """Megatron-Bridge's qwen3_next recipe builds the model, and Megatron-LM's own flags do (read back into
    megatron-core's TransformerConfig in tests/test_export_megatron_core.py); Qwen3.5 has no v0.3.1 bridge recipe,
    which is refused by name (one line, exit 2)."""
    out = tmp_path / "qn.yaml"
    r = runner.invoke(app, ["plan", "-m", PRESET, "-c", "2x8xH100", "-b", "128", "-s", "4096", "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), "--to", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--experimental-attention-variant gated_delta_net" in r.output and "--linear-attention-freq 4" in r.output
    r = runner.invoke(app, ["export", str(out), "--to", "megatron-bridge"])
    assert r.exit_code == 0, r.output
    assert "RECIPE=qwen3_next_80b_a3b_pretrain_config" in r.output
    out = tmp_path / "q35.yaml"
    r = runner.invoke(app, ["plan", "-m", "qwen3.5-9b", "-c", "1x8xH100", "-b", "64", "-s", "4096", "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), "--to", "megatron-bridge"])
    assert r.exit_code == 2 and "qwen3_5_text" in r.output and r.output.count("\n") == 1


def test_explain_says_what_the_scan_rests_on(runner, tmp_path) -> None:
    """``--explain`` names FLA's GB200 timings as the scan's source, and on an H100 says no timing there is
    published and the host constant is not priced."""
    r = runner.invoke(app, ["plan", "-m", PRESET, "-c", "2x8xH100", "-b", "64", "-s", "4096", "--explain", "--top",
                            "1", "--out", str(tmp_path / "x.yaml")], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "FLA's chunk_gated_delta_rule" in r.output
    assert "no timing on H100-SXM is published" in r.output and "is not priced" in r.output
