"""The gradient reduction's wire dtype (``Layout.reduce_dtype``), against a real FSDP2 run and the launchers.

The truth for the bytes is torch itself: two gloo processes shard a bf16 model with FSDP2 under the profiler, once
with ``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` (what torchtitan always runs, and AutoModel's MoE
blocks) and once without a reduce dtype (the gradients reduce in the parameters' bf16). The trace's recorded
all-gather and reduce-scatter inputs give the bytes per parameter on the wire, which meshplan must price."""
from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshplan.core.errors import MeshplanError
from meshplan.planner.estimate.memory import param_bytes, reduce_bytes_per_param
from meshplan.planner.export import render
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import Pins
from tests.test_export_golden import VARIANTS

WIDTH = 64  # two Linear(64, 64) layers: 2 x 4160 parameters, split evenly over 2 ranks (no FSDP padding)
ELEMENT_BYTES = {"float": 4, "c10::BFloat16": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, trace_dir, q):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.profiler import ProfilerActivity, profile

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = {}
    for name, reduce in (("fp32", torch.float32), ("none", None)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)).to(torch.bfloat16)
        numel = sum(p.numel() for p in model.parameters())
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
        for layer in model:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        x = torch.randn(8, WIDTH, dtype=torch.bfloat16)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model(x).float().sum().backward()
        path = os.path.join(trace_dir, f"{name}-{rank}.json")
        prof.export_chrome_trace(path)
        out[name] = (path, numel)
        del model
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _wire_bytes(path: str) -> dict[str, float]:
    """Bytes per rank each collective kind moved, from the trace's recorded input shapes and types."""
    moved = {"all_gather": 0.0, "reduce_scatter": 0.0}
    for ev in json.load(open(path))["traceEvents"]:
        name, args = ev.get("name", ""), ev.get("args", {})
        kind = ("all_gather" if name == "gloo:all_gather" else
                "reduce_scatter" if name == "c10d::_reduce_scatter_base_" else None)
        if kind is None:
            continue
        # all_gather: the shard sent (x 2 ranks = the unsharded tensor); reduce_scatter: its whole input
        dims, dtype = args["Input Dims"], args["Input type"][0]
        numel = dims[1][0] if kind == "reduce_scatter" else 2 * dims[0][0]
        moved[kind] += numel * ELEMENT_BYTES[dtype]
    return moved


@pytest.fixture(scope="module")
def fsdp2_traces(tmp_path_factory):
    trace_dir = str(tmp_path_factory.mktemp("fsdp2_reduce"))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(_worker, args=(_free_port(), trace_dir, q), nprocs=2, start_method="spawn", join=True)
    return q.get(timeout=5)


def _layout(**kw) -> Layout:
    return Layout(dp_shard=2, zero_stage=3, **kw)


@pytest.mark.parametrize("policy, layout_kw", [
    ("fp32", dict(stack="torchtitan")),  # torchtitan's own: fp32, unpinned
    ("fp32", dict(stack="eager", reduce_dtype="fp32")),
    ("none", dict(stack="eager")),  # plain FSDP2 without a reduce dtype: the bf16 gradients as they are
    ("none", dict(stack="torchtitan", reduce_dtype="bf16")),
])
def test_priced_wire_bytes_match_a_real_fsdp2_run(fsdp2_traces, policy, layout_kw):
    path, numel = fsdp2_traces[policy]
    moved = _wire_bytes(path)
    layout = _layout(**layout_kw)
    # one forward and one backward gather per layer, one reduce-scatter: 2x and 1x the parameters
    assert moved["all_gather"] == 2 * numel * param_bytes("bf16")
    assert moved["reduce_scatter"] == numel * reduce_bytes_per_param(layout, "bf16"), (
        f"{policy}: the run reduced {moved['reduce_scatter'] / numel:g} B per parameter, meshplan priced "
        f"{reduce_bytes_per_param(layout, 'bf16')}")


def test_fix_key_is_validated():
    assert Pins.of({"reduce_dtype": "fp32"}).reduce_dtype == "fp32"
    with pytest.raises(MeshplanError, match="reduce_dtype 'fp16' is not one of bf16, fp32"):
        Layout(dp_shard=2, zero_stage=3, reduce_dtype="fp16").validate(
            world_size=2, num_layers=2, num_heads=8, num_kv_heads=8, seq_len=1024, global_batch=8)


def test_exports_carry_or_name_it():
    fp32, bf16 = VARIANTS["reduce-fp32"](), VARIANTS["reduce-bf16"]()
    # DeepSpeed: communication_data_type (its own parser reads it back: test_export_parsers)
    ds = render(fp32, "deepspeed")
    assert json.loads(ds.text)["communication_data_type"] == "fp32"
    assert not [n for n in ds.warnings if "reduce_dtype" in n]
    # Megatron-Core reduces in its gradient buffer's dtype: bf16 is --grad-reduce-in-bf16
    assert "--grad-reduce-in-bf16" in render(bf16, "megatron").text.split()
    assert "--grad-reduce-in-bf16" not in render(fp32, "megatron").text.split()
    # torchtitan reduces in float32 only: a bf16 plan is named, an fp32 one is what it runs
    assert any("reduce_dtype=bf16" in n for n in render(bf16, "torchtitan").warnings)
    tt = render(fp32, "torchtitan")
    assert not any("reduce_dtype" in n for n in tt.warnings)
    assert 'mixed_precision_reduce = "float32"' in tt.text
    # the example trainer (torchrun) keeps fp32 parameters under autocast: it reduces in fp32, and has no bf16 option
    assert any("reduce_dtype=bf16" in n for n in render(bf16, "torchrun").warnings)
    assert not any("reduce_dtype" in n for n in render(fp32, "torchrun").warnings)
    # DeepSpeed is told what a plan left at its stack's own priced: torchtitan's fp32
    titan = VARIANTS["stack-torchtitan"]()
    assert json.loads(render(titan, "deepspeed").text).get("communication_data_type") == "fp32"


def test_megatron_buffer_follows_a_pinned_reduction_dtype():
    """Megatron-Core has one dtype for its main-grad buffer and their reduction (--grad-reduce-in-bf16 makes both
    bf16), so a pinned reduce_dtype sizes the buffer as grad_dtype would; other stacks keep them apart (FSDP2
    reduces in fp32 into a shard of the parameter's dtype)."""
    from meshplan.planner.estimate.memory import grad_bytes_per_param

    for stack, expect in (("megatron", 2), ("torchtitan", 2), ("eager", 2)):
        lay = Layout(dp_shard=8, zero_stage=1, stack=stack, reduce_dtype="bf16")
        assert grad_bytes_per_param(lay, "bf16") == expect, stack
    assert grad_bytes_per_param(Layout(dp_shard=8, zero_stage=1, stack="megatron"), "bf16") == 4  # fp32 main grads
    assert grad_bytes_per_param(Layout(dp_shard=8, zero_stage=3, stack="torchtitan", reduce_dtype="fp32"),
                                "bf16") == 2  # FSDP2: reduced in fp32, kept as the parameter's dtype


def test_the_estimator_prices_the_wire_dtype():
    """torchtitan's fp32 reduction (and FSDP2's copy-in, a cast) costs more than the same FSDP step in bf16."""
    from meshplan.costmodel.api import Pricer
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.estimate.gpu import GpuEstimator
    from meshplan.planner.model.config import load_model

    est = GpuEstimator(Pricer.shipped())
    work = Workload(load_model("llama-3.1-8b"), load_cluster("2x8xH100"), 64, 8192, "bf16")
    fp32, bf16 = (est.estimate(work, Layout(dp_shard=16, zero_stage=3, stack="torchtitan", recompute="full",
                                            reduce_dtype=r)) for r in ("fp32", "bf16"))
    assert fp32.exposed_comm_s > bf16.exposed_comm_s
    assert fp32.other_s > bf16.other_s  # the copy-in into the fp32 reduce buffer: a cast, 6 B per element, not 4
    assert fp32.memory.total_bytes == bf16.memory.total_bytes
