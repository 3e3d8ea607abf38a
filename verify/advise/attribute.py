"""Each changed decision's share of the predicted gain: Shapley values over the groups of changed decisions.

The decisions that differ between the layout that ran and the advised one form groups: the mesh (its degrees, ZeRO
stage, expert TP, pipeline split and schedule change together, as the world size ties them), then every other
decision on its own. Applied one group at a time, each group changes the predicted step; that change depends on
what was applied before it (an interaction between two decisions goes to whichever comes later), so a fixed order
makes the shares an artefact of the order. Each group is credited instead with its change averaged over every
order of the groups: the Shapley value (Shapley 1953; Lundberg and Lee 2017 use it to attribute a model's output
to its inputs). The shares still add up to the whole gain exactly, a group that never changes the price gets
zero, and a change that only adds work (recomputation never makes a step faster on any layout, which the
estimators price so: ``tests/test_advise_recompute.py``) gets a share of zero or below, whatever the order.

The intermediate layouts are priced by their step time whether or not they fit in memory (an over-memory layout
is a point on the way, not a plan); a layout that is not valid at all (a micro-batch that does not divide the
batch of a mesh not yet applied) has no price, so a step onto it is priced together with the next step and their
change split equally between their groups (Shapley's symmetry: nothing tells the two apart). With more than
``MAX_ORDERS_GROUPS`` groups the average runs over the registry's fixed order and its reverse only.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable, Optional

from meshplan.planner.layout.decisions import DECISIONS
from meshplan.planner.layout.layout import DEGREE_NAMES, Layout

ATTRIBUTION = ("Shapley: each changed decision (the mesh as one) is credited with the step-time change it makes, "
               "averaged over every order of applying the changes; the shares add up to the gain, and a change "
               "that only adds work (recompute) gets zero or less")
MESH = (*DEGREE_NAMES, "zero_stage", "etp", "pp_layout", "pipeline_schedule")
FIRST = ("micro_batch", "recompute")
MAX_ORDERS_GROUPS = 7  # 7! = 5040 orders over at most 2^7 = 128 distinct layouts, each priced once


@dataclass(frozen=True)
class Change:
    """One group of changed decisions ({name: (ran, advised)}), its share of the gain in seconds (positive =
    faster), and the predicted step of the layout that ran with only this group applied (None: not valid alone).
    """

    fields: dict
    gain_s: float
    alone_s: Optional[float]

    def label(self) -> str:
        return ", ".join(f"{k} {a}->{b}" for k, (a, b) in self.fields.items())

    def as_dict(self) -> dict:
        return {"changes": {k: [a, b] for k, (a, b) in self.fields.items()}, "gain_s": self.gain_s,
                "alone_step_s": self.alone_s}


def _groups(ran: Layout, best: Layout) -> list[dict]:
    """The changed decisions, grouped: the mesh first, then the registry's order."""
    rest = tuple(n for n in DECISIONS if n not in MESH and n not in FIRST)
    out = []
    for group in (MESH, *((n,) for n in FIRST), *((n,) for n in rest)):
        diff = {k: (getattr(ran, k), getattr(best, k)) for k in group if getattr(ran, k) != getattr(best, k)}
        if diff:
            out.append(diff)
    return out


def _walk(order: tuple[int, ...], groups: list[dict], start_s: float, price_of: Callable) -> dict[int, float]:
    """Seconds each group saves when applied in ``order`` (a step onto an invalid layout is priced with the
    next one and split equally)."""
    applied: frozenset[int] = frozenset()
    cur_s, pending, out = start_s, [], {}
    for g in order:
        applied |= {g}
        pending.append(g)
        s = price_of(applied)
        if s is None:
            continue
        for p in pending:
            out[p] = (cur_s - s) / len(pending)
        cur_s, pending = s, []
    return out


def attribute(ran: Layout, best: Layout, price: Callable[[Layout], Optional[float]]) -> list[Change]:
    """The changes from ``ran`` to ``best`` with their Shapley shares (``price``: predicted step seconds of a
    layout, memory aside, or None when it is invalid). Empty when ``ran`` does not price."""
    groups = _groups(ran, best)
    memo: dict[frozenset, Optional[float]] = {}

    def price_of(applied: frozenset) -> Optional[float]:
        if applied not in memo:
            memo[applied] = price(replace(ran, **{k: v[1] for g in applied for k, v in groups[g].items()}))
        return memo[applied]

    start_s = price_of(frozenset())
    if start_s is None or not groups:
        return []
    k = len(groups)
    whole = tuple(range(k))
    orders = list(itertools.permutations(whole)) if k <= MAX_ORDERS_GROUPS else [whole, whole[::-1]]
    total = [0.0] * k
    for order in orders:
        for g, saved in _walk(order, groups, start_s, price_of).items():
            total[g] += saved
    return [Change(groups[g], total[g] / len(orders), price_of(frozenset({g}))) for g in whole]
