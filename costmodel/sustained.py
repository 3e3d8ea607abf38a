"""The share of a one-shot kernel rate a GPU sustains through a training run.

Every compute price rests on kernel benchmarks: calls timed on a GPU that was idle or cool just before, so at its
boost clock. Training keeps the GPU busy for hours, and an SXM part then runs at its board power limit. On one H200
(700 W), ``bench/gpu_sustained.py`` held three workloads for 25-40 s each: a bf16 GEMM, an fp8 GEMM, and the forward
and backward of one Llama-3.1-70B decoder layer as TP 8 leaves it. Within 250 ms of the start the SM clock fell from
1980 MHz to 1350-1680 MHz (nvidia-smi clock-event reason 0x4, the software power cap, at 692-694 W), and the rate
settled at 0.934-0.947 of the first call's, alike for the GEMMs and the whole layer (two runs on two machines;
``costmodel/data/measured/nvidia-h200-sustained*.json``).

The share is the median of steady / first over every workload and run. The planner's estimator divides every
compute op's price by it (``costmodel.api.Pricer(..., sustained=True)``). It holds for the measured part and for
parts with the same SMs, boost clock and power limit (H100 SXM, H800: the same GH100 die at 700 W). Every other part
takes 1: no sustained-load measurement exists for it, and ``meshplan plan --explain`` says so.
"""
from __future__ import annotations

import statistics
from functools import lru_cache

from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.measured import SUSTAINED, measured_files

# measurement file -> the catalogued device it ran on (its environment.device_name is "NVIDIA H200")
MEASURED_ON = {"nvidia-h200-sustained.json": "H200", "nvidia-h200-sustained-repeat.json": "H200"}
NO_MEASUREMENT = "no sustained-load measurement for this part: priced at one-shot kernel rates"


def shares_of(data: dict) -> dict[str, float]:
    """Workload -> steady / first-second rate of one measurement file's ``sustain`` section (as the file's summary
    states it)."""
    records = data["sections"]["sustain"]["records"]
    return {name: r["summary"]["steady_over_first_second_max"] for name, r in records.items() if "summary" in r}


def same_part(a: DeviceSpec, b: DeviceSpec) -> bool:
    """Same SMs, boost clock and board power limit: the same die held at the same cap."""
    return (a.vendor, a.sm_count, a.clock_hz, a.tdp_w) == (b.vendor, b.sm_count, b.clock_hz, b.tdp_w) and a.tdp_w > 0


@lru_cache(maxsize=1)
def _measured() -> tuple[tuple[DeviceSpec, float, str], ...]:
    cat, by_device = catalogue(), {}
    for name, data in measured_files(SUSTAINED).items():
        if name in MEASURED_ON:
            by_device.setdefault(MEASURED_ON[name], ([], []))
            by_device[MEASURED_ON[name]][0].extend(shares_of(data).values())
            by_device[MEASURED_ON[name]][1].append(name)
    return tuple((cat[dev], statistics.median(vals), ", ".join(files)) for dev, (vals, files) in by_device.items())


def sustained_share(device: DeviceSpec) -> tuple[float, str]:
    """``(share, source)``: the fraction of its one-shot kernel rate ``device`` sustains under training load (1 for
    a part with no measurement), and where the figure comes from."""
    for measured, share, files in _measured():
        if same_part(device, measured):
            via = "" if device.name == measured.name else " (the same die at the same power limit)"
            return share, (f"{share:.3f} of one-shot rates under sustained load: measured on an {measured.name}{via} "
                           f"(bench/gpu_sustained.py; costmodel/data/measured/{files})")
    return 1.0, NO_MEASUREMENT


def held_out_ratios() -> tuple[list[float], list[float]]:
    """(in sample, one run held out): predicted / measured steady rate of every workload of every run, the
    prediction being the share times the workload's first-second rate; held out, the share of the other runs."""
    runs = [(name, data["sections"]["sustain"]["records"]) for name, data in measured_files(SUSTAINED).items()
            if name in MEASURED_ON]
    shares = {name: shares_of({"sections": {"sustain": {"records": recs}}}) for name, recs in runs}
    every = statistics.median(v for s in shares.values() for v in s.values())
    inside, held = [], []
    for name, recs in runs:
        others = [v for n, s in shares.items() if n != name for v in s.values()]
        for workload, share in shares[name].items():
            inside.append(every / share)
            if others:
                held.append(statistics.median(others) / share)
    return inside, held
