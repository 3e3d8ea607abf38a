"""Gemma 2 and Gemma 3 (``gemma2``, ``gemma3_text``): the bundled configs count what Google publishes and what
transformers' own model classes hold, and plan and export end to end.

The independent figures: Table 2 of the Gemma 2 report ("Gemma 2: Improving Open Language Models at a Practical
Size", arXiv 2408.00118), non-embedding parameters 2,024,517,888 / 8,324,201,984 / 26,047,480,320 for 2B / 9B / 27B
(its embedding column counts a vocabulary padded to 256,128, the configs' is 256,000), and Table 1 of the Gemma 3
report (arXiv 2503.19786), non-embedding 698M / 3,209M / 10,759M / 25,600M for 1B / 4B / 12B / 27B, rounded to the
million. What Megatron-Bridge's own Gemma providers make of the same files is checked in tests/test_export_bridge.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.planner.model.config import PRESET_DIR, load_model, spec_from_config

GEMMA2_NON_EMBEDDING = {"gemma-2-2b": 2_024_517_888, "gemma-2-9b": 8_324_201_984, "gemma-2-27b": 26_047_480_320}
GEMMA3_NON_EMBEDDING_M = {"gemma-3-1b": 698, "gemma-3-4b": 3_209, "gemma-3-12b": 10_759, "gemma-3-27b": 25_600}
PRESETS = [*GEMMA2_NON_EMBEDDING, *GEMMA3_NON_EMBEDDING_M]


@pytest.mark.parametrize("preset,count", GEMMA2_NON_EMBEDDING.items())
def test_gemma2_counts_are_the_reports_to_the_parameter(preset: str, count: int) -> None:
    assert load_model(preset).non_embedding_params == count


@pytest.mark.parametrize("preset,millions", GEMMA3_NON_EMBEDDING_M.items())
def test_gemma3_counts_are_the_reports_to_the_million(preset: str, millions: int) -> None:
    assert round(load_model(preset).non_embedding_params / 1e6) == millions


def _hf_model(cfg: dict):
    """transformers' own causal LM of ``cfg``, on the meta device (no weights allocated)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig
    config_cls, model_cls = ((Gemma2Config, Gemma2ForCausalLM) if cfg["model_type"] == "gemma2"
                             else (Gemma3TextConfig, Gemma3ForCausalLM))
    config = config_cls(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        return config, model_cls(config)


@pytest.mark.parametrize("preset", PRESETS)
def test_counts_and_windows_are_transformers_own(preset: str) -> None:
    """Every parameter transformers' Gemma2ForCausalLM / Gemma3ForCausalLM creates from the file (the pre- and
    post-norms, q/k norms and the tied embedding among them), and the layers its config makes local."""
    cfg = json.loads((PRESET_DIR / f"{preset}.json").read_text())
    config, model = _hf_model(cfg)
    m = load_model(preset)
    assert m.num_params == sum(p.numel() for p in model.parameters())
    assert m.window_layers == tuple(i for i, k in enumerate(config.layer_types) if k == "sliding_attention")
    assert m.sliding_window == config.sliding_window


def test_the_caps_are_gemma2s_alone() -> None:
    g2, g3 = load_model("gemma-2-9b"), load_model("gemma-3-12b")
    assert (g2.attn_softcap, g2.logit_softcap, g2.qk_norm) == (50.0, 30.0, False)
    assert (g3.attn_softcap, g3.logit_softcap, g3.qk_norm) == (0.0, 0.0, True)


def test_bad_input_is_one_line() -> None:
    """A Gemma 3 vision-language config, an activation Gemma does not run and a bad window list are each refused
    in one line naming the file."""
    cfg = json.loads((PRESET_DIR / "gemma-3-4b.json").read_text())
    cases = [({"model_type": "gemma3", "text_config": cfg}, "vision-language"),
             (cfg | {"hidden_activation": "silu"}, "hidden_activation"),
             (cfg | {"layer_types": ["full_attention"] * 3}, "layer_types")]
    for bad, word in cases:
        with pytest.raises(MeshplanError, match=word) as exc:
            spec_from_config(bad, where="g.json", name="g", source="g.json")
        assert str(exc.value).startswith("g.json: ") and "\n" not in str(exc.value)


@pytest.mark.parametrize("stack", [[], ["--stack", "nemo"]])
def test_softcapped_attention_runs_unfused_under_megatron(runner, tmp_path, stack: list[str]) -> None:
    """Megatron-Bridge (and NeMo) run Gemma 2's capped scores in their unfused attention
    (``Gemma2DotProductAttention``), whatever kernel the stack runs for other models (NeMo 24.07's profile names
    FlashAttention-2): a free search takes it, and a pinned cuDNN attention is refused in one line, exit 2."""
    out = tmp_path / "g2.yaml"
    r = runner.invoke(app, ["plan", "-m", "gemma-2-2b", "-c", "1x8xH100", "-b", "64", "-s", "8192", "--out",
                            str(out), "--json", *stack])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert plans and {p["attention"] for p in plans} == {"unfused"}
    r = runner.invoke(app, ["plan", "-m", "gemma-2-2b", "-c", "1x8xH100", "-b", "64", "-s", "8192", "--fix",
                            "attention=cudnn", "--out", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "attn_logit_softcapping 50" in r.output and r.output.count("\n") == 1


def test_exports(runner, tmp_path) -> None:
    """Megatron-LM's flags cannot build Gemma (one line, exit 2); Megatron-Bridge's Gemma recipe can."""
    out = tmp_path / "g2.yaml"
    r = runner.invoke(app, ["plan", "-m", "gemma-2-9b", "-c", "2x8xH100", "-b", "128", "-s", "8192", "--out",
                            str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), "--to", "megatron"])
    assert r.exit_code == 2 and "--quick-geglu" in r.output and r.output.count("\n") == 1
    r = runner.invoke(app, ["export", str(out), "--to", "megatron-bridge"])
    assert r.exit_code == 0, r.output
    assert "RECIPE=gemma2_9b_pretrain_config" in r.output


def test_unfused_attention_masks_the_window_over_the_whole_scores() -> None:
    """Megatron-Bridge's Gemma 2 attention (``get_swa``) and HF's eager attention compute every score and mask the
    window: under unfused attention a local layer costs what a global one does; a fused kernel skips the band's
    outside."""
    from meshplan.planner.estimate.ops_graph import layer_ops
    from meshplan.planner.layout.layout import Layout
    m = load_model("gemma-2-2b")
    local, full = m.window_layers[0], min(set(range(m.num_layers)) - set(m.window_layers))
    unfused, fused = Layout(attention="unfused"), Layout(attention="flash")
    assert layer_ops(m, local, unfused, 8192).core_attention == layer_ops(m, full, unfused, 8192).core_attention
    assert layer_ops(m, local, fused, 8192).core_attention != layer_ops(m, full, fused, 8192).core_attention


def test_unfused_attention_takes_no_context_parallelism(runner, tmp_path) -> None:
    """Megatron-Core's unfused ``DotProductAttention`` asserts context_parallel_size == 1."""
    r = runner.invoke(app, ["plan", "-m", "gemma-2-2b", "-c", "1x8xH100", "-b", "64", "-s", "8192", "--fix",
                            "cp=2", "--out", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "no context parallelism" in r.output and r.output.count("\n") == 1


def test_explain_says_no_curve_measures_a_256_wide_head() -> None:
    """Gemma's 256-wide heads: no published attention curve here measures them (H100: the d128 curve; GB200: the
    DeepSeek-V3 d192 one), and the price's source says so."""
    from meshplan.costmodel.api import Pricer
    from meshplan.costmodel.devices import get_device
    from meshplan.costmodel.ops import OpSpec
    op = OpSpec("attention", (1, 8, 8192, 8192, 256), "bf16", causal=True, impl="cudnn")
    pricer = Pricer()
    for device, words in (("H100-SXM", "no head-dim-256 measurement here: the d128 curve"),
                          ("GB200", "no head-dim-256 measurement: the d192 rate")):
        assert words in pricer.predict_with_source(op, get_device(device))[1]


def test_windowed_layers_take_no_ring_context_parallelism(runner, tmp_path) -> None:
    """Transformer Engine runs a sliding window under context parallelism only with the all-gather or all-to-all
    exchange (context_parallel.py, ``attn_forward_func_with_cp``): a free search at cp=2 leaves ring out, a pinned
    ring is refused in one line."""
    args = ["plan", "-m", "gemma-3-27b", "-c", "4x8xH100", "-b", "256", "-s", "8192", "--out",
            str(tmp_path / "g3.yaml")]
    r = runner.invoke(app, [*args, "--fix", "cp=2", "--json", "--top", "10"])
    assert r.exit_code == 0, r.output
    kinds = {p["cp_kind"] for p in json.loads(r.output)["plans"]}
    assert kinds and "ring" not in kinds
    r = runner.invoke(app, [*args, "--fix", "cp=2,cp_kind=ring"])
    assert r.exit_code == 2 and "sliding-window" in r.output and r.output.count("\n") == 1
