"""What-if knobs: change a dataflow graph, replay it, read the predicted step time.

Knob syntax (``meshplan replay RUN --what-if KNOB``, repeatable; several knobs may be joined by commas:
``--what-if "name~sort=0.25,name~randn=0.25"``), ``[@RANKS]`` optionally restricts a knob to ranks (``@3`` or
``@0,2-3``). Every knob must change at least one op: a knob that matches nothing is an error naming the closest
op names, never an unchanged step reported as the what-if.

===========================  =================================================================================
``compute=0.8``              scale every compute op's duration (also ``comm``, ``host``, ``memcpy``, ``all``)
``name~allreduce=0``         scale ops whose name or collective type contains the text (case-insensitive;
                             ``_`` and ``:`` ignored, so ``allreduce`` matches ``nccl:all_reduce``)
``bandwidth=2``              links 2x faster: each collective's bandwidth term shrinks, its latency term stays
                             (alpha-beta, Thakur et al. 2005; alpha and beta fitted to the run's own collectives)
``stragglers=median``        every op takes the median duration of its peers across ranks (the same op on
                             every rank), and every rank starts the step at the median time ("Understanding
                             Stragglers in Large Model Training Using What-if Analysis", 2025)
``bucket=25MB``              DDP gradient bucket size: the all-reduces of a step are fused/split into buckets
                             of this size (dPRO's tensor-fusion pass), each re-priced alpha + bytes * beta
===========================  =================================================================================
"""
from __future__ import annotations

import difflib
import math
import statistics
from dataclasses import dataclass

import networkx as nx

from meshplan.core.errors import MeshplanError
from meshplan.core.units import parse_size

KIND_KEYS = ("compute", "comm", "host", "memcpy", "all")
MAX_FACTOR = 1e6  # a duration factor beyond this is a typo, not a question
DEFAULT_ALPHA_S = 10e-6  # per-collective latency when the run has too few collectives to fit one (NCCL ring
# all-reduce of a few bytes on NVLink/PCIe takes ~10-20 µs: nccl-tests all_reduce_perf small-message rows)


@dataclass(frozen=True)
class Knob:
    """One parsed what-if knob (``key``: kind, ``name~<text>``, ``bandwidth``, ``stragglers`` or ``bucket``)."""

    key: str
    value: float
    ranks: frozenset[int] | None = None
    text: str = ""


def _norm(s: str) -> str:
    return s.lower().replace("_", "").replace(":", "").replace(" ", "")


def _parse_ranks(spec: str, knob: str) -> frozenset[int]:
    out: set[int] = set()
    try:
        for part in spec.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out.update(range(int(a), int(b) + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise MeshplanError(f"what-if {knob!r}: bad rank list {spec!r} (expected e.g. @3 or @0,2-3)") from None
    return frozenset(out)


def split_knobs(texts: list[str]) -> list[str]:
    """Knob strings as given (``--what-if`` repeated and/or comma-separated) -> one string per knob.

    ``a=1,b=2`` is two knobs. A comma inside a rank list stays with its knob: ``compute@0,2-3=2`` is one knob
    (a piece without ``=`` belongs to the next piece).
    """
    out: list[str] = []
    for text in texts:
        carry = ""
        for piece in str(text).split(","):
            cur = f"{carry},{piece}" if carry else piece
            if "=" in piece:
                out.append(cur.strip())
                carry = ""
            else:
                carry = cur
        if carry.strip():
            out.append(carry.strip())  # no '=' anywhere after it: parse_knob says what is wrong
    return [k for k in out if k]


def parse_knobs(texts: list[str]) -> list[Knob]:
    """Parse every knob of :func:`split_knobs` (each refused loudly when malformed)."""
    return [parse_knob(k) for k in split_knobs(texts)]


def parse_knob(text: str) -> Knob:
    """Parse ``key[@ranks]=value``.

    Raises:
        MeshplanError: Unknown key, missing ``=``, or a value that is not a finite non-negative number.
    """
    if "=" not in text:
        raise MeshplanError(f"what-if {text!r}: expected KEY=VALUE (e.g. compute=0.8, comm=0.5, name~allreduce=0, "
                            f"bandwidth=2, stragglers=median, bucket=25MB)")
    key, val = text.rsplit("=", 1)
    key = key.strip()
    ranks = None
    if "@" in key:
        key, rspec = key.split("@", 1)
        ranks = _parse_ranks(rspec, text)
    lk = key.lower()
    if lk == "stragglers":
        if val.strip().lower() not in ("median", "remove", "off", "0"):
            raise MeshplanError(f"what-if {text!r}: stragglers takes 'median' (remove stragglers)")
        return Knob("stragglers", 0.0, ranks, text)
    if lk in ("bucket", "bucket_size", "bucket_mb"):
        try:
            size = parse_size(val, default_unit="mb" if lk == "bucket_mb" else "b")
        except MeshplanError as exc:
            raise MeshplanError(f"what-if {text!r}: bucket {exc}") from None
        return Knob("bucket", size, ranks, text)
    knob = _factor_knob(key)
    if knob is None:
        raise MeshplanError(f"what-if {text!r}: unknown knob {key!r} (use compute, comm, host, memcpy, all, "
                            f"name~TEXT, bandwidth, stragglers, bucket)")
    try:
        v = float(val)
    except ValueError:
        raise MeshplanError(f"what-if {text!r}: value {val!r} is not a number") from None
    if v < 0 or not math.isfinite(v):
        raise MeshplanError(f"what-if {text!r}: value must be a finite number >= 0")
    if v > MAX_FACTOR:
        raise MeshplanError(f"what-if {text!r}: factor {v:g} is above {MAX_FACTOR:g} (a slowdown that large is "
                            f"not a what-if question)")
    if knob == "bandwidth" and v == 0:
        raise MeshplanError(f"what-if {text!r}: bandwidth factor must be > 0")
    return Knob(knob, v, ranks, text)


def _factor_knob(key: str) -> str | None:
    """The knob a factor key names (``bandwidth``, an event kind, ``name~TEXT`` normalised), ``None`` for no knob."""
    lk = key.lower()
    if lk == "bandwidth" or lk in KIND_KEYS:
        return lk
    if lk.startswith("name~") and len(key) > 5:
        return "name~" + _norm(key[5:])
    return None


def _fixed(a: dict) -> bool:
    """Nodes no knob scales: waits (they shrink with what they wait for), unexplained delays, idle spans."""
    return bool(a.get("wait") or a.get("delay") or a.get("idle"))


def _matches(k: Knob, a: dict) -> bool:
    """True when knob ``k`` changes node ``a``."""
    if k.ranks is not None and a["rank"] not in k.ranks:
        return False
    if k.key in KIND_KEYS:
        return (k.key == "all" or a["kind"] == k.key) and not _fixed(a)
    if k.key.startswith("name~"):
        pat = k.key[5:]
        return not _fixed(a) and (pat in _norm(a.get("name", "")) or pat in _norm(a.get("coll_type") or ""))
    if k.key in ("bandwidth", "bucket"):
        return a["kind"] == "comm" and (k.key == "bandwidth" or a.get("coll_type") == "allreduce")
    return a.get("peer") is not None  # stragglers


def check_knobs(G: nx.DiGraph, knobs: list[Knob]) -> dict[str, int]:
    """Ops each knob changes; a knob that changes none is an error naming the closest op names.

    Returns:
        knob text -> number of ops it matches.

    Raises:
        MeshplanError: A knob matches no op of the run (a typo must not report the unchanged step as the answer).
    """
    counts: dict[str, int] = {}
    nodes = [a for _, a in G.nodes(data=True)]
    for k in knobs:
        n = sum(1 for a in nodes if _matches(k, a))
        if n == 0:
            names = sorted({a.get("name", "") for a in nodes if not _fixed(a)})
            if k.key.startswith("name~"):
                pat = k.key[5:]
                by_norm = {_norm(x): x for x in names}
                close = difflib.get_close_matches(pat, list(by_norm), n=5, cutoff=0.4)
                close = [by_norm[c] for c in close] or [x for x in names if pat[:4] and pat[:4] in _norm(x)][:5]
                hint = ", ".join(repr(c[:60]) for c in close) or "none close"
                raise MeshplanError(f"what-if {k.text!r}: matches no op of the run; closest op names: {hint}")
            kinds = sorted({a["kind"] for a in nodes if not _fixed(a)})
            where = f" on rank(s) {sorted(k.ranks)[:8]}" if k.ranks is not None else ""
            raise MeshplanError(f"what-if {k.text!r}: matches no op of the run{where} (op kinds present: "
                                f"{', '.join(kinds) or 'none'}; ranks {sorted({a['rank'] for a in nodes})[:8]})")
        counts[k.text] = n
    return counts


def fit_alpha_beta(G: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Least-squares ``t = alpha + beta * bytes`` per collective type over the graph's matched collectives.

    Returns:
        coll_type -> (alpha_s, beta_s_per_byte); alpha clipped to [0, smallest observed time].
    """
    data: dict[str, list[tuple[float, float]]] = {}
    for _, a in G.nodes(data=True):
        if a["kind"] == "comm" and a.get("bytes", 0) > 0 and not a.get("partial"):
            data.setdefault(a.get("coll_type") or "collective", []).append((a["bytes"], a["duration_s"]))
    out: dict[str, tuple[float, float]] = {}
    for typ, pts in data.items():
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        tmin = min(ys)
        if len(set(xs)) >= 2:
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            beta = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
            alpha = min(max(0.0, my - beta * mx), tmin)
        else:
            alpha = min(DEFAULT_ALPHA_S, tmin)
            beta = max(0.0, (statistics.fmean(ys) - alpha) / xs[0])
        out[typ] = (alpha, beta)
    return out


def _alpha_for(node: dict, fits: dict[str, tuple[float, float]]) -> float:
    a, _ = fits.get(node.get("coll_type") or "collective", (DEFAULT_ALPHA_S, 0.0))
    return min(a, node["duration_s"])


def apply_whatif(G: nx.DiGraph, knobs: list[Knob]) -> nx.DiGraph:
    """A modified copy of ``G`` with every knob applied in order (``G`` is left unchanged)."""
    H = G.copy()
    fits = fit_alpha_beta(G)
    for k in knobs:
        sel = (lambda a: True) if k.ranks is None else (lambda a, rs=k.ranks: a["rank"] in rs)
        if k.key in KIND_KEYS or k.key.startswith("name~"):
            for _, a in H.nodes(data=True):
                if _matches(k, a):
                    a["duration_s"] *= k.value
        elif k.key == "bandwidth":
            for _, a in H.nodes(data=True):
                if sel(a) and a["kind"] == "comm":
                    alpha = _alpha_for(a, fits)
                    a["duration_s"] = alpha + (a["duration_s"] - alpha) / k.value
        elif k.key == "stragglers":
            _remove_stragglers(H, k.ranks)
        elif k.key == "bucket":
            from meshplan.profiler.fusion import rebucket_allreduces

            H = rebucket_allreduces(H, k.value, fits)
    return H


def _remove_stragglers(H: nx.DiGraph, ranks: frozenset[int] | None) -> None:
    peers: dict[tuple, list[int]] = {}
    for n, a in H.nodes(data=True):
        p = a.get("peer")
        if p is not None:
            peers.setdefault((a.get("step", 0), a["kind"], tuple(p) if isinstance(p, list) else p), []).append(n)
    for nodes in peers.values():
        if len(nodes) < 2:
            continue
        med = statistics.median(H.nodes[n]["duration_s"] for n in nodes)
        rel = statistics.median(H.nodes[n].get("release_s", 0.0) for n in nodes)
        for n in nodes:
            a = H.nodes[n]
            if ranks is None or a["rank"] in ranks:
                a["duration_s"] = med
                if a.get("release_s"):
                    a["release_s"] = rel
