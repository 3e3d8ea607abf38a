"""Fitting the learned collective model (training side of ``costmodel.collective_model``).

Link parameters come from point-to-point data, the purest measurement of a link: send/recv time
``t = alpha + n / B`` is fitted by weighted least squares in relative error (Hockney 1994, "The communication
challenge for MPP", Parallel Computing 20(3)); xgboost then learns ``log(measured / alpha-beta)`` of the
collectives on those links (``collective_model.features``).
"""
from __future__ import annotations

import base64

import numpy as np
import xgboost as xgb

from meshplan.costmodel.collective_model import FEATURES, features
from meshplan.costmodel.datasets.table import KernelTable

PARAMS = dict(max_depth=6, eta=0.1, subsample=0.9, tree_method="hist", nthread=2, seed=0,
              objective="reg:squarederror")
ROUNDS = 300


def fit_alpha_bandwidth(nbytes: np.ndarray, t_s: np.ndarray) -> tuple[float, float]:
    """Fit ``t = alpha + n / B`` minimising relative error. Returns ``(alpha_s, bandwidth_bytes_per_s)``."""
    A = np.column_stack([np.ones_like(nbytes), nbytes]) / t_s[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones_like(t_s), rcond=None)
    alpha, inv_bw = float(max(coef[0], 1e-7)), float(max(coef[1], 1e-15))
    return alpha, 1.0 / inv_bw


def link_table(table: KernelTable) -> dict[str, dict]:
    """Fit one link per (network, level): ``{"a100_dgx/intra": {"alpha_s", "bw"}, ...}`` from send/recv rows."""
    links = {}
    for net in sorted(set(table.device[table.op == "sendrecv"])):
        for level, nodes in (("intra", 1), ("inter", 2)):
            sel = (table.op == "sendrecv") & (table.device == net) & (table.nodes == nodes)
            if sel.sum() >= 10:
                a, b = fit_alpha_bandwidth(table.m[sel], table.latency_s[sel])
                links[f"{net}/{level}"] = {"alpha_s": a, "bw": b, "n": int(sel.sum())}
    return links


def row_links(table: KernelTable, links: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row link (bandwidth bytes/s, alpha s) of the network the row was measured on.

    Across nodes, the fitted send/recv link is one GPU pair over one NIC. DGX A100/H100 nodes have one NIC
    per GPU (NVIDIA DGX A100 / H100 user guides: 8 compute HCAs), and NCCL runs one ring channel per NIC, so
    a group with ``k`` GPUs per node moves its data over ``k`` NICs: the ring's effective link is ``k`` pairs.
    """
    keys = np.array([f"{d}/{'intra' if n <= 1 else 'inter'}" for d, n in zip(table.device, table.nodes)], dtype=object)
    ok = np.array([k in links for k in keys])
    per_node = np.where(table.nodes > 1, table.group_size / np.maximum(table.nodes, 1), 1.0)
    bw = np.array([links[k]["bw"] if k in links else np.nan for k in keys]) * per_node
    al = np.array([links[k]["alpha_s"] if k in links else np.nan for k in keys])
    return ok, bw, al


def fit(table: KernelTable, link_rows: KernelTable | None = None, rounds: int = ROUNDS) -> dict:
    """Fit links (on ``link_rows`` or ``table``'s send/recv) and the residual model on ``table``'s collectives.

    Returns:
        A JSON-able dict: ``{"links": ..., "model_ubj_b64": ..., "features": [...], "n_train": int}``; empty
        ``{}`` when the table holds no usable collective rows.
    """
    coll = table.select(np.isin(table.op, ("allreduce", "sendrecv")) & np.char.endswith(
        table.source.astype(str), "_dgx"))
    if len(coll) == 0:
        return {}
    links = link_table(link_rows if link_rows is not None else coll)
    ok, bw, al = row_links(coll, links)
    coll = coll.select(ok)
    X, ab = features(coll.op, coll.m, coll.group_size, coll.nodes, bw[ok], al[ok])
    y = np.log(coll.latency_s / ab)
    booster = xgb.train(PARAMS, xgb.DMatrix(X, label=y, feature_names=list(FEATURES)), num_boost_round=rounds)
    raw = bytes(booster.save_raw(raw_format="ubj"))
    return {"links": links, "features": list(FEATURES), "n_train": int(len(coll)),
            "model_ubj_b64": base64.b64encode(raw).decode("ascii")}
