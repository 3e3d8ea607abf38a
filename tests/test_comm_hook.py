"""The plan's gradient compression as a real DDP communication hook, on 2 gloo processes."""
import gc
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshplan.planner.export.comm_hook import register_plan_hook
from meshplan.planner.plan.schema import BucketCompression


class _Plan:  # the hook reads only ``compression``
    def __init__(self, method, param=0.0):
        self.compression = (BucketCompression(bucket=0, size_bytes=4 * 4096, method=method, param=param),)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = [("none", 0, 1e-6), ("fp16", 0, 1e-3), ("bf16", 0, 1e-2), ("int8", 0, 0.03), ("topk", 0.25, 0.9),
         ("powersgd", 4, 0.9)]


def _worker(rank, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    errors = {}
    for method, param, _ in CASES:
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 64, bias=False)
        ddp = torch.nn.parallel.DistributedDataParallel(lin)
        assert register_plan_hook(ddp, _Plan(method, param)) == (method != "none")
        torch.manual_seed(100 + rank)
        x = torch.randn(32, 64)
        for _ in range(3):  # PowerSGD starts compressing after its warm-up iterations
            ddp.zero_grad()
            ddp(x).pow(2).sum().backward()
        # the exact average of both ranks' gradients, computed by hand
        ref = torch.autograd.grad(lin(x).pow(2).sum(), lin.weight)[0]
        dist.all_reduce(ref)
        ref /= 2
        errors[method] = float((lin.weight.grad - ref).norm() / ref.norm())
        # Free this DDP (its reducer and hook state) while the process group is alive: a reducer destroyed after
        # destroy_process_group aborted rank 0 once at exit ("terminate called without an active exception").
        del ddp, lin
        gc.collect()
    if rank == 0:
        q.put(errors)
    dist.barrier()
    dist.destroy_process_group()


def test_hook_compresses_and_stays_close_to_the_true_average():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(_worker, args=(_free_port(), q), nprocs=2, start_method="spawn", join=True)
    errors = q.get(timeout=5)
    for method, _, bound in CASES:
        assert errors[method] <= bound, f"{method}: relative error {errors[method]:.3g}"
        if method in ("int8", "topk", "powersgd"):
            assert errors[method] > 1e-6, f"{method} did not compress"  # really lossy: the hook ran
