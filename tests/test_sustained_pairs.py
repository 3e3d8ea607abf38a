"""AIConfigurator's GEMM sweeps held at the power limit against its one-shot sweeps (``bench/aic_vs_costmodel.py``
``held``; ``costmodel/data/published/aic_gemm_sustained.json``), read here row by row; on the H200 against our own
held runs (``costmodel/data/measured/nvidia-h200-sustained*.json``). Each sweep with at least 100 shapes at the cap
is one run of its part in ``costmodel.sustained`` (BENCHMARKS.md, 2026-11-29 "The GB200 priced at its GEMMs' share
held at the power limit").
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.sustained import shares_of
from tests.helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]
RUNS = json.loads((ROOT / "costmodel" / "data" / "published" / "aic_gemm_sustained.json").read_text(
    encoding="utf-8"))["runs"]


def at_cap(part: str, framework: str) -> list[float]:
    """One-shot / held time of a sweep's shapes whose board power read at least 95% of the limit."""
    rows = next(r["rows"] for r in RUNS if (r["part"], r["framework"]) == (part, framework))
    return [one / held for _, _, _, held, one, watts, cap in rows if watts >= 0.95 * cap]


def test_the_sweeps_name_their_cards_and_draw_no_more_than_their_limits():
    assert {(r["part"], r["framework"], r["device_name"]) for r in RUNS} == {
        ("H200", "vllm", "NVIDIA H200"), ("B200", "vllm", "NVIDIA B200"), ("GB200", "vllm", "NVIDIA GB200"),
        ("B200", "trtllm", "NVIDIA B200"), ("GB200", "trtllm", "NVIDIA GB200")}
    cat = catalogue()
    for r in RUNS:
        assert {cap for *_, cap in r["rows"]} == {cat[r["part"]].tdp_w}, r["part"]  # the catalogue's TDPs
        assert max(w for *_, w, _ in r["rows"]) <= 1.03 * cat[r["part"]].tdp_w


def test_the_h200_sweep_agrees_with_our_own_held_runs():
    """Two measurements of one thing by different hands: vLLM's GEMMs held a second each against our GEMMs and
    Llama layer held 25-40 s (bench/gpu_sustained.py): within 1%."""
    ours = [v for name in ("nvidia-h200-sustained.json", "nvidia-h200-sustained-repeat.json")
            for v in shares_of(json.loads((ROOT / "costmodel" / "data" / "measured" / name).read_text(
                encoding="utf-8"))).values()]
    assert abs(statistics.median(at_cap("H200", "vllm")) / statistics.median(ours) - 1) < 0.01


def test_the_gb200_held_at_its_limit_keeps_088_to_091_and_the_b200_088():
    gb200 = [statistics.median(at_cap("GB200", f)) for f in ("vllm", "trtllm")]
    assert 0.87 < gb200[0] < gb200[1] < 0.92 and len(at_cap("GB200", "trtllm")) > 500
    assert 0.87 < statistics.median(at_cap("B200", "vllm")) < 0.89
    assert len(at_cap("B200", "trtllm")) == 20  # too few shapes reached the B200's cap to say anything


def test_the_bench_reports_each_sweep_beside_the_share_meshplan_prices(capsys):
    bench = load_bench("aic_vs_costmodel", "held_rows")
    assert bench.main(["--json"]) == 0
    held = {(r["part"], r["framework"]): r for r in json.loads(capsys.readouterr().out)["held"]}
    assert held[("GB200", "vllm")]["held_share"] == round(statistics.median(at_cap("GB200", "vllm")), 3)
    # the GB200 priced at the median of its two sweeps; the B200 at its FlashAttention-4 run's and its vLLM sweep's
    # (TensorRT-LLM's 20 shapes at the B200's cap count for nothing)
    gb200 = statistics.median([statistics.median(at_cap("GB200", f)) for f in ("vllm", "trtllm")])
    assert held[("GB200", "vllm")]["priced_share"] == round(gb200, 3)
    fa4 = json.loads((ROOT / "costmodel" / "data" / "published" / "flashinfer_b200_sustained.json").read_text(
        encoding="utf-8"))["windows"]
    b200 = statistics.median([fa4[-1]["tflops"] / max(w["tflops"] for w in fa4),
                              statistics.median(at_cap("B200", "vllm"))])
    assert held[("B200", "trtllm")]["priced_share"] == round(b200, 3)
