"""Whether meshplan prices every workload preset of the Megatron-Bridge performance profiles, as a run kept apart
would reach it.

A published run of Megatron-Bridge's performance tables that meshplan never saw (a DGX-H100 row, another release's
row) is priced from what its table states (GPU, GPUs, degrees, micro and global batch, sequence, precision, task)
and its release's ``megatron-bridge-perf`` profile, whose launcher preset for that job supplies the rest (CUDA
graphs, recomputation, dispatcher...). This bench states each preset's own facts as such a row and prices it
through ``bench/dev_set.py``'s path for a source without a mapping: a preset meshplan refuses (not expressible, or
out of memory) is a run of that release it could not judge. Nothing published is read: no step time, only whether
the job prices.

Each preset is priced twice: as a row of a source without a mapping (its facts and its profile), and as a row of
the performance tables written as the dev set's own (``blackwell_dev.jsonl``: the release's preset quoted under
``recipe``, its recomputation in the curator's words), the path a kept-apart table row takes; the second copies
the model's fields from the dev set's row of that model and task, and is skipped where the dev set has none. The
sequence a preset's table row would state is the one the dev set's published rows of that model and task state
(their ``seq``), else the preset's own ``seq_length`` (r0.1.0's perf matrix), else 4096. A preset in a precision its
GPU has no tensor cores for (r0.1.0's perf matrix lists MXFP8 entries for H100, which Transformer Engine refuses) is
counted apart, not as a failure.

    python bench/preset_coverage.py [--profile megatron-bridge-perf@26.06.01] [--gpu H100-SXM] [--json]

(about 5 minutes for every profile, GPU and task; 45 s for one profile).
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import dev_set  # noqa: E402


def bridge_profiles() -> list[str]:
    """Every shipped ``megatron-bridge-perf`` profile, oldest first."""
    from meshplan.planner.layout.stacks import _version_key, load_stacks

    profs = [p for p in load_stacks().profiles.values() if p.name == "megatron-bridge-perf"]
    return [p.ref for p in sorted(profs, key=lambda p: _version_key(p.version))]


def dev_rows(runs_dir: Path) -> dict[tuple[str, str], dict]:
    """(bundled model, task) -> the dev set's first Megatron-Bridge row of that model and task."""
    from meshplan.planner.model.config import load_model, preset_names
    from meshplan.planner.search.workloads import _same_shapes

    names = {n: load_model(n) for n in preset_names()}
    out: dict[tuple[str, str], dict] = {}
    for row in dev_set.load_rows(runs_dir):
        if not dev_set.is_bridge_row(row) or not dev_set.in_scope(row):
            continue
        cfg = dev_set.HYBRID_CONFIGS.get(row["name"]) or row.get("config")
        spec = dev_set._config_spec(dev_set._config_path({"config": cfg}, runs_dir))
        name = next((n for n, m in names.items() if _same_shapes(m, spec)), None)
        if name:
            out.setdefault((name, dev_set.row_task(row)), row)
    return out


def precision_word(dtype: str, recipe: str) -> str:
    """A precision word the harness reads back as meshplan's ``dtype`` and fp8 ``recipe`` (``dev_set``'s
    ``STATED_FP8_RECIPE`` for an fp8 row; the dtype's own name otherwise)."""
    if dtype != "fp8":
        return dtype.upper()
    return next(word for word, r in dev_set.STATED_FP8_RECIPE if r == recipe)


def table_word(dtype: str, recipe: str) -> str:
    """The performance tables' precision word for meshplan's ``dtype`` and ``recipe``: the first of
    ``dev_set.BRIDGE_PRECISION`` that the table path reads as them."""
    own = "" if dtype != "fp8" else recipe
    return next(w for w, d, r, _ in dev_set.BRIDGE_PRECISION if (d, r) == (dtype, own))


def preset_row(profile: str, preset, seq: int) -> dict:
    """A held-out row stating ``preset``'s own facts under ``profile``: its degrees (``workloads.DEGREES`` but the
    virtual stages, which the row states as ``pp_interleave``), GPUs, batch, precision and task."""
    from meshplan.planner.search.workloads import DEGREES, PRECISIONS

    s = preset.settings
    deg = {key: preset.degree(field, default) for field, key, default in DEGREES if key != "vpp"}
    n = preset.degree("num_gpus", 8)
    dtype, recipe = PRECISIONS[preset.dtype]
    return {"name": f"{profile}:{preset.name}", "source_id": "coverage", "gpu": preset.gpu,
            "gpus_per_node": int(s.get("num_gpus_per_node") or (4 if preset.gpu.startswith("GB") else 8)),
            "n_gpus": n, **deg, "dp": n // (deg["tp"] * deg["pp"] * deg["cp"]),
            "gbs": preset.degree("global_batch_size", 1), "seq": seq,
            "pp_interleave": s.get("virtual_pipeline_model_parallel_size"), "dtype": dtype,
            "precision_recipe": precision_word(dtype, recipe), "task": preset.task, "config": preset.model,
            "published": {"step_time_s": 1.0}, "meshplan_can_express": "yes", "system": f"DGX-{preset.gpu}",
            "stack": profile}


def table_row(stated: dict, preset, base: dict) -> dict:
    """``stated`` (``preset_row``) written as a row of the performance tables, as the dev set's are: the model's fields
    from the dev set's ``base`` row of that model and task, the release's preset quoted under ``recipe``, its
    recomputation in the curator's words (``dev_set.bridge_recompute`` reads them), its FSDP column where the preset
    runs Megatron-FSDP."""
    mods = preset.settings.get("recompute_modules")
    system = f"DGX-{preset.gpu.removesuffix('-SXM')}"
    fsdp = bool(preset.settings.get("use_megatron_fsdp"))  # the tables' FSDP column: Megatron-FSDP, zero=3
    from meshplan.planner.search.workloads import PRECISIONS

    return {**base, **{k: stated[k] for k in ("name", "n_gpus", "tp", "pp", "cp", "ep", "dp", "mbs", "gbs", "seq",
                                              "pp_interleave", "dtype")},
            "precision_recipe": table_word(*PRECISIONS[preset.dtype]),
            "gpu": f"{preset.gpu} ({system})", "system": system, "gpus_per_node": stated["gpus_per_node"],
            "nvlink_domain": 72 if preset.gpu.startswith("GB") else stated["gpus_per_node"],
            "recompute": f"selective, recompute_modules={list(mods)}" if mods is not None else "none stated",
            "layout_assumptions": {**(base.get("layout_assumptions") or {}), "zero": 3 if fsdp else 1},
            "published": {**base["published"], "fsdp": stated["dp"] if fsdp else 0},
            "recipe": {**base["recipe"], "workload_config": preset.name, "workload_settings": dict(preset.settings),
                       "match": "exact layout"}}


def coverage(runs_dir: Path, profiles: list[str], gpus: Optional[set[str]] = None) -> list[dict]:
    """One record per preset (deduplicated by its facts): profile, preset, GPU, task, the status (and detail) as a
    row of a source without a mapping, and as a table row (``table_status``; "no dev-set row" where none to copy)."""
    from meshplan.costmodel.devices import get_device
    from meshplan.planner.search.workloads import PRECISIONS, load_workloads

    bases = dev_rows(runs_dir)
    out, seen = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        for profile in profiles:
            for p in load_workloads(profile).presets:
                if gpus and p.gpu not in gpus:
                    continue
                base = bases.get((p.model, p.task))
                seq = int(base["seq"]) if base else int(p.settings.get("seq_length") or 4096)
                row = preset_row(profile, p, seq)
                key = (profile, json.dumps({k: v for k, v in row.items() if k != "name"}, sort_keys=True))
                if key in seen:
                    continue
                seen.add(key)
                rec = dict(profile=profile, preset=p.name, gpu=p.gpu, task=p.task, seq=seq)
                recipe = PRECISIONS[p.dtype][1]
                if recipe in ("mxfp8", "nvfp4") and not get_device(p.gpu).supports(recipe):
                    out.append(rec | dict(status="precision not on this part", detail=recipe,
                                          table_status="precision not on this part", table_detail=recipe))
                    continue
                res = dev_set.price_row(row, runs_dir, Path(tmp))
                rec |= dict(status=res.status, detail=res.detail or "")
                if base is None:
                    out.append(rec | dict(table_status="no dev-set row", table_detail=""))
                    continue
                tab = dev_set.price_row(table_row(row, p, base), runs_dir, Path(tmp), profile_only=True)
                out.append(rec | dict(table_status=tab.status, table_detail=tab.detail or ""))
    return out


def main(runs_dir: Annotated[Path, typer.Argument()] = ROOT / "data" / "published_runs",
         profile: Annotated[Optional[list[str]], typer.Option(help="a megatron-bridge-perf profile (repeatable)")]
         = None,
         gpu: Annotated[Optional[list[str]], typer.Option(help="only presets of this GPU part (repeatable)")] = None,
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    records = coverage(runs_dir, profile or bridge_profiles(), set(gpu) if gpu else None)
    if as_json:
        print(json.dumps(records, indent=1))
        return
    table = Table(title="Megatron-Bridge performance presets priced as runs kept apart", show_lines=False)
    for col in ("profile", "GPU", "task", "presets", "priced", "refused", "precision not on the part",
                "as table rows: priced", "refused", "no dev-set row"):
        table.add_column(col, overflow="fold")
    by: dict[tuple, list[dict]] = {}
    for r in records:
        by.setdefault((r["profile"], r["gpu"], r["task"]), []).append(r)
    for (prof, part, task), rs in sorted(by.items()):
        st, tab = Counter(r["status"] for r in rs), Counter(r["table_status"] for r in rs)
        skipped = st["precision not on this part"]
        table.add_row(prof, part, task, str(len(rs)), str(st["priced"]), str(len(rs) - st["priced"] - skipped),
                      str(skipped), str(tab["priced"]),
                      str(len(rs) - tab["priced"] - skipped - tab["no dev-set row"]), str(tab["no dev-set row"]))
    console = Console()
    console.print(table)
    ok = ("priced", "precision not on this part", "no dev-set row")
    for r in records:
        for how, status, detail in (("", r["status"], r["detail"]), ("as a table row: ", r["table_status"],
                                                                      r["table_detail"])):
            if status not in ok:
                console.print(f"{r['profile']} {r['preset']}: {how}{status}: {detail}", soft_wrap=True)


if __name__ == "__main__":
    typer.run(main)
