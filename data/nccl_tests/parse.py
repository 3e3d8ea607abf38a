"""Parse published nccl-tests logs into one table (``nccl_tests.csv``) and check the table against the logs.

Each row is one message size of one log: the out-of-place time and nccl-tests' own algbw and busbw columns
(nccl-tests ``doc/PERFORMANCE.md``: algbw = size / time; all-reduce busbw = algbw * 2 (n - 1) / n, all-gather,
reduce-scatter and all-to-all busbw = algbw * (n - 1) / n). Ranks and nodes come from the log's own "Using devices"
lines (one line per rank, naming its host), never from the file name.

A published table of nccl-tests results (microsoft/mscclpp's NDmv4 page: "Latency (us)" at 1K and "BusBW (GB/s)"
at 1G / 4G, in-place, per layout) gives one row per NCCL cell: the column it states, the others by the same
arithmetic.

Usage (from the repository root):
    python data/nccl_tests/parse.py            # rewrite data/nccl_tests/nccl_tests.csv from the logs
    python data/nccl_tests/parse.py --check    # the CSV matches the logs (exit 1 otherwise)
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from meshplan.core.atomic import write_atomic

HERE = Path(__file__).resolve().parent
CSV_PATH = HERE / "nccl_tests.csv"

COLUMNS = ("source", "repo", "commit", "path", "cluster", "device", "nic", "collective", "nodes", "gpus_per_node",
           "size_bytes", "time_us", "algbw_gbps", "busbw_gbps")


@dataclass(frozen=True)
class Source:
    """One folder of logs from one cluster, with where they were published."""

    name: str
    repo: str
    commit: str
    upstream_dir: str
    cluster: str
    device: str
    nic: str
    collective: str  # every log of the folder runs this nccl-tests binary ("" for a table naming its own)
    logs: tuple[str, ...]


SOURCES = (
    Source("echo", "NetX-lab/Echo", "15f0d12c417459d7a1b3b66abeaa28eca0b841a2", "nccl-test-log",
           "Azure ND A100 v4 (nccl-test-log/README.md)", "A100-SXM4-40GB",
           "1x 200 Gb/s HDR InfiniBand per GPU, 8 per node", "allreduce",
           tuple(f"nccl_{n}.log" for n in (1, 2, 4, 8, 16, 32, 64, 128))),
    Source("mscclpp", "microsoft/mscclpp", "85e664c2f7151cd2e207afbcd5713684fe7c5b3b", "docs",
           "Azure NDm A100 v4, NCCL 2.17.1 (performance-ndmv4.md)", "A100-SXM4-80GB",
           "1x 200 Gb/s HDR InfiniBand per GPU, 8 per node", "", ("performance-ndmv4.md",)),
)
# nccl-tests doc/PERFORMANCE.md: busbw = algbw x this factor of the rank count n
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n}
_TABLE_KINDS = {"NCCL AllGather": "allgather", "NCCL AllReduce": "allreduce", "NCCL AllToAll": "alltoall"}
_LAYOUT_RE = re.compile(r"^### (\d+) nodes?, (\d+) gpus?/node")
_SIZE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

# mpirun --tag-output prefixes every line, and sometimes splits a line in the middle with the prefix
_TAG_RE = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_RANK_RE = re.compile(r"^#\s+Rank\s+(\d+)\s.*?\bon\s+(\S+)\s+device")
_ROW_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+\w+\s+\w+\s+(?:-?\d+\s+)?([\d.]+)\s+([\d.]+)\s+([\d.]+)\s")


def parse_log(text: str) -> tuple[int, int, list[tuple[int, float, float, float]]]:
    """``(ranks, nodes, rows)`` of one nccl-tests log; rows are ``(size_bytes, time_us, algbw, busbw)``, out of
    place. Threads of one process (``nGpus 8``) are ranks of one host, as the log lists them."""
    text = _TAG_RE.sub("", text)
    hosts: dict[int, str] = {}
    rows = []
    for line in text.splitlines():
        m = _RANK_RE.match(line)
        if m:
            hosts[int(m.group(1))] = m.group(2)
            continue
        m = _ROW_RE.match(line)
        if m and not line.lstrip().startswith("#"):
            rows.append((int(m.group(1)), float(m.group(3)), float(m.group(4)), float(m.group(5))))
    if not hosts or sorted(hosts) != list(range(len(hosts))):
        raise ValueError("the log's 'Using devices' lines do not list ranks 0..n-1")
    return len(hosts), len(set(hosts.values())), rows


def parse_table(text: str) -> list[tuple[str, int, int, int, float, float, float]]:
    """``(kind, nodes, gpus_per_node, size_bytes, time_us, algbw, busbw)`` of every NCCL cell of a Markdown page
    of "### N nodes, G gpus/node" sections, each with a "Latency (us)" and a "BusBW (GB/s)" table."""
    out, layout, metric, head = [], None, None, []
    for line in text.splitlines():
        m = _LAYOUT_RE.match(line)
        if m:
            layout = int(m.group(1)), int(m.group(2))
            continue
        if line.startswith("**"):
            metric = "latency" if "Latency" in line else "busbw" if "BusBW" in line else None
            continue
        cells = [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Message Size":
            head = cells
            continue
        if layout is None or metric is None or not cells[0][:-1].isdigit() or cells[0][-1] not in _SIZE:
            continue
        size, n = int(cells[0][:-1]) * _SIZE[cells[0][-1]], layout[0] * layout[1]
        for name, value in zip(head[1:], cells[1:]):
            kind = _TABLE_KINDS.get(name)
            if kind is None or not re.fullmatch(r"[\d.]+", value):
                continue
            f = BUS_FACTOR[kind](n)
            busbw = float(value) if metric == "busbw" else size / (float(value) * 1e3) * f
            time_us = float(value) if metric == "latency" else size * f / (busbw * 1e3)
            out.append((kind, *layout, size, round(time_us, 2), round(busbw / f, 2), round(busbw, 2)))
    return out


def _rows(src: Source, name: str) -> list[tuple]:
    """``(collective, nodes, gpus_per_node, size_bytes, time_us, algbw, busbw)`` of one file of ``src``."""
    text = (HERE / src.name / name).read_text(encoding="utf-8")
    if not src.collective:
        return parse_table(text)
    ranks, nodes, rows = parse_log(text)
    if ranks < 2:  # a one-GPU all-reduce moves nothing
        return []
    return [(src.collective, nodes, ranks // nodes, *r) for r in rows]


def table() -> list[dict]:
    """Every row of every source."""
    out = []
    for src in SOURCES:
        for name in src.logs:
            for kind, nodes, per_node, size, time_us, algbw, busbw in _rows(src, name):
                out.append({"source": src.name, "repo": src.repo, "commit": src.commit,
                            "path": f"{src.upstream_dir}/{name}", "cluster": src.cluster, "device": src.device,
                            "nic": src.nic, "collective": kind, "nodes": nodes, "gpus_per_node": per_node,
                            "size_bytes": size, "time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": busbw})
    return out


def render(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare the CSV with the logs instead of writing it")
    args = ap.parse_args(argv)
    text = render(table())
    if args.check:
        same = CSV_PATH.is_file() and CSV_PATH.read_text(encoding="utf-8") == text
        print(f"{CSV_PATH.name} {'matches' if same else 'differs from'} the logs")
        return 0 if same else 1
    write_atomic(CSV_PATH, text)
    print(f"{text.count(chr(10)) - 1} rows -> {CSV_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
