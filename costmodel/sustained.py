"""The share of a one-shot kernel rate a GPU sustains through a training run.

Every compute price rests on kernel benchmarks: calls timed on a GPU that was idle or cool just before, so at its
boost clock. Training keeps the GPU busy for hours, and an SXM part then runs at its board power limit. On one H200
(700 W), ``bench/gpu_sustained.py`` held three workloads for 25-40 s each: a bf16 GEMM, an fp8 GEMM, and the forward
and backward of one Llama-3.1-70B decoder layer as TP 8 leaves it. Within 250 ms of the start the SM clock fell from
1980 MHz to 1380-1800 MHz (nvidia-smi clock-event reason 0x4, the software power cap, at 692-694 W), and the rate
settled at 0.934-0.947 of the first call's, alike for the GEMMs and the whole layer (two runs on two machines;
``costmodel/data/measured/nvidia-h200-sustained*.json``). One H100 80GB HBM3 at the same 700 W gave 0.907-0.941
(``nvidia-h100-sustained.json``).

The share is the median of steady / first over every workload and run of a part (a part with more runs weighs more
in a pooled median). The planner's estimator divides
every tensor-core op's price by it (``TENSOR_CORE_KINDS``; ``costmodel.api.Pricer(..., sustained=True)``): a dense
layer, 80-90% GEMMs and attention, loses what a bare GEMM loses, while a Qwen3-30B MoE layer at EP 8, whose token
copies and scatters keep HBM busy, ran at the cap with its SM clock at 1905 MHz and kept 0.988 of its rate
(``nvidia-h100-sustained-moe.json``). One B200 (1000 W) run is published, not ours: flashinfer-ai/flashinfer PR
#2899 timed 100 back-to-back bf16 FlashAttention-4 iterations and read 1450 TFLOP/s at the peak, 1237 once fully
throttled (0.853), the SM clock down from 1965 to about 1580 MHz at 1000 W (``costmodel/data/published/
flashinfer_b200_sustained.json``). NVIDIA's AIConfigurator collected bf16 GEMM sweeps with the board power read, each
shape held a second or more, shape after shape (``costmodel/data/published/aic_gemm_sustained.json``, matched with
the same framework's one-shot sweep by ``bench/import_aic.py``): each sweep with at least ``MIN_SHAPES_AT_CAP``
shapes at its cap is one more run of its part, its share the median one-shot / held time over those shapes (H200
0.939, as our own runs; B200 0.880; GB200 0.882 and 0.906; the B200's TensorRT-LLM sweep brought 20 of its 181 shapes
to the cap and counts for nothing). So the B200 is priced at 0.866 and the GB200 at 0.894. A part with no run of its
own but the same SMs, boost clock and power limit as measured ones (H800: the GH100 die at 700 W) takes the median
over theirs. A part of the same SM design given the same
board watts per SM as a measured one takes its share too (``same_budget``): the cap holds each SM's clock where its
power meets the budget, so the B300 (160 SMs of the B200's tensor core at 1,100 W: 6.9 W an SM against the B200's 6.8)
takes the B200's 0.866; Megatron-Bridge's paired runs of one layout on two systems check the shares apart from
everything else (``bench/part_pairs.py``, priced over published, medians: B200 / B300 0.95, B300 / GB300 1.05,
B200 / GB200 1.06, GB200 / GB300 1.01). Every other part takes
1 (the GB300's 8.8 W an SM leave its SMs more headroom than the GB200's 8.1, by how much nobody has measured): no
sustained-load measurement exists for it, and ``meshplan plan --explain`` says so, and prices the plan again at the
share of its measured siblings of the same SM design at fewer watts per SM (``lower_power_sibling``: the B200 and the
GB200), the bound more power per SM can only raise.
"""
from __future__ import annotations

import statistics
from functools import lru_cache

from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.measured import SUSTAINED, measured_files, published_file

# measurement file -> the catalogued device it ran on (environment.device_name "NVIDIA H200", "NVIDIA H100 80GB HBM3")
MEASURED_ON = {"nvidia-h200-sustained.json": "H200", "nvidia-h200-sustained-repeat.json": "H200",
               "nvidia-h100-sustained.json": "H100-SXM"}
# published runs (costmodel/data/published) -> the catalogued device they ran on
PUBLISHED_ON = {"flashinfer_b200_sustained.json": "B200"}
NO_MEASUREMENT = "no sustained-load measurement for this part: priced at one-shot kernel rates"
# Ops whose rate follows the SM clock (tensor-core math): the share applies to them. The memory-bound kernels (norms,
# elementwise, copies, casts, softmax, embedding, optimizer) run at HBM speed, and the power cap lowers the SM clock
# only: nvidia-smi read the memory clock at its maximum after every held workload (3201 MHz on the H200s, 2619 MHz
# on the H100). Checked on two whole layers, whose kernels mix both (BENCHMARKS.md "Sustained load"). The chunked
# scans (Mamba-2's SSD, Gated DeltaNet's) are tensor-core tiles timed one-shot like the GEMMs.
TENSOR_CORE_KINDS = ("matmul", "bmm", "attention", "ssd", "gdn")


def shares_of(data: dict) -> dict[str, float]:
    """Workload -> steady / first-second rate of one measurement file's ``sustain`` section (as the file's summary
    states it)."""
    records = data["sections"]["sustain"]["records"]
    return {name: r["summary"]["steady_over_first_second_max"] for name, r in records.items() if "summary" in r}


def same_part(a: DeviceSpec, b: DeviceSpec) -> bool:
    """Same SMs, boost clock and board power limit: the same die held at the same cap."""
    return (a.vendor, a.sm_count, a.clock_hz, a.tdp_w) == (b.vendor, b.sm_count, b.clock_hz, b.tdp_w) and a.tdp_w > 0


# How close two parts' tensor-core width (bf16 FLOP per SM per clock) and board watts per SM must be for one to take
# the other's share: the catalogue's figures are datasheet quotients, good to a few percent (B300: 7,684 FLOP and
# 6.9 W against the B200's 7,678 and 6.8 W; the GB200's 8.1 W and the GB300's 8.8 W are 20-30% more)
SAME_BUDGET_TOLERANCE = 0.05


def tensor_flop_per_sm_clock(device: DeviceSpec) -> float:
    """Dense bf16 FLOP one SM retires per clock: the tensor-core generation (Hopper 3,784, Blackwell 7,680)."""
    return device.peak_flops.get("bf16", 0.0) / (device.sm_count * device.clock_hz)


def same_budget(a: DeviceSpec, b: DeviceSpec) -> bool:
    """The same tensor core (bf16 FLOP per SM per clock) under the same board power per SM: under a sustained load
    the power cap holds each SM's clock where its power meets the budget, so SMs of one design given the same
    watts each settle alike, whatever their count (the B300's 160 SMs at 1,100 W, the B200's 148 at 1,000 W)."""
    if a.vendor != b.vendor or min(a.tdp_w, b.tdp_w) <= 0:
        return False
    width_a, width_b = tensor_flop_per_sm_clock(a), tensor_flop_per_sm_clock(b)
    watts_a, watts_b = a.tdp_w / a.sm_count, b.tdp_w / b.sm_count
    return (width_a > 0 and abs(width_a / width_b - 1) <= SAME_BUDGET_TOLERANCE
            and abs(watts_a / watts_b - 1) <= SAME_BUDGET_TOLERANCE)


def published_share(data: dict) -> float:
    """A published run's steady rate over its peak window: the last window's rate over the best one's."""
    rates = [w["tflops"] for w in data["windows"]]
    return rates[-1] / max(rates)


def _published() -> dict[str, dict[str, float]]:
    """Published file -> {its workload: steady / peak}."""
    return {name: {published_file(name)["workload"]["kernel"]: published_share(published_file(name))}
            for name in PUBLISHED_ON}


# AIConfigurator's bf16 GEMM sweeps held at the power limit (ai-dynamo/aiconfigurator @ 095f58a, its collectors
# under COLLECTOR_MEASURE_POWER: each shape held a second or more, shape after shape, board power read), matched
# with the same framework's one-shot sweep (bench/import_aic.py): one run per (part, framework), its share the median
# one-shot / held time over the shapes that drew at least AT_CAP of the board's limit
HELD_SWEEPS = "aic_gemm_sustained.json"
AT_CAP = 0.95
MIN_SHAPES_AT_CAP = 100


def held_sweep_share(rows: list) -> tuple[float, int]:
    """(median one-shot / held time of a held sweep's shapes at the power cap, how many there are)."""
    at_cap = [one / held for _, _, _, held, one, watts, cap in rows if watts >= AT_CAP * cap]
    return (statistics.median(at_cap) if at_cap else float("nan")), len(at_cap)


@lru_cache(maxsize=1)
def _held_sweeps() -> dict[str, tuple[str, float]]:
    """Run name -> (its part, its share at the cap), for each held sweep."""
    out = {}
    for run in published_file(HELD_SWEEPS)["runs"]:
        share, n = held_sweep_share(run["rows"])
        if n >= MIN_SHAPES_AT_CAP:
            out[f"{HELD_SWEEPS}:{run['part']}:{run['framework']}"] = (run["part"], share)
    return out


def _device_of(run: str) -> str:
    if run.startswith(HELD_SWEEPS):
        return _held_sweeps()[run][0]
    return MEASURED_ON.get(run) or PUBLISHED_ON[run]


def _where(run: str) -> str:
    """Who measured ``run`` and its file."""
    if run.startswith(HELD_SWEEPS):
        _, part, framework = run.split(":")
        src = published_file(HELD_SWEEPS)["source"]
        return (f"published: {src['repository']} @ {src['commit'][:7]}, {framework}'s bf16 GEMMs held at {part}'s "
                f"power limit, costmodel/data/published/{HELD_SWEEPS}")
    if run in PUBLISHED_ON:
        src = published_file(run)["source"]
        return f"published: {src['repository']} PR #{src['pull_request']}, costmodel/data/published/{run}"
    return f"bench/gpu_sustained.py, costmodel/data/measured/{run}"


def _runs() -> dict[str, dict[str, float]]:
    """Run file -> its workloads' steady / first ratios, for every held run of a catalogued part (ours, then the
    published ones)."""
    ours = {name: shares_of(data) for name, data in measured_files(SUSTAINED).items()
            if name in MEASURED_ON and "sustain" in data["sections"]}
    sweeps = {name: {"gemm_bf16_held": share} for name, (_, share) in _held_sweeps().items()}
    return {**ours, **_published(), **sweeps}


@lru_cache(maxsize=1)
def _measured() -> tuple[tuple[DeviceSpec, tuple[float, ...], tuple[str, ...]], ...]:
    """(device, its workloads' steady / first ratios over every run, the files) per measured device."""
    cat, by_device = catalogue(), {}
    for name, shares in _runs().items():
        vals, files = by_device.setdefault(_device_of(name), ([], []))
        vals.extend(shares.values())
        files.append(name)
    return tuple((cat[dev], tuple(vals), tuple(files)) for dev, (vals, files) in sorted(by_device.items()))


def sustained_share(device: DeviceSpec) -> tuple[float, str]:
    """``(share, source)``: the fraction of its one-shot kernel rate ``device`` sustains under training load, and
    where the figure comes from. A measured part takes its own runs' median; a part of the same die and power limit
    as measured ones (``same_part``) the median over all of theirs; failing that, a part of the same SM design at
    the same board watts per SM (``same_budget``) theirs; any other part 1."""
    own = [(m, vals, files) for m, vals, files in _measured() if m.name == device.name]
    die = [(m, vals, files) for m, vals, files in _measured() if same_part(device, m)]
    kin = own or die or [(m, vals, files) for m, vals, files in _measured() if same_budget(device, m)]
    if not kin:
        return 1.0, NO_MEASUREMENT
    share = statistics.median(v for _, vals, _ in kin for v in vals)
    parts = " and ".join(m.name for m, _, _ in kin)
    files = "; ".join(_where(f) for _, _, fs in kin for f in fs)
    via = "" if own else (" (the same die at the same power limit)" if die else
                          " (the same SM design at the same board power per SM; no run of this part's own)")
    return share, f"{share:.3f} of one-shot rates under sustained load: measured on {parts}{via} ({files})"


def lower_power_sibling(device: DeviceSpec) -> tuple[float, str] | None:
    """``(share, part)`` for a part with no sustained measurement of its own or of its kin (``sustained_share``
    prices it at 1): the median share measured on a part of the same SM design (bf16 FLOP per SM per clock within
    ``SAME_BUDGET_TOLERANCE``) given fewer board watts per SM, which throttles at least as much, so the unmeasured
    part's share lies between that and 1 (the GB300 against the B200 and the GB200); ``None`` where there is none."""
    if sustained_share(device)[1] != NO_MEASUREMENT or device.tdp_w <= 0:
        return None
    width, watts = tensor_flop_per_sm_clock(device), device.tdp_w / device.sm_count
    kin = [(m, vals) for m, vals, _ in _measured()
           if m.vendor == device.vendor and m.tdp_w > 0 and m.tdp_w / m.sm_count < watts
           and abs(tensor_flop_per_sm_clock(m) / width - 1) <= SAME_BUDGET_TOLERANCE]
    if not kin:
        return None
    return statistics.median(v for _, vals in kin for v in vals), " and ".join(m.name for m, _ in kin)


def held_out_ratios() -> tuple[list[float], list[float]]:
    """(in sample, one run held out): predicted / measured steady rate of every workload of every run, the
    prediction being a share times the workload's first-second rate: in sample, its part's share; held out, the
    median of every other run (of either part)."""
    runs = _runs()
    cat = catalogue()
    inside, held = [], []
    for name, shares in runs.items():
        own = sustained_share(cat[_device_of(name)])[0]
        others = [v for n, s in runs.items() if n != name for v in s.values()]
        for share in shares.values():
            inside.append(own / share)
            if others:
                held.append(statistics.median(others) / share)
    return inside, held


DUTY_FILE = "nvidia-h200-sustained-duty.json"  # bench/gpu_sustained.py --sections duty


@lru_cache(maxsize=1)
def duty_points() -> tuple[tuple[float, float], ...]:
    """(busy fraction, steady / first burst) of the measured duty cycles, by busy fraction: how much of its rate a
    GPU keeps when it waits part of the time (one H200, bf16 GEMM bursts between near-idle gaps)."""
    data = measured_files(SUSTAINED).get(DUTY_FILE)
    if data is None:
        return ()
    recs = data["sections"]["duty"]["records"].values()
    return tuple(sorted((r["summary"]["busy_fraction"], r["summary"]["steady_over_first_burst"]) for r in recs))


def kept_at(busy: float) -> float:
    """The share of its rate the measured GPU kept computing ``busy`` of its time (``duty_points``, linear between
    them; the first below, the last above)."""
    points = duty_points()
    kept = points[0][1] if busy < points[-1][0] else points[-1][1]
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if b0 <= busy <= b1:
            kept = s0 + (s1 - s0) * (busy - b0) / (b1 - b0)
    return kept


def duty_depth(busy: float) -> float:
    """How much of a part's full-load throttle a GPU computing ``busy`` of its time keeps (0..1): what the measured
    H200's duty cycles lost at ``busy`` over what it loses held (``sustained_share``)."""
    held = sustained_share(catalogue()["H200"])[0]
    return min(1.0, max(0.0, (1.0 - kept_at(busy)) / (1.0 - held)))


def duty_share(device: DeviceSpec, busy: float) -> float:
    """The share of its one-shot rate ``device`` keeps computing ``busy`` of its time: its held share's throttle
    (``sustained_share``) scaled by ``duty_depth``."""
    return 1.0 - duty_depth(busy) * (1.0 - sustained_share(device)[0])


def busy_note(busy: float, device: DeviceSpec) -> str | None:
    """What the share leaves out for a step whose compute is ``busy`` of its time, or ``None`` when nothing: a GPU
    that waits keeps more of its boost than the share grants (linear between the measured duty cycles)."""
    share, points = sustained_share(device)[0], duty_points()
    if share >= 1.0 or not points or busy >= points[-1][0]:
        return None
    kept = kept_at(busy)
    if kept <= share + 0.01:
        return None
    return (f"the step computes {busy:.0%} of its time; a GPU that waits this much keeps about {kept:.3f} of its "
            f"rate (measured duty cycles: " + ", ".join(f"busy {b:.2f} kept {s:.3f}" for b, s in points)
            + f"; costmodel/data/measured/{DUTY_FILE}), not the {share:.3f} priced, so its tensor-core ops may run "
            f"up to {kept / share - 1:.0%} faster than priced")
