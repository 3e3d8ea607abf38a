"""Whether a run's traces hold a training job advice can be given on, and if not, what is missing (one line).

Advice re-prices the job's own layout and searches others, so it needs a training step (a backward pass), the
GEMMs of the model (its shape), and the groups of a multi-rank job (its degrees) when only some ranks are present.
"""
from __future__ import annotations

from meshplan.verify.advise.evidence import RankEvidence
from meshplan.verify.advise.infer import LOW, InferredLayout

DEGREES = ("tp", "pp", "dp_replicate", "dp_shard", "ep")


def missing(source: str, evs: list[RankEvidence], inferred: InferredLayout, world: int, has_model: bool) -> str | None:
    """One line naming what the traces lack for advice, or None when they hold a readable training job."""
    ev = evs[0]
    if not ev.forward_ops and not ev.collectives:
        return (f"{source}: no GEMM or collective ran in the traced step on rank {ev.rank} (a single op, or a "
                "thinned trace): there is no training step to re-price")
    if not ev.backward_nodes:
        return (f"{source}: no backward pass in the trace (inference, or a forward-only capture): advice needs a "
                "training step")
    if len(evs) < world:
        guessed = [k for k in DEGREES if inferred.parts[k].confidence == LOW and k != "pp"]
        unnamed = any(c.group_size is None for c in ev.collectives)
        if guessed or (unnamed and inferred.value("ep", 1) > 1):
            which = ", ".join(guessed) or "ep"
            return (f"{source}: rank(s) {sorted(e.rank for e in evs)} of {world} present and their collectives name "
                    f"no process group, so {which} cannot be told; profile every rank, or a trace with "
                    "distributedInfo.pg_config (PyTorch >= 2.3)")
    if inferred.shape is None or not inferred.shape.head_dim:
        if not has_model:
            return (f"{source}: no attention op with recorded shapes, so the model's shape cannot be read "
                    "(not a decoder, or record_shapes was off); pass --model")
    if "seq_len" not in inferred.parts or "global_batch" not in inferred.parts:
        return (f"{source}: no attention op with recorded shapes names the sequence length and micro-batch, so the "
                "batch that ran cannot be read (record_shapes=True is needed)")
    return None
