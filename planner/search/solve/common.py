"""Shared pieces of the CP-SAT solvers: integer scaling, solver parameters and the status every result carries.

CP-SAT only handles integers, so times, bytes and quality indicators are scaled by a quantum and rounded.
Usage figures are rounded *up* and capacities *down* (memory, budgets), so a plan the solver accepts
never exceeds a limit in the unscaled numbers.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ortools.sat.python import cp_model

DEFAULT_TIME_QUANTUM_S = 1e-7  # 0.1 us: below the 4 us kernel-launch floor of one op, so rounding is < 3% per op
DEFAULT_MEMORY_QUANTUM_BYTES = 2**20  # 1 MiB
DEFAULT_QUALITY_QUANTUM = 1e-6  # in the indicator's own units (relative mean-square error)


@dataclass(frozen=True)
class SolverStatus:
    """How a solve ended.

    Attributes:
        status: ``OPTIMAL`` (proved), ``FEASIBLE`` (time limit hit with a plan) or ``INFEASIBLE``.
        objective: Objective of the returned plan, in the problem's unit (seconds for the time models).
        best_bound: Proven lower bound on the objective, same unit. Equals ``objective`` when optimal.
        hit_time_limit: True when a solve stopped on its time limit before proving optimality.
        wall_s: Wall-clock seconds spent in CP-SAT (all solves of this result).
        solves: Number of CP-SAT models solved (one per micro-batch option that could not be pruned).
    """

    status: str
    objective: float
    best_bound: float
    hit_time_limit: bool
    wall_s: float
    solves: int = 1

    @property
    def gap(self) -> float:
        """Relative optimality gap (0 when optimal)."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.best_bound) / self.objective)


def ticks(value: float, quantum: float) -> int:
    """``value`` in integer quanta, rounded to nearest (for objective terms)."""
    return int(round(value / quantum))


def ticks_up(value: float, quantum: float) -> int:
    """``value`` in quanta rounded up (usage against a limit); tolerant of float noise."""
    return int(math.ceil(value / quantum - 1e-9))


def ticks_down(value: float, quantum: float) -> int:
    """``value`` in quanta rounded down (a capacity or budget)."""
    return int(math.floor(value / quantum + 1e-9))


def default_workers() -> int:
    """CP-SAT search workers: the machine's cores, at most 8 (CP-SAT's portfolio gains little beyond)."""
    return max(1, min(8, os.cpu_count() or 1))


def make_solver(time_limit_s: float, num_workers: int | None, deterministic: bool = False) -> cp_model.CpSolver:
    """A CP-SAT solver with a wall-clock limit and a worker count (``None`` = :func:`default_workers`).

    ``deterministic``: one search worker, so the search, and among equal optima the one returned, is the same on
    every run (parallel workers race; CP-SAT's ``interleave_search`` would keep them but aborts, "Check failed:
    heuristics.fixed_search", on the serving model with a solution hint, ortools 9.x).
    """
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = 1 if deterministic else int(num_workers or default_workers())
    solver.parameters.linearization_level = 2  # put enforced (half-reified) constraints into the LP relaxation
    return solver
