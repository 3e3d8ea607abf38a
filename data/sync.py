"""Copy the subsets of ``../shared`` that meshplan's code, benches and tests read into ``data/``, and check the copy.

``../shared`` is where new public data arrives; ``data/`` is what the repository carries and the code reads.
The rules below are the whole selection: a path pattern relative to ``../shared`` and whether the file is stored
xz-compressed (``name.csv`` -> ``name.csv.xz``: the large kernel tables, read transparently by
``meshplan.costmodel.datasets.table``). Everything else is copied byte for byte, already-gzipped traces included.
``data/MANIFEST.tsv`` records, per file, where it came from and the sha256 of its content (decompressed), so the
copy can be checked without ``../shared`` (``--check``) and against it (``--check --from ../shared``).

Usage (from the repository root):
    python data/sync.py --from ../shared            # refresh data/ and MANIFEST.tsv
    python data/sync.py --check [--from ../shared]  # verify data/ against MANIFEST.tsv (and the source)
"""
from __future__ import annotations

import argparse
import hashlib
import lzma
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent
MANIFEST = DATA / "MANIFEST.tsv"

# (glob relative to ../shared, compress with xz). Each group is one source; the README beside it says what it is.
RULES: tuple[tuple[str, bool], ...] = (
    ("kernels/README.md", False),
    # NeuSight (sitar-lab/NeuSight): the kernel tables the cost model trains on, the device configs and end-to-end
    # labels the tests check; paper_results/ is read by nothing here.
    ("kernels/neusight/*.md", False), ("kernels/neusight/*.txt", False), ("kernels/neusight/MANIFEST.tsv", False),
    ("kernels/neusight/train/**/*.csv", True), ("kernels/neusight/test/*.csv", True),
    ("kernels/neusight/device_configs/*.json", False), ("kernels/neusight/labels/**/*", False),
    # Vidur (microsoft/vidur): every compute and network table.
    ("kernels/vidur/*.md", False), ("kernels/vidur/*.txt", False), ("kernels/vidur/MANIFEST.tsv", False),
    ("kernels/vidur/compute/**/*.csv", True), ("kernels/vidur/network/**/*.csv", True),
    # DeepBench (baidu-research/DeepBench): the tidy GEMM and all-reduce tables the loader reads (not raw/, conv).
    ("kernels/deepbench/*.md", False), ("kernels/deepbench/*.txt", False), ("kernels/deepbench/MANIFEST.tsv", False),
    ("kernels/deepbench/tidy/gemm.csv", True), ("kernels/deepbench/tidy/allreduce.csv", True),
    ("kernels/device-specs/*", False),
    ("model_configs/*", False),
    # The dev set: the Hopper runs and the Blackwell ones (Megatron-Bridge's archive, B1/B2), with their configs.
    ("published_runs/README.md", False), ("published_runs/dev_runs.jsonl", False),
    ("published_runs/blackwell_dev.jsonl", False), ("published_runs/configs/*", False),
    ("traces/**/*", False),
    ("notes/exports.md", False),
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content(path: Path) -> bytes:
    """A file's content, decompressed when it is stored as ``.xz``."""
    raw = path.read_bytes()
    return lzma.decompress(raw) if path.suffix == ".xz" else raw


def selected(source: Path) -> list[tuple[str, bool]]:
    """``(path relative to source, compress)`` of every file the rules select, sorted."""
    out = {}
    for pattern, xz in RULES:
        for p in source.glob(pattern):
            if p.is_file():
                out[p.relative_to(source).as_posix()] = xz
    return sorted(out.items())


def sync(source: Path) -> int:
    """Rewrite data/ from ``source`` (only the selected files; files no rule selects any more are removed)."""
    rows, keep = [], {MANIFEST, DATA / "sync.py", DATA / "README.md"}
    for rel, xz in selected(source):
        raw = (source / rel).read_bytes()
        dest = DATA / (rel + ".xz" if xz else rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        stored = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME) if xz else raw
        if not dest.is_file() or content(dest) != raw:
            dest.write_bytes(stored)
        keep.add(dest)
        rows.append(f"{dest.relative_to(DATA).as_posix()}\t{rel}\t{len(raw)}\t{sha256(raw)}")
    tops = {rule.split("/")[0] for rule, _ in RULES}
    for p in DATA.rglob("*"):
        if p.is_file() and p not in keep and p.name != "README.md" and p.relative_to(DATA).parts[0] in tops:
            p.unlink()
    MANIFEST.write_text("path\tsource\tbytes\tsha256\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return len(rows)


def check(source: Path | None = None) -> list[str]:
    """Problems found: a manifest file missing or changed, a stray file, or (with ``source``) a source file that
    differs from its copy. Empty when the copy is intact."""
    problems, listed = [], set()
    for line in MANIFEST.read_text(encoding="utf-8").splitlines()[1:]:
        path, rel, nbytes, digest = line.split("\t")
        listed.add(path)
        p = DATA / path
        if not p.is_file():
            problems.append(f"data/{path}: missing (MANIFEST.tsv lists it)")
            continue
        got = content(p)
        if len(got) != int(nbytes) or sha256(got) != digest:
            problems.append(f"data/{path}: content differs from MANIFEST.tsv (sha256 {sha256(got)[:12]})")
        if source is not None and (source / rel).is_file() and (source / rel).read_bytes() != got:
            problems.append(f"data/{path}: differs from {source / rel} (run data/sync.py --from {source})")
    tops = {rule.split("/")[0] for rule, _ in RULES}  # a folder of one's own beside them (collect output) is left be
    for p in DATA.rglob("*"):
        rel = p.relative_to(DATA).as_posix()
        if p.is_file() and rel.split("/")[0] in tops and rel not in listed and p.name != "README.md":
            problems.append(f"data/{rel}: not in MANIFEST.tsv")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", type=Path, help="the shared data folder (e.g. ../shared)")
    ap.add_argument("--check", action="store_true", help="verify data/ instead of writing it")
    args = ap.parse_args(argv)
    if args.source is not None and not args.source.is_dir():
        print(f"--from {args.source}: not a folder", file=sys.stderr)
        return 2
    if args.check:
        problems = check(args.source)
        print("\n".join(problems) or f"data/ matches MANIFEST.tsv{' and ' + str(args.source) if args.source else ''}")
        return 1 if problems else 0
    if args.source is None:
        print("--from: give the shared data folder to copy from (e.g. ../shared)", file=sys.stderr)
        return 2
    print(f"{sync(args.source)} files in data/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
