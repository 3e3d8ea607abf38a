"""GLM-4.5 and GLM-4.5-Air (``glm4_moe``): the bundled configs count what Zhipu publishes, and plan end to end.

The independent figures: "GLM-4.5: Agentic, Reasoning, and Coding (ARC) Foundation Models" (arXiv 2508.06471),
Table 1, and the two model cards: GLM-4.5 has 355B total and 32B activated parameters, GLM-4.5-Air 106B and 12B.
Both counts are rounded to the billion, and the activated ones leave out the input embedding and the output layer
(with them GLM-4.5 activates 33.6B, and Air 13.4B). What the bridge's own GLM provider makes of the same files is
checked in tests/test_export_bridge.py.
"""
from __future__ import annotations

import json

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.planner.model.config import PRESET_DIR, load_model, spec_from_config

# (preset, total B, activated B without embedding and output layer): Table 1 of arXiv 2508.06471
PUBLISHED = [("glm-4.5", 355, 32), ("glm-4.5-air", 106, 12)]


@pytest.mark.parametrize("preset,total_b,active_b", PUBLISHED)
def test_counts_are_the_published_ones(preset: str, total_b: int, active_b: int) -> None:
    m = load_model(preset)
    embeddings = 2 * m.vocab_size * m.hidden_size  # untied: input embedding and output layer
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert (m.active_params - embeddings) / 1e9 == pytest.approx(active_b, rel=0.02)


def test_layers_are_the_reports_dense_moe_and_mtp_split() -> None:
    """Table 1: GLM-4.5 has 3 dense layers, 89 MoE layers and 1 MTP layer; Air 1, 45 and 1."""
    for preset, dense, moe in (("glm-4.5", 3, 89), ("glm-4.5-air", 1, 45)):
        m = load_model(preset)
        assert (m.num_layers - len(m.moe_layers), len(m.moe_layers), m.config_mtp_layers) == (dense, moe, 1)
        assert set(m.moe_layers) == set(range(dense, dense + moe))


def test_partial_rotary_outside_its_range_is_one_line() -> None:
    cfg = json.loads((PRESET_DIR / "glm-4.5-air.json").read_text()) | {"partial_rotary_factor": 1.5}
    with pytest.raises(MeshplanError, match="partial_rotary_factor"):
        spec_from_config(cfg, where="air.json", name="air", source="air.json")


def test_plan_and_megatron_export(runner, tmp_path) -> None:
    """A free search for GLM-4.5-Air on four H100 nodes (two cannot hold its 106B in training state), and its
    Megatron launch script carries the attention the config describes (Megatron-LM's flags: q/k/v biases, RoPE on
    half of each head, no QK-norm for Air)."""
    out = tmp_path / "air.yaml"
    r = runner.invoke(app, ["plan", "-m", "glm-4.5-air", "-c", "4x8xH100", "-b", "256", "-s", "4096",
                            "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), "--to", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--add-qkv-bias" in r.output and "--rotary-percent 0.5" in r.output
    assert "--qk-layernorm" not in r.output
