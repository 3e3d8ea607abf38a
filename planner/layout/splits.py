"""Pipeline splits: layers per stage, balanced by layer count (Megatron-LM's rule) or by predicted time, and the
``7+8*14+7`` notation ``--fix pp_layout`` and plans use."""
from __future__ import annotations

import math
import re

from meshplan.core.errors import MeshplanError


def balanced_split(num_layers: int, pp: int, first_extra: float = 1.0, last_extra: float = 1.0) -> tuple[int, ...]:
    """Decoder layers per stage so the heaviest stage is as light as it can be, when the first stage also carries
    ``first_extra`` and the last ``last_extra`` layer-equivalents of work (embedding; output layer and loss).

    The default (one layer-equivalent each) is Megatron-LM's ``--account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split`` ("the input embedding layer will be treated as a standard transformer
    layer in the context of partition and placement"): Llama 3.1 405B's 126 layers on 16 stages become
    E+7 | 8 x 14 | 7+L. Ties go to lighter first and last stages. A first or last stage that carries a whole
    layer-equivalent may hold no decoder layer at all: 126 layers over 128 virtual stages are E | 1 x 126 | L
    (Megatron-Bridge's Llama 3.1 405B at PP16 x VP8), written 0+1*126+0.
    """
    bare = int(first_extra >= 1.0) + int(last_extra >= 1.0 and pp > 1)  # stages that may hold only E or L
    if pp < 1 or num_layers < pp - bare:
        raise MeshplanError(f"pp={pp}: needs at least one of the {num_layers} layers per stage"
                            + (" besides the embedding-only and loss-only ones" if bare else ""))
    extra = [0.0] * pp
    extra[0] += first_extra
    extra[-1] += last_extra
    least = [1] * pp  # an end stage goes without decoder layers only where the layers are too few for all
    if num_layers < pp and first_extra >= 1.0:
        least[0] = 0
    if num_layers < pp and last_extra >= 1.0:
        least[-1] = 0

    def capacity(load: float) -> list[int]:
        return [max(lo, int(math.floor(load - e + 1e-9))) for lo, e in zip(least, extra)]

    lo, hi = num_layers / pp, num_layers / pp + max(extra) + 1
    for _ in range(60):  # bisect the heaviest load until the capacities just hold every layer
        mid = (lo + hi) / 2
        if sum(capacity(mid)) >= num_layers:
            hi = mid
        else:
            lo = mid
    cap = capacity(hi)
    over = sum(cap) - num_layers
    # give back the surplus from the stages with the most room, middle stages first (they carry no extra)
    order = sorted(range(pp), key=lambda i: (-(cap[i] + extra[i]), extra[i] > 0, i))
    k = 0
    while over > 0:
        i = order[k % pp]
        if cap[i] > least[i]:
            cap[i] -= 1
            over -= 1
        k += 1
    return tuple(cap)


def front_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """Decoder layers per stage as NeMo AutoModel splits them: ``num_layers // stages`` each, and one more on each of
    the first ``num_layers % stages`` stages; the embedding rides on the first stage and the norm and output layer
    on the last, counted as no layer (``generate_hf_model_fqn_per_model_part`` in
    ``nemo_automodel/components/distributed/pipelining/functional.py`` @ 89e3a9fdd). DeepSeek-V3's 61 layers over
    pp 4 x vpp 8 become 2 x 29 | 1 x 3."""
    if stages < 1 or num_layers < stages:
        raise MeshplanError(f"{stages} pipeline stages: needs at least one of the {num_layers} layers per stage")
    base, extra = divmod(num_layers, stages)
    return tuple(base + 1 if i < extra else base for i in range(stages))


def weighted_split(weights: list[float], stages: int, first_extra: float = 0.0,
                   last_extra: float = 0.0) -> tuple[int, ...]:
    """Layers per stage (contiguous, >= 1 each) minimising the heaviest stage, when layer ``i`` costs
    ``weights[i]`` and the first and last stages also carry ``first_extra`` / ``last_extra`` (embedding; output
    layer and loss), all in the same unit (seconds per micro-batch: the split balanced by predicted stage time).

    Bisects the bottleneck and fills stages greedily left to right, leaving at least one layer for each stage to
    come: for contiguous min-max partitions the greedy fill is feasible whenever any split is (checked against
    brute force in tests/test_uneven_pipeline.py).
    """
    n = len(weights)
    if stages < 1 or n < stages:
        raise MeshplanError(f"pp={stages}: needs at least one of the {n} layers per stage")

    def fill(limit: float) -> list[int] | None:
        out, i = [], 0
        for st in range(stages):
            extra = (first_extra if st == 0 else 0.0) + (last_extra if st == stages - 1 else 0.0)
            room_left = n - i - (stages - st - 1)  # layers this stage may take
            if st == stages - 1:
                take = n - i
                if extra + sum(weights[i:]) > limit + 1e-12:
                    return None
            else:
                load, take = extra, 0
                while take < room_left and load + weights[i + take] <= limit + 1e-12:
                    load += weights[i + take]
                    take += 1
                if take == 0:
                    return None
            out.append(take)
            i += take
        return out

    lo = max(max(weights), first_extra + weights[0], last_extra + weights[-1])
    hi = sum(weights) + first_extra + last_extra
    best = fill(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        got = fill(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return tuple(best)


def format_pp_layout(layers: tuple[int, ...]) -> str:
    """``7+8*14+7``: runs of equal stages written ``n*k`` (the ``--fix pp_layout`` syntax)."""
    out, i = [], 0
    while i < len(layers):
        j = i
        while j < len(layers) and layers[j] == layers[i]:
            j += 1
        out.append(str(layers[i]) if j - i == 1 else f"{layers[i]}*{j - i}")
        i = j
    return "+".join(out)


def parse_pp_layout(text: str) -> tuple[int, ...]:
    """``3+4*14+3`` -> (3, 4, ..., 4, 3): layers per stage, ``n*k`` = k stages of n layers; the first and last
    stage may hold 0 (only the embedding, only the loss: ``0+1*126+0``).

    Raises:
        MeshplanError: not of that form, or a stage other than the first and last of fewer than 1 layer.
    """
    out: list[int] = []
    for part in str(text).split("+"):
        m = re.fullmatch(r"(\d+)(?:\*(\d+))?", part.strip())
        if not m:
            raise MeshplanError(f"--fix pp_layout={text}: expected layers per stage such as 7+8*14+7")
        n, k = int(m.group(1)), int(m.group(2) or 1)
        if k < 1 or k > 4096:
            raise MeshplanError(f"--fix pp_layout={text}: at most 4096 repeats of a stage")
        out += [n] * k
    if 0 in out[1:-1] or len(out) < 2 and 0 in out:
        raise MeshplanError(f"--fix pp_layout={text}: each stage needs >= 1 layer (the first and last may hold 0: "
                            "only the embedding, only the loss)")
    return tuple(out)


def megatron_layout_stages(text: str) -> tuple[int, ...]:
    """Decoder layers per virtual stage of a Megatron-Core ``pipeline_model_parallel_layout`` string
    (``Et*4|(t*4|)*14tmL``: stages split by ``|``, ``t`` a decoder layer, ``E`` embedding, ``m`` MTP, ``L`` loss,
    ``x*n`` and ``(...)*n`` repeats)."""
    out = text
    while "(" in out:
        nxt = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), out)
        if nxt == out:
            raise MeshplanError(f"pipeline layout '{text}': an unmatched group")
        out = nxt
    out = re.sub(r"([A-Za-z])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), out)
    return tuple(stage.count("t") for stage in out.split("|"))
