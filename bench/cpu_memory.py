"""Peak memory of real CPU training steps, as PyTorch's own allocator counts it, against meshplan's prediction.

    python bench/cpu_memory.py            # GPT-2 124M (../shared/model_configs/gpt2.json), fp32, one process

Each case runs ``examples/train_gpt.py`` (the trainer ``local:N`` plans launch) for 2 steps in this process under
``torch.profiler`` with ``profile_memory=True``; the allocator's peak is the largest "Total Allocated" of the trace's
``[memory]`` events (every tensor PyTorch's CPU allocator holds: weights, gradients, AdamW's moments, activations,
temporaries). meshplan's prediction is ``planner.estimate.base.stage_memory`` for the same model, batch, sequence and
recompute (stack eager: the trainer's PyTorch code), model states plus activations: the runtime terms (CUDA context,
NCCL buffers, fragmentation) are not the allocator's. Issue 13 item 3 asks within 10%.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = [(2, 256, "none"), (4, 512, "none"), (4, 512, "selective"), (4, 512, "full")]  # micro-batch, seq, recompute


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def allocator_peak_bytes(config: Path, batch: int, seq: int, recompute: str) -> int:
    """Run 2 training steps of the example trainer in this process; the allocator's peak from the trace."""
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(REPO))
    import examples.train_gpt as trainer

    group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
             "LOCAL_RANK": "0"}  # a one-process gloo group, as torchrun would describe it to the trainer
    saved = {k: os.environ.get(k) for k in group}
    os.environ.update(group)
    argv = ["--config", str(config), "--seq-len", str(seq), "--micro-batch", str(batch), "--global-batch",
            str(batch), "--steps", "2", "--recompute", recompute]
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer.main(argv)
    finally:  # leave the caller's environment as it was
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")


def predicted_bytes(config: Path, batch: int, seq: int, recompute: str) -> dict:
    from meshplan.costmodel.api import Pricer
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload, stage_memory
    from meshplan.planner.estimate.gpu import GpuEstimator
    from meshplan.planner.layout.layout import Layout
    from meshplan.planner.model.config import load_model

    model = load_model(str(config))
    # the memory model reads no device figure but its capacity (local:N needs this host's calibration)
    work = Workload(model, load_cluster("1x1xH100"), batch, seq, "fp32")
    layout = Layout(micro_batch=batch, recompute=recompute, stack="eager")
    mem = stage_memory(work, GpuEstimator(Pricer.shipped()).tables(model), layout, 0, 1)
    return mem.as_dict()


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO.parent / "shared" / "model_configs" / "gpt2.json")
    a = p.parse_args()
    table = Table(title=f"PyTorch CPU allocator peak vs meshplan ({a.config.name}, fp32, AdamW, 1 process)")
    for col in ("micro-batch", "seq", "recompute", "allocator MiB", "predicted MiB", "error", "of which states MiB"):
        table.add_column(col, justify="right")
    for batch, seq, recompute in CASES:
        measured = allocator_peak_bytes(a.config, batch, seq, recompute)
        pred = predicted_bytes(a.config, batch, seq, recompute)
        states = pred["weights_bytes"] + pred["grads_bytes"] + pred["optimizer_bytes"]
        total = states + pred["activations_bytes"]
        table.add_row(str(batch), str(seq), recompute, f"{measured / 2**20:,.0f}", f"{total / 2**20:,.0f}",
                      f"{total / measured - 1:+.1%}", f"{states / 2**20:,.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
