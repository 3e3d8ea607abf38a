"""NCCL collectives over NVLink4 and NVLink5, from nccl-tests run on six systems.

NVIDIA's AIConfigurator (ai-dynamo/aiconfigurator) ran the nccl-tests binaries (NCCL 2.29.2, fp16, every size from
1 KiB to 537 MB) on 2, 4 and 8 GPUs of an H100 and an H200 node (NVLink4) and of a DGX B200 and a DGX B300
(NVLink5), and on 2 and 4 GPUs of a GB200 and a GB300 compute tray (NVLink5)
(``costmodel/data/published/aic_nccl_nvlink.json``, copied by ``bench/import_aic.py``). The parts of one
link family agree within 3% at every size, and none reaches one bus bandwidth for every kind and group: at 537 MB,
as a share of the link's 450 / 900 GB/s a direction (meshplan assumed 0.80 of it for all, from Vidur's NVLink4
curves, and carried that over to NVLink5),

| ranks | all-gather | reduce-scatter | all-reduce | all-to-all |
|---|---|---|---|---|
| NVLink5, 2 | 0.49 | 0.46 | 0.60 | 0.37 |
| NVLink5, 4 | 0.63 | 0.62 | 0.70 | 0.55 |
| NVLink5, 8 | 0.69 | 0.68 | 0.78 | 0.63 |
| NVLink4, 2 | 0.57 | 0.55 | 0.70 | 0.64 |
| NVLink4, 4 | 0.70 | 0.69 | 0.78 | 0.67 |
| NVLink4, 8 | 0.75 | 0.75 | 1.01 | 0.70 |

(NVLink4's eight-rank all-reduce over 0.80: NCCL's NVLS algorithm reduces in the NVSwitch), and it is still rising
there (at 64 MB eight NVLink5 ranks reach 0.47-0.48). So a collective inside one NVLink domain of a measured family
is priced at the measured time itself (``time_s``): the median over the family's parts at each measured size,
log-log interpolated between sizes (the bus bandwidth held beyond the largest, the time held below the smallest).
A group of ranks not measured takes the largest measured group no larger than it, with the alpha-beta model's
latency for its further steps (64 ranks of an NVL72 expert or data-parallel group at the bus bandwidth eight reach;
nothing measured says how a 72-GPU ring differs). Send/receive, other links and groups spanning domains keep the
alpha-beta model (``costmodel.collectives``).
"""
from __future__ import annotations

import bisect
import math
import statistics
from functools import lru_cache

from meshplan.costmodel.measured import published_file

DATA_FILE = "aic_nccl_nvlink.json"  # in costmodel/data/published
SOURCE = ("nccl-tests on H100 / H200 nodes and DGX B200 / B300 (2-8 GPUs) and GB200 / GB300 trays (2-4 GPUs), NCCL "
          "2.29.2 (ai-dynamo/aiconfigurator nccl_perf tables; costmodel/data/published/aic_nccl_nvlink.json)")


def _parts(link: str) -> list[dict]:
    return [part for part in published_file(DATA_FILE)["parts"].values() if part["link"] == link]


@lru_cache(maxsize=None)
def links() -> frozenset[str]:
    """The link families (``planner/presets/clusters/links.yaml`` names) the file measures."""
    return frozenset(part["link"] for part in published_file(DATA_FILE)["parts"].values())


@lru_cache(maxsize=None)
def curve(link: str, kind: str, ranks: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(bytes, seconds) of ``kind`` over ``ranks`` ranks on ``link``, the median over its parts at each size;
    empty tuples where none was measured."""
    by_size: dict[int, list[float]] = {}
    for part in _parts(link):
        for k, p, nbytes, ms in part["rows"]:
            if k == kind and p == ranks:
                by_size.setdefault(nbytes, []).append(ms * 1e-3)
    sizes = sorted(by_size)
    return tuple(float(b) for b in sizes), tuple(statistics.median(by_size[b]) for b in sizes)


@lru_cache(maxsize=None)
def measured_ranks(link: str, kind: str) -> tuple[int, ...]:
    """The group sizes ``kind`` was measured at on ``link``, ascending."""
    return tuple(sorted({p for part in _parts(link) for k, p, _, _ in part["rows"] if k == kind}))


def basis(link: str) -> str:
    """What a collective inside one ``link`` domain is priced from, in words (``meshplan plan --explain``)."""
    parts = " / ".join(name for name, part in published_file(DATA_FILE)["parts"].items() if part["link"] == link)
    ranks = sorted({p for part in _parts(link) for _, p, _, _ in part["rows"]})
    return (f"nccl-tests' measured time by kind, ranks ({', '.join(map(str, ranks))}) and size on {parts}; a larger "
            f"group at {ranks[-1]} ranks' bus bandwidth plus the link's alpha for each further step: {SOURCE}")


def _measured_s(link: str, kind: str, ranks: int, nbytes: float) -> float:
    """The measured curve at ``nbytes``: log-log between sizes, the bus bandwidth held beyond the largest, the time
    held below the smallest."""
    sizes, times = curve(link, kind, ranks)
    if nbytes >= sizes[-1]:
        return times[-1] * nbytes / sizes[-1]
    if nbytes <= sizes[0]:
        return times[0]
    i = bisect.bisect_right(sizes, nbytes)
    w = math.log(nbytes / sizes[i - 1]) / math.log(sizes[i] / sizes[i - 1])
    return math.exp(math.log(times[i - 1]) + w * (math.log(times[i]) - math.log(times[i - 1])))


@lru_cache(maxsize=None)
def _largest_measured(link: str, kind: str, ranks: int) -> int | None:
    """The largest group ``kind`` was measured at on ``link`` no larger than ``ranks`` (``None``: none, or a link the
    file does not measure); cached, as the search prices the same few groups many times."""
    if link not in links():
        return None
    taken = [p for p in measured_ranks(link, kind) if p <= ranks]
    return taken[-1] if taken else None


def time_s(link: str, kind: str, nbytes: float, ranks: int, step_latency_s: float) -> float | None:
    """Seconds of one ``kind`` collective of ``nbytes`` (the full tensor, as ``collectives.collective_time_s``)
    over ``ranks`` ranks inside one ``link`` domain, from the measured curve; ``None`` for a link, kind or group
    size not covered.

    A group larger than the largest measured one no larger than it, ``m``, is priced at ``m``'s curve at the same
    tensor size, its bus bandwidth carried to its own ``(ranks - 1) / ranks`` share, plus ``step_latency_s`` (the
    link's alpha) for each ring step or peer beyond ``m``'s, twice for an all-reduce's two phases: what the
    alpha-beta model adds for them (``collectives.ring_latency_s``)."""
    m = _largest_measured(link, kind, ranks) if nbytes > 0 else None
    if m is None:
        return None
    share = ((ranks - 1) / ranks) / ((m - 1) / m)
    steps = (2 if kind == "allreduce" else 1) * (ranks - m)
    return _measured_s(link, kind, m, nbytes) * share + steps * step_latency_s


def held_out_ratios(min_bytes: float = 1 << 20) -> tuple[list[float], list[float]]:
    """(in sample, one part held out): priced / measured time of every row from ``min_bytes`` up; in sample the
    median over the link family's parts (what ``curve`` holds), held out the median over its other parts at the
    same kind, group and size."""
    at: dict[tuple, dict[str, float]] = {}
    for name, part in published_file(DATA_FILE)["parts"].items():
        for k, p, nbytes, ms in part["rows"]:
            at.setdefault((part["link"], k, p, nbytes), {})[name] = ms * 1e-3
    inside, held = [], []
    for (_, _, _, nbytes), by_part in at.items():
        if nbytes < min_bytes:
            continue
        for name, t in by_part.items():
            inside.append(statistics.median(by_part.values()) / t)
            others = [v for n, v in by_part.items() if n != name]
            if others:
                held.append(statistics.median(others) / t)
    return inside, held
