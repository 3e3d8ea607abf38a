"""The dev set judged as runs kept apart are: each row cut down to what its table states and priced by
``bench/dev_set.py``'s path for a source it has no mapping for (``_stated_needs``), under one stack profile.

Run: python bench/as_held_out.py [RUNS_DIR] [--stack NAME[@VERSION] | --stack own] [--json]

Each row keeps its model, GPU, nodes and NVLink domain, degrees, batch, sequence, precision and task; its recipe,
container, launch-file settings and the curator's layout assumptions are dropped. Its ZeRO stage stays only where
its table states one (a Megatron-Bridge FSDP column above 0: Megatron-FSDP, zero=3; AutoModel's FSDP column above 1:
FSDP2, zero=3), recomputation and torch.compile only where the table states them (torchtitan's activation
checkpointing column and its 'FSDP + torch.compile' rows), the router where the publication names it (AutoModel's
'Fake balanced gate is enabled': ``moe_router`` contiguous), and the kernels and pipeline runs AutoModel's Kernel
Optimizations and GA columns state (``dev_set.automodel_table_facts``). Every row is
re-labelled ``<source>*`` and priced under ``--stack`` (default: the harness's default for such sources,
Megatron-Bridge's newest; ``own``: the profile its source's own mapping uses, e.g. the release's
``megatron-bridge-perf`` for a B1 row). The table prints, per source, mean |error| and median signed error next to
the same rows priced by the source's own mapping, profile-only, both over the rows priced both ways.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import dev_set
import typer
from rich.console import Console
from rich.table import Table

# What a held-out row keeps of a dev-set row: the facts its table states (README, "Fields")
KEPT = ("name", "gpu", "gpus_per_node", "nvlink_domain", "n_gpus", "tp", "pp", "dp", "cp", "ep", "mbs", "gbs", "seq",
        "pp_interleave", "dtype", "precision_recipe", "task", "config", "layers", "num_experts", "published",
        "meshplan_can_express", "system")


def as_stated(row: dict, runs_dir: Path, stack: Optional[str]) -> dict:
    """``row`` as a run of an unknown source states it (module docstring)."""
    out = {k: row[k] for k in KEPT if k in row}
    out["source_id"] = f"{row['source_id']}*"
    out["task"] = "lora" if row.get("task") == "lora" else dev_set.row_task(row)  # a fine-tuning table says so
    config = dev_set.HYBRID_CONFIGS.get(row["name"])  # rows naming no config: the harness's reading of them
    out["config"] = dev_set._config_path({"config": config} if config else row, runs_dir)
    if config:
        out["meshplan_can_express"] = "yes"
    fsdp = (row.get("published") or {}).get("fsdp")
    if isinstance(fsdp, int) and not isinstance(fsdp, bool) and fsdp > 0:
        out["zero"] = 3
    out |= dev_set.automodel_table_facts(row)  # AutoModel's FSDP column and Kernel Optimizations cell
    # AutoModel's table: 'Fake balanced gate is enabled', the router of its MoE models (a dense one has none)
    if dev_set.states_fake_gate(row) and out.get("config") and dev_set._config_spec(out["config"]).is_moe:
        out["moe_router"] = "contiguous"
    facts = dev_set.TORCHTITAN_FACTS.get(row["name"])
    if facts:  # torchtitan's tables: GPUs, bf16, FSDP, the activation checkpointing (full or a selective kind),
        # torch.compile ('FSDP + torch.compile')
        out |= {"n_gpus": facts["n_gpus"], "dtype": out.get("dtype") or "bf16", "zero": 3,
                "recompute": dev_set.torchtitan_recompute(row), "compile": facts["compile"]}
        if facts.get("device"):
            out["device"] = dev_set.TORCHTITAN_HBM2E_DEVICE  # what the harness reads the doc's part as
    if stack == "own":  # the profile the source's own mapping prices it with
        out["stack"] = dev_set.SOURCE_PROFILE.get(row["source_id"]) or dev_set.bridge_profile(row)
    elif stack:
        out["stack"] = stack
    return out


def judged_rows(runs_dir: Path) -> list[dict]:
    """The rows judged apart: every row the dev set prices (``dev_set.in_scope``), the hybrid rows it maps to a
    config included."""
    return [r for r in dev_set.load_rows(runs_dir) if dev_set.in_scope(r)]


def summaries(runs_dir: Path, stack: Optional[str]) -> list[dict]:
    """Per source: rows, those priced held out, and over the rows priced both ways, mean |error| and median signed
    error held out and profile-only by the source's own mapping."""
    rows = judged_rows(runs_dir)
    with tempfile.TemporaryDirectory() as tmp:
        own = [dev_set.price_row(r, runs_dir, Path(tmp), profile_only=True) for r in rows]
        held = [dev_set.price_row(as_stated(r, runs_dir, stack), runs_dir, Path(tmp)) for r in rows]
    out = []
    for src in sorted({r.source for r in own}) + ["all"]:
        pairs = [(a, b) for a, b in zip(own, held) if src in ("all", a.source)]
        both = [(a, b) for a, b in pairs if a.status == b.status == "priced"]  # the means compare the same rows
        held_rows = [b for _, b in pairs]
        out.append({"source": src, "rows": len(pairs), "priced_held_out": sum(b.status == "priced" for _, b in pairs),
                    "priced_both": len(both), **_errors("held_out", [b for _, b in both]),
                    **_errors("own_profile_only", [a for a, _ in both]),
                    "profiles_held_out": sorted({b.inputs.get("profile", "") for _, b in pairs} - {""}),
                    # held out, the rows each open figure moves and those whose published step lies in its band
                    **{f"held_out_{b}_band_{k}": n for b, attr in (("host", "host_speed_step_s"),
                                                                  ("sustained", "sustained_step_s"))
                       for k, n in zip(("rows", "holds_published"), dev_set.band_counts(held_rows, attr))}})
    return out


def _errors(label: str, results: list) -> dict:
    errs = [r.error for r in results if r.status == "priced"]
    return {f"{label}_mean_abs": statistics.fmean(abs(e) for e in errs) if errs else None,
            f"{label}_median_signed": statistics.median(errs) if errs else None}


def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def main(runs_dir: Annotated[Path, typer.Argument(help="Folder of *.jsonl published runs")] = dev_set.DEFAULT_RUNS,
         stack: Annotated[Optional[str], typer.Option(help="Stack profile for every row (default: the harness's "
                                                      "default for a source without a mapping; 'own': each "
                                                      "source's own)")] = None,
         json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON")] = False) -> None:
    """Price the dev set as runs kept apart are priced, next to its own mappings' profile-only prices."""
    try:
        out = summaries(runs_dir, stack)
    except dev_set.MeshplanError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    if json_out:
        print(json.dumps(out, indent=2))
        return
    t = Table(title="the dev set judged as held-out runs: stated facts and one stack profile; beside it, its own "
                    "mapping (own map) priced profile-only; |err|: mean |error|")
    # the figures keep their width; the names fold, never narrower than a source's name or a profile's word
    t.add_column("source", overflow="fold", min_width=6)
    for col in ("rows", "priced\nheld\nout", "priced\nboth\nways", "held\nout\n|err|", "held\nout\nmedian",
                "own\nmap\n|err|", "own\nmap\nmedian", "host\nband\nholds", "sustained\nband\nholds"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("profile", overflow="fold", min_width=8)
    for s in out:
        t.add_row(s["source"], str(s["rows"]), str(s["priced_held_out"]), str(s["priced_both"]),
                  _pct(s["held_out_mean_abs"]),
                  _pct(s["held_out_median_signed"]), _pct(s["own_profile_only_mean_abs"]),
                  _pct(s["own_profile_only_median_signed"]),
                  *(f"{s[f'held_out_{b}_band_holds_published']} of {s[f'held_out_{b}_band_rows']}"
                    if s[f"held_out_{b}_band_rows"] else "-" for b in ("host", "sustained")),
                  ", ".join(s["profiles_held_out"]))
    Console().print(t)


if __name__ == "__main__":
    typer.run(main)
