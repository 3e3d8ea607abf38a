#!/usr/bin/env python
"""A small GPT in plain PyTorch that applies a meshplan plan for real.

Run it under torchrun (or ``meshplan profile``); it needs nothing from meshplan unless ``--plan`` is given::

    torchrun --standalone --nproc-per-node 2 examples/train_gpt.py --dp-shard 2 --steps 10
    meshplan profile --from-plan plans/tiny-gpt.yaml --out runs/tiny examples/train_gpt.py

Parallelism (world = pp * dp_replicate * dp_shard * tp, one device mesh with those dimension names):

* data parallel: ``DistributedDataParallel`` when dp_replicate > 1 and nothing else is parallel; with TP or PP
  the replicas all-reduce their gradients explicitly (DDP does not take DTensor parameters or pipeline stages);
* FSDP2: ``torch.distributed.fsdp.fully_shard`` over dp_shard (HSDP over (dp_replicate, dp_shard) when both > 1);
* tensor parallel: ``parallelize_module`` - attention q/k/v and MLP fc1 column-wise, attention out and MLP fc2
  row-wise (the Megatron-LM split, Shoeybi et al. 2019, Fig. 3);
* pipeline parallel: ``torch.distributed.pipelining`` ``PipelineStage`` + ``Schedule1F1B`` / ``ScheduleGPipe``;
* micro-batching: global_batch / (micro_batch * dp) micro-batches per step (gradient accumulation, or the
  pipeline's micro-batches); activation checkpointing: ``full`` (whole block) or ``selective`` (attention core).

Synthetic data: seeded random tokens, distinct per data-parallel rank, identical across TP/PP peers.
Knobs for tests: ``--delay-rank R --delay-ms X`` sleeps X ms on rank R at the start of every step (a straggler,
recorded as the CPU op ``meshplan::delay``); ``--heavy-mlp K`` runs each MLP K times (an op class made
K times heavier, forward and backward).
On GPUs the same code uses NCCL and ``cuda:LOCAL_RANK``; here it uses gloo on the CPU.
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


# ---------------------------------------------------------------------------------------------- knobs
@torch.library.custom_op("meshplan::delay", mutates_args=())
def delay_op(x: torch.Tensor, ms: float) -> torch.Tensor:
    """Sleep ``ms`` milliseconds. A dispatcher op, so the trace shows it as the CPU op ``meshplan::delay``
    (a what-if can name it: ``name~meshplan::delay@R=K``)."""
    time.sleep(ms / 1e3)
    return x.clone()


# ---------------------------------------------------------------------------------------------- model
class Attention(nn.Module):
    """Causal multi-head self-attention; head count per rank follows the TP split of q/k/v."""

    def __init__(self, hidden: int, heads: int, selective: bool):
        super().__init__()
        self.head_dim = hidden // heads
        self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.selective = selective

    @staticmethod
    def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under TP the column-sharded projections hold heads / tp heads each.
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.selective and self.training:
            # Selective recompute (Korthikanti et al. 2022): keep the projections, recompute attention.
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """fc1 -> GELU -> fc2; ``repeats`` > 1 runs it that many times (the ``--heavy-mlp`` knob)."""

    def __init__(self, hidden: int, ffn: int, repeats: int = 1):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.repeats = repeats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(F.gelu(self.fc1(x), approximate="tanh"))  # GPT-2's gelu_new
        for _ in range(self.repeats - 1):  # same result, K times the work
            out = out + self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        return out / self.repeats if self.repeats > 1 else out


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, hidden: int, heads: int, ffn: int, recompute: str, mlp_repeats: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, selective=recompute == "selective")
        self.mlp = MLP(hidden, ffn, mlp_repeats)
        self.full_recompute = recompute == "full"

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and self.training:
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


def _init_gpt2(m: nn.Module) -> None:
    # GPT-2's initializer_range 0.02 (HF GPT2PreTrainedModel._init_weights); torch's N(0, 1) embedding init
    # would start a tied head at logits of std ~sqrt(hidden) and a loss far above ln(vocab).
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


class Stage(nn.Module):
    """A contiguous slice of the GPT: embeddings on the first stage, LM head on the last (whole model if both)."""

    def __init__(self, a: argparse.Namespace, first_layer: int, num_layers: int, first: bool, last: bool):
        super().__init__()
        torch.manual_seed(a.seed)  # each piece seeded on its own: weights do not depend on the stage split
        self.tok = nn.Embedding(a.vocab, a.hidden) if first else None
        self.pos = nn.Embedding(a.positions, a.hidden) if first else None
        self.blocks = nn.ModuleList()
        for i in range(first_layer, first_layer + num_layers):
            torch.manual_seed(a.seed + 1 + i)
            self.blocks.append(Block(a.hidden, a.heads, a.ffn, a.recompute, a.heavy_mlp).apply(_init_gpt2))
        torch.manual_seed(a.seed + 1 + a.layers)
        self.norm = nn.LayerNorm(a.hidden) if last else None
        self.head = nn.Linear(a.hidden, a.vocab, bias=False) if last else None
        for m in (self.tok, self.pos, self.head):
            if m is not None:
                _init_gpt2(m)
        if first and last and a.tie_embeddings:
            self.head.weight = self.tok.weight  # GPT-2 ties the LM head to the token embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for blk in self.blocks:
            x = blk(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


# ---------------------------------------------------------------------------------------------- config
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", default=os.environ.get("MESHPLAN_PLAN") or None,
                   help="meshplan plan YAML (plans/x.yaml; default $MESHPLAN_PLAN); overrides layout and model flags")
    p.add_argument("--config", help="HF GPT-2 config.json (n_layer, n_embd, n_head, n_inner, vocab_size, "
                   "n_positions); overrides the model flags")
    p.add_argument("--dp-replicate", type=int, default=None, help="DDP degree (default: what the world leaves)")
    p.add_argument("--dp-shard", type=int, default=1, help="FSDP2 degree")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    p.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=3,
                   help="with --dp-shard: 3 reshards parameters after forward, 1/2 keep them")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=None, help="MLP width (default 4 * hidden)")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--positions", type=int, default=None, help="position table rows (default: seq len)")
    p.add_argument("--untied", action="store_true", help="separate LM head weight (GPT-2 ties it)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    # under `meshplan profile`, as many steps as the capture needs (warm-up + traced + unprofiled)
    p.add_argument("--steps", type=int, default=int(os.environ.get("MESHPLAN_CAPTURE_TOTAL_STEPS") or 10))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--delay-rank", type=int, default=None, help="rank that sleeps --delay-ms each step")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--heavy-mlp", type=int, default=1, help="run every MLP K times (K >= 1)")
    p.add_argument("--layout-report", default=None, help="folder: each rank writes rank<R>.json with the node "
                   "rank, pipeline stage, layers and degrees it ran (what a launch placed where)")
    a = p.parse_args(argv)
    if a.config:
        apply_config(a)
    if a.plan:
        apply_plan(a)
    a.ffn = a.ffn or 4 * a.hidden
    a.positions = max(a.positions or 0, a.seq_len)
    a.tie_embeddings = not a.untied
    a.stages = getattr(a, "stages", None)
    a.stage_devices = getattr(a, "stage_devices", None)
    return a


def apply_config(a: argparse.Namespace) -> None:
    """Model shape from a HuggingFace GPT-2 ``config.json``."""
    import json

    with open(a.config, encoding="utf-8") as fh:
        c = json.load(fh)
    a.layers, a.hidden, a.heads, a.vocab = c["n_layer"], c["n_embd"], c["n_head"], c["vocab_size"]
    a.ffn = c.get("n_inner") or 4 * a.hidden
    a.positions = c.get("n_positions")
    a.untied = a.untied or not c.get("tie_word_embeddings", True)


def apply_plan(a: argparse.Namespace) -> None:
    """Copy layout, batch and model shape from a meshplan plan onto the flags."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from meshplan.planner.plan.schema import load_plan

    plan = load_plan(a.plan)
    d = plan.degrees
    unsupported = {k: v for k, v in (("cp", d.cp), ("ep", d.ep), ("vpp", d.vpp)) if v != 1}
    if unsupported or plan.schedule == "interleaved":
        sys.exit(f"{a.plan}: train_gpt.py does not implement {unsupported or 'the interleaved schedule'}")
    if plan.recompute not in ("none", "selective", "full"):  # full:N, op
        sys.exit(f"{a.plan}: train_gpt.py does not implement recompute={plan.recompute}")
    a.dp_replicate, a.dp_shard, a.tp, a.pp = d.dp_replicate, d.dp_shard, d.tp, d.pp
    a.micro_batch, a.global_batch, a.seq_len = plan.micro_batch, plan.global_batch, plan.seq_len
    a.recompute, a.schedule = plan.recompute, plan.schedule
    m = plan.model
    a.layers, a.hidden, a.heads, a.ffn, a.vocab = (m.num_layers, m.hidden_size, m.num_attention_heads,
                                                   m.ffn_hidden_size, m.vocab_size)
    a.dtype = plan.dtype if plan.dtype in ("fp32", "bf16", "fp16") else "fp32"
    if a.dtype != plan.dtype:
        print(f"train_gpt.py: {a.plan}: dtype {plan.dtype} is not implemented; training in fp32", file=sys.stderr)
    elif plan.fp8 != "none":
        print(f"train_gpt.py: {a.plan}: fp8 recipe {plan.fp8} is not implemented; GEMMs in {a.dtype}",
              file=sys.stderr)
    if plan.attention_dtype == "fp8":
        print(f"train_gpt.py: {a.plan}: fp8 attention is not implemented; attention in {a.dtype}", file=sys.stderr)
    a.zero_stage = plan.zero_stage
    if plan.sequence_parallel:
        print(f"train_gpt.py: {a.plan}: sequence parallelism is not implemented; running plain TP", file=sys.stderr)
    a.stages = [(s.first_layer, s.num_layers) for s in plan.stages] if plan.stages else None
    a.stage_devices = [plan.cluster.groups[s.device_group].device for s in plan.stages] if plan.stages else None
    a.loaded_plan = plan  # its gradient compression becomes a DDP communication hook (planner.export.comm_hook)


def init_distributed() -> tuple[str, torch.device]:
    """Join the process group (a world of one when launched without torchrun)."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        backend, device = "nccl", torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend)
    return backend, device


def check_layout(a: argparse.Namespace, world: int) -> None:
    if a.dp_replicate is None:
        rest = a.dp_shard * a.tp * a.pp
        if world % rest:
            sys.exit(f"world size {world} is not divisible by dp_shard*tp*pp = {rest}")
        a.dp_replicate = world // rest
    total = a.dp_replicate * a.dp_shard * a.tp * a.pp
    problems = []
    if total != world:
        problems.append(f"dp_replicate*dp_shard*tp*pp = {total} but the world size is {world}")
    dp = a.dp_replicate * a.dp_shard
    if a.global_batch % (a.micro_batch * dp):
        problems.append(f"global batch {a.global_batch} not divisible by micro batch {a.micro_batch} x dp {dp}")
    if a.heads % a.tp or a.ffn % a.tp:
        problems.append(f"heads {a.heads} and ffn {a.ffn} must be divisible by tp {a.tp}")
    if a.layers < a.pp:
        problems.append(f"{a.layers} layers cannot fill {a.pp} pipeline stages")
    if a.pp > 1 and a.schedule == "1f1b" and a.global_batch // (a.micro_batch * dp) < a.pp:
        problems.append(f"1F1B needs at least pp={a.pp} micro-batches per step")
    if a.heavy_mlp < 1:
        problems.append(f"--heavy-mlp {a.heavy_mlp}: must be >= 1")
    if problems:
        sys.exit("train_gpt.py: " + "; ".join(problems))


def stage_layers(a: argparse.Namespace, pp_rank: int) -> tuple[int, int]:
    """(first layer, layer count) of a pipeline stage: the plan's split, else as even as possible."""
    if a.stages:
        return a.stages[pp_rank]
    base, extra = divmod(a.layers, a.pp)
    first = pp_rank * base + min(pp_rank, extra)
    return first, base + (1 if pp_rank < extra else 0)


def check_stage_device(a: argparse.Namespace, pp_rank: int, rank: int, device: torch.device) -> str:
    """The device this rank's stage was planned for; exits when a GPU of another family runs it (a node started
    with the wrong NODE_RANK in a heterogeneous pipeline). Returns the planned device, or ''."""
    want = a.stage_devices[pp_rank] if a.stage_devices else ""
    if want and device.type == "cuda":
        have = torch.cuda.get_device_name(device)
        family = want.split("-")[0].lower()  # catalogue "A100-80GB" vs CUDA "NVIDIA A100-SXM4-80GB"
        if family not in have.lower():
            sys.exit(f"train_gpt.py: rank {rank} runs pipeline stage {pp_rank}, planned for {want}, on a {have}; "
                     f"start each node with the NODE_RANK its device has in the launch script's table")
    return want


def write_layout_report(a: argparse.Namespace, mesh, rank: int, world: int, device: torch.device,
                        planned_device: str) -> None:
    """``<folder>/rank<R>.json``: where this rank landed and what it runs (read back by the export tests)."""
    import json

    pp_rank = mesh["pp"].get_local_rank()
    first, count = stage_layers(a, pp_rank)
    report = {"rank": rank, "world_size": world, "node_rank": int(os.environ.get("GROUP_RANK", -1)),
              "local_rank": int(os.environ.get("LOCAL_RANK", 0)), "pp_rank": pp_rank, "first_layer": first,
              "num_layers": count, "tp": a.tp, "pp": a.pp, "dp_replicate": a.dp_replicate, "dp_shard": a.dp_shard,
              "micro_batch": a.micro_batch, "global_batch": a.global_batch, "grad_accum": a.grad_accum,
              "planned_device": planned_device,
              "node_device_env": os.environ.get("MESHPLAN_NODE_DEVICE"),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}
    os.makedirs(a.layout_report, exist_ok=True)
    with open(os.path.join(a.layout_report, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh)


# ---------------------------------------------------------------------------------------------- parallelize
def apply_tp(stage: Stage, tp_mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    for blk in stage.blocks:
        parallelize_module(blk, tp_mesh, plan)


def apply_fsdp(stage: Stage, mesh, a: argparse.Namespace) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    dp_mesh = mesh["dp_replicate", "dp_shard"] if a.dp_replicate > 1 else mesh["dp_shard"]
    # ZeRO-3 frees gathered parameters after forward; ZeRO-1/2 keep them (FSDP2's reshard_after_forward=False
    # shards gradients and optimizer state only - ZeRO-2; FSDP2 has no ZeRO-1 mode, so stage 1 runs as 2).
    reshard = getattr(a, "zero_stage", 3) >= 3
    for blk in stage.blocks:
        fully_shard(blk, mesh=dp_mesh, reshard_after_forward=reshard)
    return fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard)


def build(a: argparse.Namespace, mesh, device: torch.device):
    """The local model piece, wrapped for the layout; returns (module to train, pipeline schedule or None)."""
    pp_rank = mesh["pp"].get_local_rank()
    first, count = stage_layers(a, pp_rank)
    torch.manual_seed(a.seed)
    stage = Stage(a, first, count, first=pp_rank == 0, last=pp_rank == a.pp - 1).to(device)
    if a.tp > 1:
        apply_tp(stage, mesh["tp"])
    model: nn.Module = stage
    if a.dp_shard > 1:
        model = apply_fsdp(stage, mesh, a)
    elif a.dp_replicate > 1 and a.tp == 1 and a.pp == 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(stage, process_group=mesh["dp_replicate"].get_group())
        plan = getattr(a, "loaded_plan", None)
        if plan is not None and plan.compression:
            from meshplan.planner.export.comm_hook import register_plan_hook

            register_plan_hook(model, plan, mesh["dp_replicate"].get_group())
    schedule = None
    if a.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        pstage = PipelineStage(model, pp_rank, a.pp, device, group=mesh["pp"].get_group())
        cls = Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe
        schedule = cls(pstage, n_microbatches=a.grad_accum, loss_fn=lm_loss(a))
    return model, schedule


def lm_loss(a: argparse.Namespace):
    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, a.vocab), target.reshape(-1))
    return loss_fn


def manual_dp_allreduce(model: nn.Module, group, size: int) -> None:
    """Average gradients over the replicate group (DDP's job where DDP cannot wrap the module)."""
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(g, group=group)
        g.div_(size)


# ---------------------------------------------------------------------------------------------- train
def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    backend, device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    check_layout(a, world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (a.pp, a.dp_replicate, a.dp_shard, a.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    dp = a.dp_replicate * a.dp_shard
    a.grad_accum = a.global_batch // (a.micro_batch * dp)
    dp_rank = mesh["dp_replicate"].get_local_rank() * a.dp_shard + mesh["dp_shard"].get_local_rank()
    planned_device = check_stage_device(a, mesh["pp"].get_local_rank(), rank, device)
    if a.layout_report:
        write_layout_report(a, mesh, rank, world, device, planned_device)
    model, schedule = build(a, mesh, device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    loss_fn = lm_loss(a)
    amp = (torch.autocast(device.type, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float16)
           if a.dtype != "fp32" else nullcontext())
    gen = torch.Generator().manual_seed(a.seed * 1000 + dp_rank)  # same data on TP/PP peers
    local_batch = a.micro_batch * a.grad_accum
    is_first, is_last = mesh["pp"].get_local_rank() == 0, mesh["pp"].get_local_rank() == a.pp - 1
    manual_dp = a.dp_replicate > 1 and a.dp_shard == 1 and (a.tp > 1 or a.pp > 1)
    step_s, losses_seen = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        if a.delay_rank == rank and a.delay_ms > 0:
            torch.ops.meshplan.delay(torch.zeros(1), a.delay_ms)
        tokens = torch.randint(0, a.vocab, (local_batch, a.seq_len + 1), generator=gen).to(device)
        x, y = tokens[:, :-1], tokens[:, 1:]
        opt.zero_grad(set_to_none=True)
        if schedule is not None:
            losses: list[torch.Tensor] = []
            with amp:
                if is_first:
                    schedule.step(x, target=y if is_last else None)
                elif is_last:
                    schedule.step(target=y, losses=losses)
                else:
                    schedule.step()
            if losses:
                losses_seen.append(float(torch.stack(losses).detach().mean()))
        else:
            for mb in range(a.grad_accum):
                last_mb = mb == a.grad_accum - 1
                sl = slice(mb * a.micro_batch, (mb + 1) * a.micro_batch)
                if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter on the last only
                    model.set_requires_gradient_sync(last_mb)
                sync = nullcontext() if last_mb or not hasattr(model, "no_sync") else model.no_sync()
                with sync, amp:
                    loss = loss_fn(model(x[sl]), y[sl]) / a.grad_accum
                loss.backward()
                losses_seen.append(float(loss.detach()) * a.grad_accum)
        if manual_dp:
            manual_dp_allreduce(model, mesh["dp_replicate"].get_group(), a.dp_replicate)
        opt.step()
        step_s.append(time.perf_counter() - t0)
    if is_last and dp_rank == 0 and mesh["tp"].get_local_rank() == 0:  # the rank that sees the loss
        med = statistics.median(step_s[min(2, len(step_s) - 1):]) if step_s else float("nan")
        last = losses_seen[-1] if losses_seen else float("nan")
        print(f"train_gpt: world={world} backend={backend} pp={a.pp} dp_replicate={a.dp_replicate} "
              f"dp_shard={a.dp_shard} tp={a.tp} micro={a.micro_batch} accum={a.grad_accum} steps={a.steps} "
              f"median_step_ms={med * 1e3:.1f} loss={last:.3f} (ln vocab = {math.log(a.vocab):.3f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
