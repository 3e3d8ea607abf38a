"""Whether the best layout stays best at the other value of each open figure (``meshplan plan --explain``).

Two figures a plan's price rests on have two published values and no measurement to choose between them
(``planner.estimate.host_band``: an x86 host's speed against Grace's in an MoE layer's host wait;
``planner.estimate.sustained_band``: the sustained clock of a part nobody measured under load). The search ranks
layouts at the priced value; ``rank_under_open_figures`` prices the ranked layouts again at each figure's other value,
with an estimator of its own, and says which would run fastest there. A best layout that stays best under both values
is a choice the open figure does not decide; one that does not says which other layout to weigh, and by how much.
"""
from __future__ import annotations

from meshplan.planner.estimate import host_band, sustained_band
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.gpu import GpuEstimator

# (key in the plan's explain, the figure's other value in words, the estimator at that value)
FIGURES = (("host_speed", "the other published x86 host speed", host_band.alternative),
           ("sustained", "the lower-power sibling's sustained share", sustained_band.alternative))
# How much faster than the first another ranked layout must run at the other value to be named: the estimator is
# deterministic, but a difference this small is no reason to weigh another layout
NAMED_GAIN = 0.01


def rank_under_open_figures(estimator: GpuEstimator, work: Workload, ranked: list) -> dict[str, dict]:
    """``{figure key: {"best_rank", "best_step_time_s", "first_step_time_s"}}``: for each open figure that applies
    to the job, the rank (1-based, in ``ranked``'s order, the search's) of the layout fastest at the figure's other
    value, its step and the first layout's step there. ``ranked``: the search's ``(layout, estimate)`` pairs."""
    out = {}
    for key, _, make in FIGURES:
        alt = make(estimator, work)
        if alt is None or not ranked:
            continue
        steps = [alt.estimate(work, layout).step_time_s for layout, _ in ranked]
        best = min(range(len(steps)), key=steps.__getitem__)
        out[key] = {"best_rank": best + 1, "best_step_time_s": steps[best], "first_step_time_s": steps[0]}
    return out


def ranking_notes(ranks: dict[str, dict], rows: list[dict]) -> tuple[str, ...]:
    """One line per open figure: the first layout stays fastest at its other value, or which would run fastest there
    and by how much. ``rows``: the ranked table's rows (their ``layout`` text)."""
    what = {key: text for key, text, _ in FIGURES}
    out = []
    for key, r in ranks.items():
        first, best = r["first_step_time_s"], r["best_step_time_s"]
        if best >= first * (1 - NAMED_GAIN):
            out.append(f"open figure: at {what[key]}, #1 stays the fastest of the {len(rows)} ranked (within "
                       f"{100 * NAMED_GAIN:g}%: {first:.3f} s a step)")
        else:
            out.append(f"open figure: at {what[key]}, #{r['best_rank']} ({rows[r['best_rank'] - 1]['layout']}) "
                       f"runs fastest of the {len(rows)} ranked: {best:.3f} s a step against #1's {first:.3f} s")
    return tuple(out)
