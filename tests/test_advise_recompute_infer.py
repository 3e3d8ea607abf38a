"""The recompute mode advise infers from a trace is the one the trainer ran: examples/train_gpt.py's own
``--recompute`` (none, selective = the attention core again inside backward, full = the whole block again), one
forward and backward profiled by torch.profiler in this process and read back as a Kineto trace. ``full`` is told
from an op-level policy by every forward call of a recomputed GEMM shape running again, not by the share of all
GEMMs, which the LM head (never recomputed) lowers."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from meshplan.profiler.runs import load_run
from meshplan.verify.advise.evidence import rank_evidence
from meshplan.verify.advise.infer import _recompute
from tests.helpers import REPO


def _trainer():
    spec = importlib.util.spec_from_file_location("train_gpt_infer", REPO / "examples" / "train_gpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# one layer: its 6 GEMMs re-run, the LM head's does not (6 of 7, as 96 of 116 in an FSDP run of 4 layers)
@pytest.mark.parametrize("mode,layers", [("none", 2), ("selective", 2), ("full", 2), ("full", 1)])
def test_recompute_inferred_is_the_trainers(tmp_path, mode, layers):
    tg = _trainer()
    a = tg.parse_args(["--layers", str(layers), "--hidden", "32", "--heads", "4", "--vocab", "64", "--seq-len", "16",
                       "--recompute", mode])
    torch.manual_seed(0)
    m = tg.Stage(a, 0, a.layers, first=True, last=True).train()
    x = torch.randint(0, a.vocab, (2, a.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        tg.lm_loss(a)(m(x), x).backward()
    prof.export_chrome_trace(str(tmp_path / "rank0.trace.json"))
    ev = rank_evidence(next(iter(load_run(tmp_path).ranks.values())))
    assert _recompute(ev).value == mode, (ev.forward_ops, ev.recomputed_ops, ev.attention_ops,
                                          ev.recomputed_attention)
