"""The repository's copy of the public data (data/, data/README.md) is intact: every file data/MANIFEST.tsv lists is
there with the content its sha256 says (decompressed where stored as .xz), and nothing unlisted lies beside them.
The manifest's hashes were taken from ../shared's files when data/sync.py copied them."""
from __future__ import annotations

import importlib.util
import lzma

from tests.helpers import REPO, data_path, open_data

_spec = importlib.util.spec_from_file_location("data_sync", REPO / "data" / "sync.py")
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)


def test_every_file_matches_the_manifest():
    assert sync.check() == []


def test_a_changed_file_is_reported(tmp_path, monkeypatch):
    """The check is not vacuous: a copy whose compressed table lost a row is named."""
    src = data_path("kernels", "deepbench", "tidy", "allreduce.csv")
    monkeypatch.setattr(sync, "DATA", tmp_path)
    monkeypatch.setattr(sync, "MANIFEST", tmp_path / "MANIFEST.tsv")
    rel = src.relative_to(REPO / "data").as_posix()
    line = next(ln for ln in (REPO / "data" / "MANIFEST.tsv").read_text().splitlines() if ln.startswith(rel + "\t"))
    (tmp_path / "MANIFEST.tsv").write_text("path\tsource\tbytes\tsha256\n" + line + "\n")
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_bytes(src.read_bytes())
    assert sync.check() == []
    text = lzma.decompress(src.read_bytes()).decode().splitlines()
    (tmp_path / rel).write_bytes(lzma.compress("\n".join(text[:-1]).encode() + b"\n"))
    (problem,) = sync.check()
    assert problem.startswith(f"data/{rel}: content differs")


def test_compressed_tables_read_as_their_upstream_rows():
    """DeepBench all-reduce: 253 rows (data/kernels/deepbench/PROVENANCE.md), through the transparent reader."""
    with open_data("kernels", "deepbench", "tidy", "allreduce.csv") as fh:
        rows = fh.read().splitlines()
    assert rows[0].split(",")[:4] == ["device", "suite", "sheet", "size_floats"]
    assert len(rows) - 1 == 253
