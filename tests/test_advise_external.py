"""``meshplan advise`` on real traces other projects published (``../shared/traces/external``): the layout inferred
from each multi-rank job's traces is the one its README states (the line checked is quoted in each test), and
traces advice cannot use get one line saying what they lack, exit 2.

Each set is read from the repository's ``data/`` (``tests.helpers.data_path``).
"""
from __future__ import annotations

import pytest

from meshplan.cli.main import app
from meshplan.planner.cluster.spec import load_cluster
from meshplan.profiler.runs import load_run
from meshplan.verify.advise.evidence import rank_evidence
from meshplan.verify.advise.infer import HIGH, infer_layout
from meshplan.verify.advise.job import cluster_of
from meshplan.verify.advise.shape import hf_config
from tests.helpers import DATA, data_path


def _infer(path):
    run = load_run(path)
    evs = [rank_evidence(t) for t in run.ranks.values()]
    return infer_layout(evs, run.world_size or len(run.ranks))


def _refusal(runner, path, tmp_path) -> str:
    r = runner.invoke(app, ["advise", str(path), "--out", str(tmp_path / "advised.yaml")])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    return lines[0]


def test_megatron_tp8_job_is_tensor_parallel_8(runner, tmp_path):
    # README: "a Megatron-LM GPT job with tensor parallelism 8 on one 8 x A100-SXM4-80GB node";
    # "`distributedInfo = {"backend": "nccl", "rank": r, "world_size": 8}`";
    # "`ncclDevKernel_AllReduce_Sum_f16_RING_LL` x81"
    path = data_path("traces", "external", "astra_megatron_tp8_a100")
    inf = _infer(path)
    assert inf.value("world_size") == 8
    assert inf.value("tp") == 8 and inf.parts["tp"].confidence == HIGH
    assert inf.value("pp") == 1 and inf.value("ep") == 1
    assert inf.value("dtype") == "fp16"
    # the model as its GEMMs show it: GPT-2's vocabulary (50,257) padded by Megatron-LM to a multiple of
    # make-vocab-size-divisible-by (128) x tp (8) = 51,200 (megatron/training/tokenizer _vocab_size_with_padding),
    # split over the 8 ranks: 6,400 rows each
    cfg = hf_config(inf.shape, inf.value("tp"), inf.value("pp"), vocab_parallel=True)
    assert cfg["vocab_size"] == 51200 and cfg["n_embd"] == 4096 and cfg["n_head"] * 64 == cfg["n_embd"]
    assert cfg["n_positions"] == 2048
    # the cluster it ran on: one node of the README's 8 x A100-SXM4-80GB
    cluster = load_cluster(cluster_of(load_run(path), 8))
    assert cluster.world_size == 8 and cluster.groups[0].devices_per_node == 8
    assert "A100" in cluster.device.name and cluster.device.memory_bytes > 70e9
    # the README's 8 ranks each trace a forward pass only (no autograd node in any of them): advice says so
    assert not inf.backward
    assert "no backward pass" in _refusal(runner, path, tmp_path)


def test_deepseek_v3_rank_is_expert_parallel_64_with_deepep(runner, tmp_path):
    # README: "DeepSeek-V3 training (DualPipe, EP64) profile, rank 0 of 64"; "EP64 / TP1";
    # "Communication is DeepEP (`dpsk::ep::internode::dispatch/combine` kernels on stream 27), not NCCL kernels"
    path = data_path("traces", "external", "deepseek_v3_train_h800_r0")
    inf = _infer(path)
    assert inf.value("world_size") == 64
    assert inf.value("ep") == 64 and inf.value("tp") == 1
    assert "DeepEP" in inf.parts["ep"].evidence
    # DeepSeek-V3 trains its GEMMs in fp8 with 1x128 / 128x128 block scaling (DeepSeek-V3 report §3.3)
    assert inf.value("fp8") == "blockwise"
    # one sampled rank whose collectives name no process group: the data-parallel degrees cannot be told
    line = _refusal(runner, path, tmp_path)
    assert "of 64 present" in line and "process group" in line


def test_mi300_resnet_rank_is_ddp_8_with_activation_checkpointing(runner, tmp_path):
    # README: "ResNet DDP training with activation checkpointing, rank 0 of 8, AMD MI300X, RCCL";
    # "`distributedInfo`: nccl backend (RCCL), rank 0, world_size 8"
    path = data_path("traces", "external", "tracelens_mi300_resnet_ddp_r0")
    inf = _infer(path)
    assert inf.value("world_size") == 8
    assert inf.value("dp_replicate") == 8 and inf.parts["dp_replicate"].confidence == HIGH
    assert inf.value("tp") == 1 and inf.value("pp") == 1 and inf.value("zero") == 0
    assert inf.value("recompute") != "none"
    # a CNN: no attention, so no decoder shape to plan
    assert "pass --model" in _refusal(runner, path, tmp_path)


def test_thinned_gloo_rank_says_what_is_missing(runner, tmp_path):
    # README: "rank 34 of 300"; "the training thread has no ops inside the step"
    path = data_path("traces", "external", "hta_cpu_only_gloo_r34")
    assert "no GEMM or collective ran" in _refusal(runner, path, tmp_path)


@pytest.mark.parametrize("name", ["tracelens_h100_qwen05b", "tracelens_h100_bert_small"])
def test_forward_only_single_gpu_traces_are_refused(runner, tmp_path, name):
    # README (qwen05b): "forward pass (no backward ops), single H100"
    path = data_path("traces", "external", name)
    assert "no backward pass" in _refusal(runner, path, tmp_path)


def test_committed_gloo_ddp_run_is_data_parallel_2(runner, tmp_path):
    # tests/data/profiler/gloo_ddp_2rank/PROVENANCE.md: "a 3-layer MLP ... wrapped in DistributedDataParallel",
    # "torchrun --nproc_per_node 2"
    inf = _infer(DATA / "profiler" / "gloo_ddp_2rank")
    assert inf.value("dp_replicate") == 2 and inf.value("tp") == 1 and inf.value("recompute") == "none"
    assert inf.value("dtype") == "fp32"
    assert "pass --model" in _refusal(runner, DATA / "profiler" / "gloo_ddp_2rank", tmp_path)
