"""Learned collective latency: an alpha-beta model per link, fitted on measured send/recv, times an xgboost
residual over (size, participants, nodes, link) fitted on measured collectives (Vidur NCCL data). The fit is
training code (``costmodel.collective_fit``); this module loads and evaluates a fitted one.

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

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import Link, collective_time_s
from meshplan.costmodel.ops import COLLECTIVE_KINDS

FEATURES = ("kind_sendrecv", "log2_bytes", "group_size", "nodes", "per_node", "log2_link_bw", "log2_link_alpha",
            "log2_alpha_beta_s")


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


class CollectiveModel:
    """A fitted collective model (from ``costmodel.collective_fit.fit``'s dict)."""

    def __init__(self, fitted: dict):
        import xgboost as xgb  # here, not at the top: ``costmodel.learned`` imports this module on the plan path

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
        model: Fitted model (``Pricer.collective_model()``); ``None``: the plain alpha-beta formula.
    """
    if kind not in COLLECTIVE_KINDS:
        raise MeshplanError(f"unknown collective '{kind}' (known: {', '.join(COLLECTIVE_KINDS)})")
    if model is None or group_size <= 1 and kind != "sendrecv":
        return collective_time_s(kind, nbytes, group_size, link)
    # The residual was learned on all-reduce and send/recv; the other ring collectives move half the bytes of
    # an all-reduce per rank, so they use the all-reduce residual at their own alpha-beta time.
    learned_kind = "sendrecv" if kind == "sendrecv" else "allreduce"
    ratio = model.predict_rows([learned_kind], [nbytes], [group_size], [nodes], [link.bandwidth_bytes_per_s],
                               [link.latency_s])[0] / collective_time_s(learned_kind, nbytes, group_size, link)
    return float(collective_time_s(kind, nbytes, group_size, link) * ratio)
