"""Pipeline degrees a free search leaves out that would split a global batch nothing else splits.

A free search tries only pipeline degrees that divide the layers (``planner.layout.space._meshes``: uneven stages
for every degree would multiply the search's time). On a cluster whose size carries a factor the layers lack (an
NVL72 rack: 72 = 8 x 9 GPUs, against a power-of-two global batch and 80 layers), every data-parallel degree left
then carries that factor too, and no layout splits the batch. An uneven pipeline can take the factor instead
(pp = 9 of 80 layers: Megatron-Core's first and last stages take the remainder, ``pipeline_model_parallel_layout``),
which a pinned ``pp`` already searches; ``uneven_pp_choices`` names the degrees worth that search.
"""
from __future__ import annotations

from meshplan.planner.layout.space import divisors

# The uneven degrees a widened search tries, fewest stages first: each is one pinned-pp search
MAX_TRIES = 3


def uneven_pp_choices(layers: int, world_size: int, global_batch: int, micro_batch: int, max_inner: int) -> list[int]:
    """Pipeline degrees that do not divide ``layers`` (at least 2 layers a stage) and leave, after some tensor x
    context degree of at most ``max_inner`` (the NVLink width), a data-parallel degree whose micro-batches of
    ``micro_batch`` sequences split ``global_batch``; fewest stages first, at most ``MAX_TRIES``."""
    out = []
    for pp in divisors(world_size):
        if pp < 2 or layers % pp == 0 or layers < 2 * pp:
            continue
        rest = world_size // pp
        if any(global_batch % (micro_batch * (rest // inner)) == 0 for inner in divisors(rest) if inner <= max_inner):
            out.append(pp)
    return out[:MAX_TRIES]
