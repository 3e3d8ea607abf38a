"""Pipeline schedules: the idle time (bubble) each leaves per step, the activations a stage holds in flight and the
parameter copies a rank keeps. One place for the formulas the estimators and the memory model use.

Notation per micro-batch and stage: ``t`` = forward + full backward (+ recompute, + the stage's exposed comm),
``b`` = the full backward (input and weight gradients, + recompute), ``w`` = the weight-gradient part of it.

- 1F1B: bubble (p - 1) t (Narayanan et al. 2021 §2.2.1); a stage i holds min(p - i, m) micro-batches.
- Interleaved 1F1B, v chunks per rank: bubble (p - 1) t / v (§2.2.2); the first stage holds
  (1 + (p - 1)/(p v)) times more (Korthikanti et al. 2022 §4.2.3).
- ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3.1): weight gradients deferred into the bubble,
  bubble (p - 1)(T_F + T_B - T_W) with T_B the input-gradient pass, i.e. (p - 1)(t - 2 w) here (t holds both
  gradient passes); activations as 1F1B.
- DualPipe (DeepSeek-V3 technical report §3.2.1, Table 2): micro-batches fed from both ends, a forward and a
  backward chunk overlapped; bubble (p/2 - 1)(F&B + B - 3W), parameters 2x, activations p + 1. F&B (the
  overlapped pair) is taken as F + B here: the overlap hides the pair's communication, priced elsewhere, not their
  compute. Needs an even p.

``w``: the dX and dW GEMMs of a layer's backward have equal FLOPs, and GEMMs are nearly all of it, so w = b / 2
(Qi et al. make the same T_B = T_W assumption in their Table 1 example).
"""
from __future__ import annotations

from meshplan.core.errors import MeshplanError

SCHEDULES = ("1f1b", "interleaved", "zbh1", "dualpipe")
WEIGHT_GRAD_SHARE = 0.5  # w / b: equal-FLOP dX and dW GEMMs (see the module docstring)


def check_schedule(schedule: str, pp: int, vpp: int) -> None:
    """Raise ``MeshplanError`` when ``schedule`` cannot run ``pp`` stages x ``vpp`` chunks, naming the numbers."""
    if schedule not in SCHEDULES:
        raise MeshplanError(f"schedule '{schedule}' is not one of {', '.join(SCHEDULES)}")
    if schedule == "interleaved" and vpp < 2:
        raise MeshplanError(f"schedule interleaved needs vpp >= 2 chunks per rank (vpp={vpp})")
    if schedule in ("1f1b", "zbh1", "dualpipe") and vpp > 1:
        raise MeshplanError(f"schedule {schedule} runs one chunk per rank (vpp={vpp}; interleaved takes vpp > 1)")
    if schedule == "dualpipe" and pp % 2:
        raise MeshplanError(f"schedule dualpipe feeds micro-batches from both ends: pp must be even (pp={pp})")


def bubble_s(schedule: str, pp: int, vpp: int, t_s: float, b_s: float) -> float:
    """Idle time per step on the critical stage, seconds (formulas in the module docstring)."""
    if pp <= 1:
        return 0.0
    w_s = WEIGHT_GRAD_SHARE * b_s
    if schedule == "zbh1":
        return (pp - 1) * max(0.0, t_s - 2 * w_s)
    if schedule == "dualpipe":
        return max(0.0, pp / 2 - 1) * max(0.0, t_s + b_s - 3 * w_s)
    return (pp - 1) / max(1, vpp) * t_s  # 1F1B, interleaved


def inflight_microbatches(schedule: str, pp: int, vpp: int, m: int, stage: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at once, in units of the stage's layers."""
    if schedule == "dualpipe":
        return float(min(pp + 1, m))
    held = min(pp - stage, m)
    if vpp > 1 and stage == 0:
        return held * (1.0 + (pp - 1) / (pp * vpp))
    return float(held)


def parameter_copies(schedule: str) -> int:
    """Copies of its stage's parameters (with their gradients and optimizer states) a rank keeps."""
    return 2 if schedule == "dualpipe" else 1
