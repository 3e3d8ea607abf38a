"""The pipeline degrees a search widens to when no layout with even stages splits the global batch
(``planner.search.uneven_pp``), against counts worked by hand."""
from __future__ import annotations

import pytest

from meshplan.planner.search.uneven_pp import uneven_pp_choices


@pytest.mark.parametrize("layers, world, batch, mbs, want", [
    # 80 layers on one NVL72 rack, batch 2^10: 3, 6, 9 leave 24, 12, 8 GPUs a stage, each with a power-of-two
    # data-parallel degree (8, 4, 8); 12 and up are past the three tried
    (80, 72, 1024, 1, [3, 6, 9]),
    # 48 layers: 3, 6, 12, 24 divide them (a free search has those); 36 stages would hold fewer than 2 layers each
    (48, 72, 1024, 1, [9, 18]),
    # 61 layers (DeepSeek-V3) on 576 GPUs: the degrees of 576 = 2^6 x 9 up to 30, fewest first
    (61, 576, 8192, 1, [2, 3, 4]),
    # a micro-batch of the whole batch: one data-parallel rank, the stage's GPUs all tensor x context (24, 12, 8)
    (80, 72, 64, 64, [3, 6, 9]),
])
def test_choices(layers: int, world: int, batch: int, mbs: int, want: list[int]) -> None:
    assert uneven_pp_choices(layers, world, batch, mbs, max_inner=72) == want


def test_no_choice_when_every_stage_count_divides_or_none_splits() -> None:
    assert uneven_pp_choices(72, 72, 1024, 1, max_inner=72) == []  # every divisor of 72 divides the 72 layers
    assert uneven_pp_choices(80, 72, 7, 2, max_inner=72) == []  # micro-batches of 2 never split 7 sequences
    # tensor x context at most 2: 3, 6, 12 and 24 stages leave only data-parallel degrees with a factor 3 (24 or
    # 12, 12 or 6, 6 or 3, 3); 9, 18 and 36 leave powers of two (8 or 4, 4 or 2, 2 or 1)
    assert uneven_pp_choices(80, 72, 1024, 1, max_inner=2) == [9, 18, 36]
