"""examples/train_gpt.py is a faithful GPT-2 and its knobs do what they say (no launch; single process)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.helpers import REPO, shared_path


def _trainer():
    spec = importlib.util.spec_from_file_location("train_gpt", REPO / "examples" / "train_gpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tg = _trainer()


def _count(args: list[str]) -> int:
    a = tg.parse_args(args)
    with torch.device("meta"):
        m = tg.Stage(a, 0, a.layers, first=True, last=True)
    return sum(p.numel() for p in m.parameters())


def test_gpt2_parameter_count_is_golden():
    # 124,439,808: openai-community/gpt2, golden count in ../shared/model_configs/PROVENANCE.md.
    assert _count(["--config", str(shared_path("model_configs", "gpt2.json"))]) == 124_439_808


def test_tiny_gpt_config_matches_the_planner():
    from meshplan.planner.model.config import load_model

    cfg = REPO / "examples" / "tiny-gpt" / "config.json"
    # Two independent counts: the trainer's real modules and the planner's closed form.
    assert _count(["--config", str(cfg)]) == load_model(str(cfg)).num_params


def test_pipeline_split_covers_every_layer_once():
    a = tg.parse_args(["--layers", "7", "--pp", "3"])
    spans = [tg.stage_layers(a, r) for r in range(3)]
    assert spans == [(0, 3), (3, 2), (5, 2)]


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_activation_checkpointing_keeps_gradients(recompute):
    """Recomputing activations changes memory, never the math: gradients equal the plain run's."""
    grads = {}
    for mode in ("none", recompute):
        a = tg.parse_args(["--layers", "2", "--hidden", "32", "--heads", "4", "--vocab", "64", "--seq-len", "8",
                           "--recompute", mode])
        torch.manual_seed(0)
        m = tg.Stage(a, 0, a.layers, first=True, last=True)
        x = torch.randint(0, a.vocab, (2, a.seq_len), generator=torch.Generator().manual_seed(1))
        tg.lm_loss(a)(m(x), x).backward()
        grads[mode] = torch.cat([p.grad.flatten() for p in m.parameters()])
    assert torch.allclose(grads["none"], grads[recompute], rtol=1e-5, atol=1e-6)


def test_heavy_mlp_repeats_the_work_not_the_result():
    torch.manual_seed(0)
    light, heavy = tg.MLP(32, 128, 1), tg.MLP(32, 128, 3)
    heavy.load_state_dict(light.state_dict())
    x = torch.randn(4, 32)
    assert torch.allclose(light(x), heavy(x), atol=1e-6)
    with torch.profiler.profile() as prof:
        heavy(x)
    n_linear = sum(e.count for e in prof.key_averages() if e.key == "aten::linear")
    assert n_linear == 6  # fc1 + fc2, three times


def test_bad_layout_names_the_numbers():
    a = tg.parse_args(["--tp", "3", "--heads", "4"])
    with pytest.raises(SystemExit, match="heads 4 and ffn 512 must be divisible by tp 3"):
        tg.check_layout(a, 3)
    a = tg.parse_args(["--dp-shard", "2", "--global-batch", "6", "--micro-batch", "2"])
    with pytest.raises(SystemExit, match="global batch 6 not divisible by micro batch 2 x dp 2"):
        tg.check_layout(a, 2)
