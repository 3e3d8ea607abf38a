"""Each changed decision's share of the predicted gain: sequential (one-at-a-time) attribution.

From the layout that ran, the decisions that differ in the advised layout are applied one group at a time in a fixed
order, and each group is credited with the change in predicted step time its application makes. The shares add up
to the whole gain exactly; they depend on the order (an interaction between two decisions goes to the later one),
which is why the order is fixed: the mesh first (its degrees and ZeRO stage change together, as the world size ties
them), then the micro-batch, recomputation, and the other decisions in the order ``planner.layout.decisions``
declares them. A step whose layout is invalid or does not fit in memory is merged with the next one and priced
together, and says so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

from meshplan.planner.layout.decisions import DECISIONS
from meshplan.planner.layout.layout import DEGREE_NAMES, Layout

ATTRIBUTION = "sequential: changes applied one at a time in a fixed order (mesh, micro-batch, recompute, then the "\
              "registry's order), each credited with the step-time change it makes"
MESH = (*DEGREE_NAMES, "zero_stage", "etp", "pp_layout", "pipeline_schedule")
FIRST = ("micro_batch", "recompute")


@dataclass(frozen=True)
class Change:
    """One applied group: the fields that changed ({name: (ran, advised)}), the predicted step after it, and the
    seconds it saves (positive = faster)."""

    fields: dict
    step_s: float
    gain_s: float

    def label(self) -> str:
        return ", ".join(f"{k} {a}->{b}" for k, (a, b) in self.fields.items())

    def as_dict(self) -> dict:
        return {"changes": {k: [a, b] for k, (a, b) in self.fields.items()}, "step_s": self.step_s,
                "gain_s": self.gain_s}


def _groups() -> list[tuple[str, ...]]:
    rest = tuple(n for n in DECISIONS if n not in MESH and n not in FIRST)
    return [MESH, *((n,) for n in FIRST), *((n,) for n in rest)]


def attribute(ran: Layout, best: Layout, price: Callable[[Layout], Optional[float]]) -> list[Change]:
    """The changes from ``ran`` to ``best`` with their shares (``price``: predicted step seconds, or None when a
    layout is invalid or does not fit)."""
    cur, cur_s = ran, price(ran)
    if cur_s is None:
        return []
    out, pending = [], {}
    for group in _groups():
        diff = {k: (getattr(ran, k), getattr(best, k)) for k in group if getattr(ran, k) != getattr(best, k)}
        if not diff:
            continue
        pending.update(diff)
        nxt = replace(cur, **{k: getattr(best, k) for k in diff})
        s = price(nxt)
        cur = nxt
        if s is None:
            continue  # priced together with the next change
        out.append(Change(dict(pending), s, cur_s - s))
        cur_s, pending = s, {}
    if pending:  # never priced on its own: the advised layout itself
        s = price(best)
        if s is not None:
            out.append(Change(dict(pending), s, cur_s - s))
    return out
