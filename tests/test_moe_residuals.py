"""``bench/moe_residuals.py``: the dev set's MoE rows reduced to a residual per MoE layer and micro-batch.

Truths: the arithmetic worked by hand from a row's published and predicted step, its layout and its model's config
(Qwen3-30B-A3B: 48 MoE layers of 128 experts, ``data/model_configs``), and the host CPU the device catalogue names.
"""
from __future__ import annotations

import pytest

from tests.helpers import load_bench

residuals = load_bench("moe_residuals", "moe_row")


def _row(name: str, fix: str, cluster: str, published_s: float, predicted_s: float, moe: bool = True) -> dict:
    return {"name": name, "source": "B1", "published_step_s": published_s, "predicted_step_s": predicted_s,
            "error": (predicted_s - published_s) / published_s,
            "inputs": {"model": "qwen3-30b-a3b", "cluster": cluster, "global_batch": 512, "fix": fix, "moe": moe}}


def test_a_row_is_reduced_to_its_residual_per_moe_layer_and_micro_batch() -> None:
    # DP 8 x MBS 4 -> 16 micro-batches a rank; PP 2 -> 24 of the 48 MoE layers a rank; EP 8 -> 16 experts a rank;
    # 1 s left unpriced -> 1000 / (24 * 16) ms each
    r = residuals.moe_row(_row("a", "dp=8,pp=2,ep=8,mbs=4,cuda_graphs=layers", "2x8xB200", 10.0, 9.0))
    assert (r.local_experts, r.micro_batches, r.moe_layers_per_rank, r.cuda_graphs) == (16, 16, 24, "layers")
    assert r.residual_ms == pytest.approx(1000 / (24 * 16))
    assert (r.device, r.host_cpu) == ("B200", "x86")
    grace = residuals.moe_row(_row("b", "dp=8,ep=8,mbs=4", "2x4xGB200-NVL72", 9.0, 9.0))
    assert (grace.host_cpu, grace.cuda_graphs, grace.residual_ms) == ("grace", "searched", 0.0)


def test_dense_and_unpriced_rows_are_left_out() -> None:
    assert residuals.moe_row(_row("d", "dp=8,mbs=4", "1x8xB200", 10.0, 9.0, moe=False)) is None
    assert residuals.moe_row({**_row("u", "dp=8,mbs=4", "1x8xB200", 10.0, 9.0), "predicted_step_s": None}) is None


def test_groups_take_the_median_of_rows_alike() -> None:
    rows = [residuals.moe_row(_row(str(i), "dp=8,ep=8,mbs=4,cuda_graphs=layers", "1x8xB300", 10.0, pred))
            for i, pred in enumerate((9.0, 8.0, 10.5))]
    rows.append(residuals.moe_row(_row("g", "dp=8,ep=8,mbs=4,cuda_graphs=layers", "2x4xGB300-NVL72", 10.0, 9.0)))
    (x86,), (grace,) = ([g for g in residuals.groups(rows) if g["host_cpu"] == h] for h in ("x86", "grace"))
    per_s = 1000 / (48 * 16)  # ms of residual per second of step
    assert x86["rows"] == 3 and x86["residual_ms_median"] == pytest.approx(1.0 * per_s)
    assert (x86["residual_ms_min"], x86["residual_ms_max"]) == pytest.approx((-0.5 * per_s, 2.0 * per_s))
    assert grace["rows"] == 1 and grace["models"] == ["qwen3-30b-a3b"]
