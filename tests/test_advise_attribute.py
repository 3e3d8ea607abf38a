"""The sequential attribution of ``meshplan advise``: each changed decision's share of the gain, priced by the same
estimator as the search. The shares are differences of real prices along a fixed path from the layout that ran to
the advised one, so they add up to the whole gain exactly and each equals the two prices it lies between."""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search
from meshplan.verify.advise.attribute import attribute

GB, SEQ = 32, 4096


@pytest.fixture(scope="module")
def priced():
    cluster = load_cluster("1x8xH100")
    work = Workload(load_model("llama-3.1-8b"), cluster, GB, SEQ, "bf16")
    est = estimator_for(cluster, Pricer.from_dir(None), None)
    m = work.model

    def price(lay: Layout):
        try:
            lay.validate(world_size=8, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                         seq_len=SEQ, global_batch=GB, num_experts=m.num_experts)
            e = est.estimate(work, lay)
        except MeshplanError:
            return None
        return e.step_time_s if e.fits else None

    best = search(work, estimator=est, top=1).ranked[0][0]
    return price, best


def test_shares_add_up_to_the_gain(priced):
    price, best = priced
    ran = Layout.of(Degrees(dp_shard=4, tp=2), micro_batch=1, zero_stage=3, recompute="full")
    changes = attribute(ran, best, price)
    assert changes, "the search's best differs from a fully recomputed ZeRO-3 layout"
    assert sum(c.gain_s for c in changes) == pytest.approx(price(ran) - price(best), rel=1e-12)
    assert changes[-1].step_s == pytest.approx(price(best), rel=1e-12)
    steps = [price(ran)] + [c.step_s for c in changes]
    assert [c.gain_s for c in changes] == pytest.approx([a - b for a, b in zip(steps, steps[1:])], rel=1e-12)
    changed = {k for c in changes for k in c.fields}
    assert changed == {k for k in changed if getattr(ran, k) != getattr(best, k)}


def test_no_change_no_share(priced):
    price, best = priced
    assert attribute(best, best, price) == []
