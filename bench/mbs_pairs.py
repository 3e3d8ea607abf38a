"""The dev set's runs of one model, system and mesh at two micro-batch sizes: what a micro-batch costs.

Megatron-Bridge's releases often ran the same model on the same system and mesh (the same TP, PP, CP, EP, global
batch, sequence and precision) at another micro-batch size (``blackwell_dev.jsonl``: Qwen3-30B-A3B on 8 B200s at
micro-batch 1 in 26.02 and 4 in 26.02.01). A step that only moves more tokens through the same kernels takes about as
much longer per micro-batch as the micro-batch holds more tokens; a step whose micro-batches cost a fixed time each
(the host launching eager kernels, a sync per layer) does not. The table sets each pair's published seconds per
micro-batch ratio beside the token ratio and beside meshplan's priced ratio, with what else the two rows run
differently (another release, graphs or dispatcher): ``priced / published`` below 1 means meshplan makes the smaller
micro-batch too cheap against the larger one. Nothing is fitted here: the table only reads the dev set's output.

    python bench/dev_set.py --json > /tmp/dev.json
    python bench/mbs_pairs.py /tmp/dev.json [--markdown | --json]

(without a file it prices the dev set first, about a minute).
"""
from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the mesh a pair shares (``--fix`` keys); the micro-batch is what differs
MESH_KEYS = ("tp", "pp", "cp", "ep", "dp")


def _fix(inp: dict) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in inp["fix"].split(",") if "=" in kv)


def micro_batches(inp: dict) -> int:
    """Micro-batches each pipeline rank runs a step: global batch over data-parallel degree and micro-batch."""
    fix = _fix(inp)
    return inp["global_batch"] // (int(fix["dp"]) * int(fix["mbs"]))


def _runs(inp: dict) -> set[str]:
    """What a row runs beyond its mesh and micro-batch: its other ``--fix`` values and its profile's."""
    skip = (*MESH_KEYS, "mbs", "dp_replicate", "dp_shard")
    return {kv for kv in inp["fix"].split(",") if kv.split("=", 1)[0] not in skip} | set(inp.get("from_profile") or ())


def pairs(rows: list[dict]) -> list[dict]:
    """Every pair of priced rows of one model, system, mesh, global batch, sequence and precision at two micro-batch
    sizes (smaller first). One record per pair: the names, the micro-batch sizes, the published seconds per
    micro-batch of each, their ratio (smaller over larger), the token ratio, the priced ratio per micro-batch,
    ``priced / published``, and what else the two rows run differently."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        inp = row.get("inputs") or {}
        if row["status"] != "priced" or not inp.get("fix"):
            continue
        fix = _fix(inp)
        key = (Path(inp["model"]).stem, inp.get("system"), inp.get("cluster"), inp["global_batch"], inp["seq_len"],
               inp.get("precision") or inp["dtype"], *(fix.get(k) for k in MESH_KEYS))
        groups[key].append(row)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        for a, b in itertools.combinations(members, 2):
            mbs_a, mbs_b = (int(_fix(r["inputs"])["mbs"]) for r in (a, b))
            if mbs_a == mbs_b:
                continue
            if mbs_a > mbs_b:
                a, b, mbs_a, mbs_b = b, a, mbs_b, mbs_a
            n_a, n_b = micro_batches(a["inputs"]), micro_batches(b["inputs"])
            pub_a, pub_b = a["published_step_s"] / n_a, b["published_step_s"] / n_b
            priced = (a["predicted_step_s"] / n_a) / (b["predicted_step_s"] / n_b)
            ra, rb = _runs(a["inputs"]), _runs(b["inputs"])
            out.append({"model": key[0], "system": key[1], "rows": f"{a['name']} / {b['name']}",
                        "mbs": f"{mbs_a} / {mbs_b}", "published_s_per_micro_batch": [pub_a, pub_b],
                        "published_ratio": pub_a / pub_b, "token_ratio": mbs_a / mbs_b, "priced_ratio": priced,
                        "priced_over_published": priced / (pub_a / pub_b),
                        "differs": sorted(ra ^ rb)})
    return out


def _cells(r: dict) -> list[str]:
    pub_a, pub_b = r["published_s_per_micro_batch"]
    return [r["model"], r["system"], r["mbs"], f"{pub_a:.3f} / {pub_b:.3f}", f"{r['published_ratio']:.3f}",
            f"{r['token_ratio']:.3f}", f"{r['priced_ratio']:.3f}", f"{r['priced_over_published']:.3f}",
            ", ".join(r["differs"]) or "-"]


HEAD = ("model", "system", "mbs", "published s per micro-batch", "published ratio", "token ratio", "priced ratio",
        "priced / published", "also differs")


def markdown(records: list[dict]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in records]
    return "\n".join(lines)


def main() -> None:
    import part_pairs  # the pair tables' command line and dev-set reading (bench/ is on the path as a script)

    args = part_pairs.parse_args(__doc__.splitlines()[0])
    records = pairs(part_pairs.dev_rows(args.dev_json))
    if args.json:
        print(json.dumps({"pairs": records}, indent=2))
        return
    if args.markdown:
        print(markdown(records))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in HEAD:  # the cells wrap rather than cut
        table.add_column(col, overflow="fold")
    for r in records:
        table.add_row(*_cells(r))
    Console().print(table)


if __name__ == "__main__":
    main()
