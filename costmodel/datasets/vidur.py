"""Vidur profiling data (microsoft/vidur, MIT; data/kernels/vidur/README.md).

compute/<gpu>/<model>/mlp.csv: fp16 per-op times of Llama-2 layer ops at TP-sharded shapes, columns
``time_stats.<op>.{min,max,mean,median,std}`` in **milliseconds**. network/<node>/{all_reduce,send_recv}.csv:
NCCL times (ms) against ``size`` in **bytes**.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets.devices import canonical
from meshplan.costmodel.datasets.table import (
    MEDIAN_LATENCY_BAND_S,
    KernelTable,
    check_latency_units,
    read_csv,
    table_files,
    to_float,
)
from meshplan.costmodel.features import flops_bytes

SHAPE_COLS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers")
# Vidur sub-op -> meshplan kind. ``attn_rope`` is left out: a rotary kernel has no OpSpec kind of its own
# and its cost is not that of a plain elementwise op.
VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
# Collectives in the network files -> OpSpec kinds.
COLL_KIND = {"all_reduce": "allreduce", "send_recv": "sendrecv"}


def is_dataset(root: Path) -> bool:
    return (root / "compute").is_dir() or (root / "network").is_dir()


def _shape(op: str, T, h, nh, nkv, ffn, tp):
    """(kind, b, m, n, k) of one Vidur sub-op for every row (arrays)."""
    hd = h / nh
    one = np.ones_like(T)
    if op == "emb":
        return "embedding", one, T, h, one
    if op in ("input_layernorm", "post_attention_layernorm"):
        return "rmsnorm", one, T, h, one
    if op == "attn_pre_proj":  # QKV: [T, h] x [h, (nh + 2 nkv) hd / tp]
        return "matmul", one, T, (nh + 2 * nkv) * hd / tp, h
    if op == "attn_post_proj":  # O: [T, nh hd / tp] x [., h]
        return "matmul", one, T, h, nh * hd / tp
    if op == "mlp_up_proj":  # gate+up fused: [T, h] x [h, 2 ffn / tp]
        return "matmul", one, T, 2 * ffn / tp, h
    if op == "mlp_down_proj":
        return "matmul", one, T, h, ffn / tp
    if op == "mlp_act":  # SiLU(gate) * up on [T, ffn/tp] outputs: a fused gated activation (3 passes), not the
        return "swiglu", one, T * ffn / tp, one, one  # unary "activation" class (2 passes: NeuSight's gelu, relu)
    if op == "add":  # residual add on [T, h]
        return "elementwise", one, T * h, one, one
    raise ValueError(op)


def load_compute(path: Path, gpu: str) -> KernelTable:
    """One ``mlp.csv`` -> rows for each of ``VIDUR_OPS`` (median time, std/mean as noise)."""
    required = SHAPE_COLS + tuple(f"time_stats.{o}.{s}" for o in VIDUR_OPS for s in ("median", "mean", "std"))
    cols = read_csv(path, required)
    T, h, nh, nkv, ffn, tp = (to_float(path, c, cols[c]) for c in
                              ("num_tokens", "n_embd", "n_head", "n_kv_head", "n_expanded_embd",
                               "num_tensor_parallel_workers"))
    tables = []
    for o in VIDUR_OPS:
        col = f"time_stats.{o}.median"
        lat_s = to_float(path, col, cols[col]) * 1e-3  # ms -> s
        check_latency_units(path, col, lat_s, *MEDIAN_LATENCY_BAND_S)
        noise = to_float(path, f"time_stats.{o}.std", cols[f"time_stats.{o}.std"]) / np.maximum(
            to_float(path, f"time_stats.{o}.mean", cols[f"time_stats.{o}.mean"]), 1e-12)
        kind, b, m, n, k = _shape(o, T, h, nh, nkv, ffn, tp)
        rows = len(T)
        kinds = np.full(rows, kind, dtype=object)
        flops, nbytes = flops_bytes(kinds, b, m, n, k, np.full(rows, "fp16", dtype=object))
        tables.append(KernelTable.from_columns(
            rows, device=canonical(gpu), op=kinds, variant=o, dtype="fp16", source=f"vidur/{gpu}",
            b=b, m=m, n=n, k=k, flops=flops, bytes=nbytes, latency_s=lat_s, noise=noise))
    return KernelTable.concat(tables)


def load_network(path: Path, node: str) -> KernelTable:
    """One network CSV -> collective rows (device = node type, m = bytes, group_size, nodes)."""
    cols = read_csv(path, ("collective", "num_workers", "size", "devices_per_node"))
    kinds = sorted(set(cols["collective"]))
    unknown = [c for c in kinds if c not in COLL_KIND]
    if unknown:
        raise MeshplanError(f"{path}: column 'collective' has unknown collective '{unknown[0]}'")
    tables = []
    for c in kinds:
        col = f"time_stats.{c}.median"
        cols_c = read_csv(path, (col, f"time_stats.{c}.std", f"time_stats.{c}.mean"))
        sel = np.array(cols["collective"]) == c
        lat_s = to_float(path, col, cols_c[col])[sel] * 1e-3
        check_latency_units(path, col, lat_s, *MEDIAN_LATENCY_BAND_S)
        noise = (to_float(path, "std", cols_c[f"time_stats.{c}.std"]) /
                 to_float(path, "mean", cols_c[f"time_stats.{c}.mean"]))[sel]
        size = to_float(path, "size", cols["size"])[sel]  # bytes (upstream: numel * 2)
        p = to_float(path, "num_workers", cols["num_workers"])[sel]
        dpn = to_float(path, "devices_per_node", cols["devices_per_node"])[sel]
        tables.append(KernelTable.from_columns(
            len(lat_s), device=node, op=COLL_KIND[c], variant=c, dtype="fp16", source=f"vidur/network/{node}",
            m=size, group_size=p, nodes=np.ceil(p / dpn), flops=0.0, bytes=size, latency_s=lat_s, noise=noise))
    return KernelTable.concat(tables)


def load(root: Path, collectives: bool = True) -> tuple[KernelTable, list[str]]:
    """Every compute and (optionally) network CSV under ``root``."""
    tables, files = [], []
    for f in table_files(root / "compute", "*/*/mlp.csv"):
        tables.append(load_compute(f, f.parent.parent.name))
        files.append(str(f))
    if collectives:
        for f in table_files(root / "network", "*/*.csv"):
            tables.append(load_network(f, f.parent.name))
            files.append(str(f))
    return KernelTable.concat(tables), files
