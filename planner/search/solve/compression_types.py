"""The gradient-compression problem as plain numbers: per bucket, its candidate choices
(``planner.search.solve.compression``
solves it; ``planner.search.solve.compression_problem`` builds it from a model and a cluster)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from meshplan.planner.search.solve.common import DEFAULT_QUALITY_QUANTUM, DEFAULT_TIME_QUANTUM_S


@dataclass(frozen=True)
class CompressionChoice:
    """One way to communicate one bucket.

    Attributes:
        method: ``none``, ``fp16``, ``bf16``, ``int8``, ``topk`` or ``powersgd``.
        param: Top-k kept fraction or PowerSGD rank (0 otherwise).
        two_level: Uncompressed inside the node, compressed across nodes.
        where: ``gpu`` or ``cpu`` (where compression runs).
        compute_s: Seconds added to the compute stream right after the bucket is ready (GPU compression).
        comm_s: Seconds on the communication stream (copies, CPU work, collective, decompression).
        error: Error indicator (relative mean-square gradient error weighted by the bucket's share).
    """

    method: str
    param: float
    two_level: bool
    where: str
    compute_s: float
    comm_s: float
    error: float


@dataclass(frozen=True)
class CompressionProblem:
    """Plain numbers of one compression problem.

    Attributes:
        backward_s: Backward compute seconds producing each bucket, in ready order.
        sizes_bytes: Bucket sizes, bytes (reported in the plan).
        choices: Per bucket, the candidate :class:`CompressionChoice` values.
        tail_s: Compute after the last bucket is ready (e.g. the rest of the backward), seconds.
        error_budget: Bound on the summed error indicators; ``None`` = unbounded.
    """

    backward_s: Sequence[float]
    sizes_bytes: Sequence[int]
    choices: Sequence[Sequence[CompressionChoice]]
    tail_s: float = 0.0
    error_budget: Optional[float] = None
    forward_s: float = 0.0  # forward pass before the backward (reported step time only)
    time_quantum_s: float = DEFAULT_TIME_QUANTUM_S
    error_quantum: float = DEFAULT_QUALITY_QUANTUM
