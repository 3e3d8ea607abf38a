"""Learned collective latency: an alpha-beta model per link, fitted on measured send/recv, times an xgboost
residual over (size, participants, nodes, link) fitted on measured collectives (Vidur NCCL data).

Link parameters come from point-to-point data, the purest measurement of a link: send/recv time
``t = alpha + n / B`` is fitted by weighted least squares in relative error (Hockney 1994, "The communication
challenge for MPP", Parallel Computing 20(3)). The collective's alpha-beta time on that link is the ring formula
of ``costmodel.collectives`` (Thakur et al. 2005); xgboost learns ``log(measured / alpha-beta)`` as a function of
log size, group size, nodes, devices per node and the link's figures, which captures NCCL's protocol switches
(LL / LL128 / Simple) and hierarchical rings that a two-parameter model misses.
"""
from __future__ import annotations

import base64

import numpy as np
import xgboost as xgb

from meshplan.costmodel.collectives import Link, collective_time_s
from meshplan.costmodel.datasets.table import KernelTable
from meshplan.costmodel.ops import COLLECTIVE_KINDS
from meshplan.core.errors import MeshplanError

FEATURES = ("kind_sendrecv", "log2_bytes", "group_size", "nodes", "per_node", "log2_link_bw", "log2_link_alpha",
            "log2_alpha_beta_s")
PARAMS = dict(max_depth=6, eta=0.1, subsample=0.9, tree_method="hist", nthread=2, seed=0,
              objective="reg:squarederror")
ROUNDS = 300


def fit_link(nbytes: np.ndarray, t_s: np.ndarray) -> tuple[float, float]:
    """Fit ``t = alpha + n / B`` minimising relative error. Returns ``(alpha_s, bandwidth_bytes_per_s)``."""
    A = np.column_stack([np.ones_like(nbytes), nbytes]) / t_s[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones_like(t_s), rcond=None)
    alpha, inv_bw = float(max(coef[0], 1e-7)), float(max(coef[1], 1e-15))
    return alpha, 1.0 / inv_bw


def _alpha_beta(kind: np.ndarray, nbytes: np.ndarray, p: np.ndarray, bw: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return np.array([collective_time_s(k, n, int(g), Link("fit", b, a))
                     for k, n, g, b, a in zip(kind, nbytes, p, bw, alpha)])


def features(kind, nbytes, p, nodes, bw, alpha) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrix and alpha-beta time (s) for collective rows."""
    kind = np.asarray(kind, dtype=object)
    nbytes, p, nodes, bw, alpha = (np.asarray(x, dtype=np.float64) for x in (nbytes, p, nodes, bw, alpha))
    ab = _alpha_beta(kind, nbytes, p, bw, alpha)
    X = np.column_stack([(kind == "sendrecv").astype(float), np.log2(nbytes), p, nodes, p / nodes,
                         np.log2(bw), np.log2(alpha), np.log2(ab)]).astype(np.float32)
    return X, ab


def link_table(table: KernelTable) -> dict[str, dict]:
    """Fit one link per (network, level): ``{"a100_dgx/intra": {"alpha_s", "bw"}, ...}`` from send/recv rows."""
    links = {}
    for net in sorted(set(table.device[table.op == "sendrecv"])):
        for level, nodes in (("intra", 1), ("inter", 2)):
            sel = (table.op == "sendrecv") & (table.device == net) & (table.nodes == nodes)
            if sel.sum() >= 10:
                a, b = fit_link(table.m[sel], table.latency_s[sel])
                links[f"{net}/{level}"] = {"alpha_s": a, "bw": b, "n": int(sel.sum())}
    return links


def _row_links(table: KernelTable, links: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    ok, bw, al = _row_links(coll, links)
    coll = coll.select(ok)
    X, ab = features(coll.op, coll.m, coll.group_size, coll.nodes, bw[ok], al[ok])
    y = np.log(coll.latency_s / ab)
    booster = xgb.train(PARAMS, xgb.DMatrix(X, label=y, feature_names=list(FEATURES)), num_boost_round=rounds)
    raw = bytes(booster.save_raw(raw_format="ubj"))
    return {"links": links, "features": list(FEATURES), "n_train": int(len(coll)),
            "model_ubj_b64": base64.b64encode(raw).decode("ascii")}


class CollectiveModel:
    """A fitted collective model (from :func:`fit`'s dict)."""

    def __init__(self, fitted: dict):
        self.links = fitted["links"]
        self.booster = xgb.Booster()
        self.booster.load_model(bytearray(base64.b64decode(fitted["model_ubj_b64"])))

    def predict_rows(self, kind, nbytes, p, nodes, bw, alpha) -> np.ndarray:
        """Seconds for each row (arrays); never below the fitted link's alpha + n/B of one hop."""
        X, ab = features(kind, nbytes, p, nodes, bw, alpha)
        return ab * np.exp(self.booster.inplace_predict(X))

    def link(self, name: str) -> Link:
        """A fitted link by ``<network>/<intra|inter>`` name (``a100_dgx/inter``)."""
        if name not in self.links:
            raise MeshplanError(f"unknown fitted link '{name}' (known: {', '.join(self.links)})")
        d = self.links[name]
        return Link(name, d["bw"], d["alpha_s"])


def predict_collective(kind: str, nbytes: float, group_size: int, link: Link, nodes: int = 1,
                       model: CollectiveModel | None = None) -> float:
    """Latency of one collective, seconds.

    Args:
        kind: ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall`` or ``sendrecv``.
        nbytes: Payload bytes (full tensor; the message for send/recv).
        group_size: Participants.
        link: Slowest link the group crosses (bandwidth bytes/s, alpha seconds).
        nodes: Nodes the group spans.
        model: Fitted model; ``None`` uses the shipped one (``costmodel.api``) or the plain alpha-beta formula.
    """
    if kind not in COLLECTIVE_KINDS:
        raise MeshplanError(f"unknown collective '{kind}' (known: {', '.join(COLLECTIVE_KINDS)})")
    if model is None:
        from meshplan.costmodel import api

        model = api.collective_model()
    if model is None or group_size <= 1 and kind != "sendrecv":
        return collective_time_s(kind, nbytes, group_size, link)
    # The residual was learned on all-reduce and send/recv; the other ring collectives move half the bytes of
    # an all-reduce per rank, so they use the all-reduce residual at their own alpha-beta time.
    learned_kind = "sendrecv" if kind == "sendrecv" else "allreduce"
    ratio = model.predict_rows([learned_kind], [nbytes], [group_size], [nodes], [link.bandwidth_bytes_per_s],
                               [link.latency_s])[0] / collective_time_s(learned_kind, nbytes, group_size, link)
    return float(collective_time_s(kind, nbytes, group_size, link) * ratio)
