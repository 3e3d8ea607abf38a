"""Every constant the shipped cost model learned or took from data, with its in-sample error and its error on data it
was not fitted to (``bench/dev_set.py`` prints them beside the dev set's errors).

None of them saw a training step time: the learned op classes are fitted to kernel timings (``data/kernels``), their
held-out error is leave-one-device-out (``metadata.json`` ``unseen_device``, from ``costmodel train``); the grouped
GEMM shares are kernel measurements (``costmodel.grouped``), held out one GPU at a time; so are the Blackwell cuDNN
attention curves (``costmodel.attention``), whose held-out error prices each GPU's cases from the other GPU's curve
scaled by bf16 peak, the rule the B300 is priced by; the GB200's die speed over the B200
(``costmodel.flash2_blackwell``), which carries the GB200's attention curves to the B200, one length at a time; the
sustained-load share (``costmodel.sustained``) is held out one run at a time, the blockwise fp8 GEMM multiple
(``costmodel.fp8_recipes``) one M at a time, the Blackwell GEMM scale (``costmodel.xla_gemm``) on the batched GEMMs
of OpenXLA's table, the Blackwell grouped share and GB300 speed (``costmodel.blackwell_grouped``) on the second run
of each part, the NVFP4 GEMM main loop (``costmodel.fp4_gemm``) one published GEMM at a time, and the B300's
constants from Transformer Engine's GEMM benchmark (``costmodel.te_gemm``: its GEMM scale, the MXFP8 GEMM multiple
and the Blackwell Ultra NVFP4 main loop) one pass of the layer at a time, and the streaming floor of memory-bound
ops (``costmodel.streaming``) and the NVLink collective curves (``costmodel.nvlink_nccl``) one part at a time.
"""
from __future__ import annotations

import statistics

from meshplan.costmodel import (
    blackwell_grouped,
    flash2_blackwell,
    fp4_gemm,
    fp8_recipes,
    nvlink_nccl,
    router_topk,
    streaming,
    sustained,
    te_gemm,
    xla_gemm,
)
from meshplan.costmodel.api import FP8_FIXED_K
from meshplan.costmodel.attention import blackwell_held_out_ratios
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.grouped import MEASURED_ON, curves_of, measured_files, priced_over_measured
from meshplan.costmodel.measured import published_file


def _mape(ratios) -> float:
    """Median |predicted / measured - 1|, percent."""
    return 100.0 * statistics.median(abs(r - 1.0) for r in ratios)


def learned_rows(pricer) -> list[dict]:
    """One row per learned op class of ``pricer``'s model (none for a roofline pricer)."""
    if pricer.model is None:
        return []
    rows = []
    for kind, info in sorted(pricer.model.meta.get("kinds", {}).items()):
        held = info.get("unseen_device") or {}
        rows.append({"constant": f"{kind} latency (learned)", "fitted_on": f"{info['n_train']:,} kernel timings, "
                     f"{len(info['devices'])} devices", "in_sample_error_pct": round(info["train_mape"], 1),
                     "held_out": "one device", "held_out_error_pct": held.get("lodo_mape_blend"),
                     "step_times_used": 0})
    return rows


def grouped_rows(pricer) -> list[dict]:
    """The grouped-GEMM shares: priced against each measured GPU's grouped calls, with the shares of every GPU
    (in sample) and of the others only (held out)."""
    files = {n: d for n, d in measured_files().items() if n in MEASURED_ON}
    if len(files) < 2:
        return []
    cat = catalogue()
    inside, held = [], []
    for name, data in files.items():
        dev = cat[MEASURED_ON[name]]
        inside += map(statistics.median, priced_over_measured(pricer, data, dev).values())
        others = curves_of([d for n, d in files.items() if n != name])
        held += map(statistics.median, priced_over_measured(pricer, data, dev, others).values())
    return [{"constant": "grouped GEMM share of dense", "fitted_on": f"{len(files)} GPUs' grouped kernels "
             f"({', '.join(MEASURED_ON[n] for n in files)})", "in_sample_error_pct": round(_mape(inside), 1),
             "held_out": "one GPU", "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}]


def attention_rows() -> list[dict]:
    """The Blackwell cuDNN attention curves: exact at their own cases (interpolated between them), held out as the
    other measured GPU's curve scaled by bf16 peak."""
    inside, held = blackwell_held_out_ratios()
    return [{"constant": "cuDNN attention rate on Blackwell (published curve)", "fitted_on": f"{len(inside)} bf16 "
             "cases of cuDNN's benchmark on GB200 and GB300", "in_sample_error_pct": round(_mape(inside), 1),
             "held_out": "one GPU (the other's curve, scaled by bf16 peak)", "held_out_error_pct":
             round(_mape(held), 1), "step_times_used": 0}]


def die_speed_rows() -> list[dict]:
    """The GB200 / B200 die speed FlashAttention-2 measured (``costmodel.flash2_blackwell``)."""
    inside, held = flash2_blackwell.held_out_ratios()
    return [{"constant": "GB200 / B200 attention rate (die speed, FlashAttention-2)", "fitted_on": f"{len(inside)} "
            "forward and backward lengths of 16k-128k tokens on a B200 and a GB200 (cuDNN frontend's artifacts)",
            "in_sample_error_pct": round(_mape(inside), 1), "held_out": "one length",
            "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}]


def measured_rows() -> list[dict]:
    """The sustained-load share (held out: one run) and the blockwise fp8 GEMM multiple (held out: one M)."""
    rows = []
    inside, held = sustained.held_out_ratios()
    if inside:
        rows.append({"constant": "sustained share of one-shot rates (power cap)", "fitted_on": f"{len(inside)} "
                     "workloads held 25-40 s on H200 and H100 (3 runs) and "
                     "FlashInfer's published B200 run", "in_sample_error_pct": round(_mape(inside), 1),
                     "held_out": "one run", "held_out_error_pct": round(_mape(held), 1) if held else None,
                     "step_times_used": 0})
    inside, held = fp4_gemm.held_out_ratios(FP8_FIXED_K)
    rows.append({"constant": "NVFP4 GEMM main loop / bf16-over-nvfp4 peak ratio (B200)", "fitted_on": f"{len(inside)} "
                 "published B200 fp4 GEMMs at M >= 4096 (vLLM CUTLASS NVFP4, cuBLASLt MXFP4)",
                 "in_sample_error_pct": round(_mape(inside), 1), "held_out": "one GEMM",
                 "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0})
    inside, held = fp8_recipes.held_out_ratios("blockwise")
    if inside:
        rows.append({"constant": "blockwise fp8 GEMM time / tensor-wise (Hopper)", "fitted_on": f"{len(inside)} "
                     "GEMMs on an H200 (8 shapes x 3 M)", "in_sample_error_pct": round(_mape(inside), 1),
                     "held_out": "one M", "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0})
    return rows


def gemm_scale_rows(pricer) -> list[dict]:
    """The Blackwell GEMM scale (``costmodel.xla_gemm``): the median of the single GEMMs' ratios, held out on the
    batched ones."""
    cat = catalogue()
    inside, held = xla_gemm.held_out_ratios(lambda op, name: pricer.model_price(op, cat[name])[0])
    return [{"constant": "Blackwell / H100 dense GEMM time (OpenXLA's measured table)", "fitted_on":
             f"{len(inside)} bf16 GEMMs timed on a B200 and an H100", "in_sample_error_pct": round(_mape(inside), 1),
             "held_out": f"the {len(held)} batched GEMMs", "held_out_error_pct": round(_mape(held), 1),
             "step_times_used": 0}]


def blackwell_grouped_rows(pricer) -> list[dict]:
    """The Blackwell MXFP8 grouped share and the GB300's GEMM speed (``costmodel.blackwell_grouped``): medians of
    the first GB200 / GB300 runs, held out on the second."""
    cat = catalogue()
    fits = blackwell_grouped.held_out_ratios(lambda op, name: pricer.one_shot_s(op, cat[name]))
    words = {"share": ("MXFP8 grouped / dense GEMM time on Blackwell", "3 forward cases, one GB200 run"),
             "speed": ("GB300 / GB200 GEMM time", "6 cases, one GB200 and one GB300 run")}
    return [{"constant": words[k][0], "fitted_on": f"{words[k][1]} (cuDNN frontend's MoE benchmark)",
             "in_sample_error_pct": round(_mape(inside), 1), "held_out": "the other run",
             "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}
            for k, (inside, held) in fits.items()]


def te_gemm_rows(pricer) -> list[dict]:
    """The B300's three constants (``costmodel.te_gemm``), each held out one pass (fprop, dgrad, wgrad) at a time."""
    b300 = catalogue()[te_gemm.PART]
    fits = {"B300 dense GEMM scale (measured / model-priced bf16)":
            te_gemm.bf16_held_out(lambda op: pricer.model_price(op, b300)[0]),
            "MXFP8 GEMM time / tensor-wise fp8 (Blackwell)": te_gemm.mxfp8_held_out(),
            "NVFP4 GEMM main loop / bf16-over-nvfp4 peak ratio (Blackwell Ultra)":
            fp4_gemm.held_out_ratios(FP8_FIXED_K, te_gemm.PART)}
    return [{"constant": name, "fitted_on": "12 GEMMs of one layer (3 pass sums) on a B300 (Transformer Engine's "
             "GEMM benchmark)", "in_sample_error_pct": round(_mape(inside), 1), "held_out": "one pass",
             "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}
            for name, (inside, held) in fits.items()]


def router_topk_rows() -> list[dict]:
    """The eager router's score function and top-k (``costmodel.router_topk``): fixed time and time per token and
    expert, fitted to the H100 / H200 timings, held out one expert count at a time."""
    inside, held = router_topk.held_out()
    return [{"constant": "eager router top-k time per token and expert", "fitted_on": f"{len(inside)} timings of "
             "torch softmax / sigmoid + topk on an H100 and an H200 (bench/gpu_kernels.py)",
             "in_sample_error_pct": round(_mape(inside), 1), "held_out": "one expert count (128 or 256)",
             "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}]


def streaming_rows() -> list[dict]:
    """The streaming floor of memory-bound ops (``costmodel.streaming``): each part's curve against the rows that
    set it, held out as the other parts' curves at their share of HBM bandwidth."""
    cat = catalogue()
    parts = published_file(streaming.DATA_FILE)["parts"]
    inside, held = streaming.held_out_ratios({p: cat[p].mem_bw_bytes_per_s for p in parts})
    return [{"constant": "streaming rate of a memory-bound kernel by bytes moved (floor)", "fitted_on":
             f"{len(inside)} timings of two static FP8 quantize kernels on {len(parts)} parts (AIConfigurator)",
             "in_sample_error_pct": round(_mape(inside), 1), "held_out": "one part (the others' share of HBM "
             "bandwidth)", "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}]


def nvlink_rows() -> list[dict]:
    """The NVLink collectives' measured curves (``costmodel.nvlink_nccl``): the median over a link family's parts
    against each part's rows, held out as its other parts' median."""
    inside, held = nvlink_nccl.held_out_ratios()
    return [{"constant": "NCCL collective time on NVLink4 / NVLink5 by kind, ranks and size (measured curve)",
             "fitted_on": f"{len(inside)} nccl-tests timings from 1 MiB on H100 / H200, DGX B200 / B300 and GB200 / "
             "GB300 (AIConfigurator)",
             "in_sample_error_pct": round(_mape(inside), 1), "held_out": "one part (the others' median)",
             "held_out_error_pct": round(_mape(held), 1), "step_times_used": 0}]


def fitted_constants(pricer) -> list[dict]:
    """Every fitted or measured constant behind ``pricer``'s prices, as rows for a table."""
    return (learned_rows(pricer) + grouped_rows(pricer) + attention_rows() + die_speed_rows() + measured_rows()
            + gemm_scale_rows(pricer) + blackwell_grouped_rows(pricer) + te_gemm_rows(pricer) + router_topk_rows()
            + streaming_rows() + nvlink_rows())
