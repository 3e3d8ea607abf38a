"""The Shapley attribution of ``meshplan advise``: each changed decision's share of the gain, priced by the same
estimator as the search. Checked against the shares computed independently by Shapley's subset formula (brute force
over every subset of the changes), and for what makes them honest: they add up to the gain, and a change that only
adds work (recomputation) is never credited with any of it."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search
from meshplan.verify.advise.attribute import _groups, attribute

GB, SEQ = 32, 4096


@pytest.fixture(scope="module")
def priced():
    cluster = load_cluster("1x8xH100")
    work = Workload(load_model("llama-3.1-8b"), cluster, GB, SEQ, "bf16")
    est = estimator_for(cluster, Pricer.from_dir(None), None)
    m = work.model

    def price(lay: Layout):  # memory aside, as advise prices the way from one layout to the other
        try:
            lay.validate(world_size=8, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                         seq_len=SEQ, global_batch=GB, num_experts=m.num_experts)
            return est.estimate(work, lay).step_time_s
        except MeshplanError:
            return None

    best = search(work, estimator=est, top=1).ranked[0][0]
    return price, best


def shapley_by_subsets(ran: Layout, best: Layout, price) -> list[float]:
    """phi_i = sum over subsets S of the other changes of |S|! (k - |S| - 1)! / k! (v(S + i) - v(S)), with v(S)
    the step saved by applying S to ``ran`` (Shapley 1953, eq. for the value of player i)."""
    groups = _groups(ran, best)
    k = len(groups)

    def v(s) -> float:
        lay = replace(ran, **{n: b for g in s for n, (_, b) in groups[g].items()})
        return price(ran) - price(lay)

    out = []
    for i in range(k):
        others = [g for g in range(k) if g != i]
        out.append(sum(math.factorial(len(s)) * math.factorial(k - len(s) - 1) / math.factorial(k)
                       * (v((*s, i)) - v(s)) for r in range(k) for s in itertools.combinations(others, r)))
    return out


RAN = Layout.of(Degrees(dp_shard=4, tp=2), micro_batch=1, zero_stage=3, recompute="full")


def test_shares_add_up_to_the_gain(priced):
    price, best = priced
    changes = attribute(RAN, best, price)
    assert changes, "the search's best differs from a fully recomputed ZeRO-3 layout"
    assert sum(c.gain_s for c in changes) == pytest.approx(price(RAN) - price(best), rel=1e-9)
    changed = {k for c in changes for k in c.fields}
    assert changed == {k for k in changed if getattr(RAN, k) != getattr(best, k)}
    for c in changes:  # alone: the layout that ran with only this change
        assert c.alone_s == pytest.approx(price(replace(RAN, **{k: b for k, (_, b) in c.fields.items()})))


def test_shares_are_the_shapley_values(priced):
    price, best = priced
    changes = attribute(RAN, best, price)
    assert len(changes) >= 2, "an attribution of one change is the gain itself"
    assert [c.gain_s for c in changes] == pytest.approx(shapley_by_subsets(RAN, best, price), rel=1e-9)


def test_recompute_that_only_adds_work_gets_no_credit(priced):
    price, best = priced
    # the advised layout with full recomputation forced on: the recompute change can only cost time
    worse = replace(best, recompute="full")
    ran = Layout.of(Degrees(dp_shard=4, tp=2), micro_batch=1, zero_stage=3, recompute="none")
    changes = attribute(ran, worse, price)
    rc = [c for c in changes if "recompute" in c.fields]
    assert rc and rc[0].gain_s <= 0.0, [c.as_dict() for c in changes]
    assert sum(c.gain_s for c in changes) == pytest.approx(price(ran) - price(worse), rel=1e-9)


def test_no_change_no_share(priced):
    price, best = priced
    assert attribute(best, best, price) == []
