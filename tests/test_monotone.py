"""Physical monotonicity of the step price, on published runs of four kinds, each planned as ``bench/dev_set.py
--profile-only`` plans it (its layout pinned, its stack profile).

Two truths that need no measurement: a faster network between nodes never makes the same layout's step slower (nor a
slower one faster), and twice the global batch on the same layout takes at least the step it took and at most twice
it (twice the micro-batches through the same kernels and links; the pipeline fill, gradient exchange and optimizer
step are paid once either way). A price that breaks either has an error somewhere that the published step times
alone would not show: it could cancel against another. Over every priced dev-set row (258 of them, 2026-11-29) none
broke either, network x0.5 / x2 and batch x2 (``bench/monotone.py``; BENCHMARKS.md, "The step price is monotone in
the network and the batch"); these four rows keep the check in the default suite.
"""
from __future__ import annotations

import pytest

from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.search.job import PlanRequest, plan_job
from tests.helpers import data_path, load_dev_set

dev_set = load_dev_set()

ROWS = (
    "nemo2407-gpt3-175b-512",  # dense, TP 4 x PP 8 interleaved over 64 nodes' InfiniBand (NeMo 24.07)
    "mbridge26.04-deepseekv3-gb200-mxfp8",  # MoE on NVL72 racks, MXFP8, host wait, Hybrid-EP (Megatron-Bridge)
    "automodel-dsv3-256",  # FSDP2 + PP over 32 nodes, DeepEP across nodes (NeMo AutoModel)
    "row52",  # dense FSDP2 over 128 GPUs (torchtitan)
)


@pytest.fixture(scope="module")
def inputs():
    runs = data_path("published_runs")
    rows = {r["name"]: r for r in dev_set.load_rows(runs)}
    return {name: dev_set.row_needs(rows[name], runs, True) for name in ROWS}


def _step_s(inp, tmp_path, global_batch=None, net=None) -> float:
    out = plan_job(PlanRequest.of(inp.model, inp.cluster, global_batch or inp.global_batch, inp.seq_len,
                                  fix=inp.fix_string, stack=inp.profile, top=1, dtype=inp.dtype, name="monotone",
                                  lora=inp.lora, task=inp.task, net=net, out=tmp_path / "p.yaml"))
    return out.rows[0]["step_time_s"]


@pytest.mark.parametrize("name", ROWS)
def test_a_faster_network_never_prices_a_step_slower(inputs, tmp_path, name):
    inp = inputs[name]
    assert not inp.missing and not inp.out_of_scope, (name, inp.missing, inp.out_of_scope)
    per_gpu = load_cluster(inp.cluster).inter_link.bandwidth_bytes_per_s
    base = _step_s(inp, tmp_path)
    slower = _step_s(inp, tmp_path, net=f"{per_gpu / 2 / 1e9:.6f}GB/s")
    faster = _step_s(inp, tmp_path, net=f"{per_gpu * 2 / 1e9:.6f}GB/s")
    assert faster <= base * (1 + 1e-9) <= slower * (1 + 1e-9), (name, slower, base, faster)
    # the network carries something in each of these runs: halving it costs time
    assert slower > base, (name, slower, base)


@pytest.mark.parametrize("name", ROWS)
def test_twice_the_batch_takes_between_once_and_twice_the_step(inputs, tmp_path, name):
    inp = inputs[name]
    base = _step_s(inp, tmp_path)
    double = _step_s(inp, tmp_path, global_batch=2 * inp.global_batch)
    assert base <= double <= 2 * base, (name, base, double)
