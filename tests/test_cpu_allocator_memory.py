"""Predicted peak memory against PyTorch's own allocator on real CPU training steps (issue 13 item 3).

The truth is a measurement: ``bench/cpu_memory.py`` runs the example trainer under ``torch.profiler`` with
``profile_memory=True`` and takes the largest "Total Allocated" of the trace's memory events. The default run
measures a small GPT-2-shaped model (a few seconds); the slow one the bench's GPT-2 124M cases.
"""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.helpers import REPO, data_path

_spec = importlib.util.spec_from_file_location("cpu_memory", REPO / "bench" / "cpu_memory.py")
cpu_memory = sys.modules.setdefault("cpu_memory", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(cpu_memory)

SMALL_GPT2 = {"architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new", "attn_pdrop": 0.0,
              "embd_pdrop": 0.0, "resid_pdrop": 0.0, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
              "n_ctx": 512, "n_embd": 256, "n_head": 4, "n_inner": None, "n_layer": 4, "n_positions": 512,
              "tie_word_embeddings": True, "torch_dtype": "float32", "use_cache": False, "vocab_size": 8192}


def _error(config, batch, seq, recompute) -> float:
    measured = cpu_memory.allocator_peak_bytes(config, batch, seq, recompute)
    pred = cpu_memory.predicted_bytes(config, batch, seq, recompute)
    total = pred["weights_bytes"] + pred["grads_bytes"] + pred["optimizer_bytes"] + pred["activations_bytes"]
    return total / measured - 1


def test_small_gpt2_step_within_10_percent_of_the_allocator(tmp_path):
    """One micro-batch, no recomputation: the peak is backward's first op, with the weights, AdamW's moments, every
    fp32 activation and the loss's 12 B per logit, and no gradient yet (``estimate.grads_born_in_backward``)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_GPT2))
    assert abs(_error(config, 4, 256, "none")) <= 0.10


@pytest.mark.slow
@pytest.mark.parametrize("batch, seq, recompute", cpu_memory.CASES)
def test_gpt2_124m_steps_within_10_percent_of_the_allocator(batch, seq, recompute):
    assert abs(_error(data_path("model_configs", "gpt2.json"), batch, seq, recompute)) <= 0.10
