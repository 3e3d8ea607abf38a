"""Measured price of one operator on this host's CPU, forward and backward, at its exact shape (``local:N``).

On a CPU rank of a small model the roofline is a poor guide: a 1024 x 128 x 128 GEMM runs far below the
large-GEMM rate measured by the calibration, and every eager op pays the dispatcher and autograd overhead
(tens of microseconds) that dwarfs its arithmetic. Rather than model both, the CPU path of the estimator
measures each ``OpSpec`` of the plan at its exact shape, once, on one thread (``torchrun`` gives every rank
``OMP_NUM_THREADS=1``), with autograd on as in training:

* ``fwd_s``: the op's forward with inputs that require grad (autograd records the graph, as in training);
* ``bwd_s``: forward + ``backward()`` minus ``fwd_s``.

In a real step an op's inputs were written by other ops long before (weights, saved activations), so they
come from memory, not from the caches. Timing one op in a loop on the same tensors would price it cache-hot,
which underprices small GEMMs about 3x here (traced ``aten::mm`` of a 2-rank run vs such a loop). So each
repetition uses the next of several input sets whose total size is twice the last-level cache
(``COLD_FACTOR``; the calibration's ``l2_bytes`` is the largest cache level): every repetition starts cold.
The fastest repetition is kept: on a shared host an op of a millisecond either runs undisturbed or loses a
whole scheduler slice to another process, so the median of short ops is their free-core time while the
median of long ops already holds other people's load (measured here: a 512x128x128 linear, median 0.17 ms,
mean 0.48 ms). The minimum prices every op at the free-core speed alike; what the host's load adds to a real
run is measured separately from the run's own traces (``verify.contention``). A :class:`HostBench` keeps the
results as JSON beside the host calibration (the folder it was read from), keyed by the host fingerprint, so a
plan search measures each distinct shape once per host; the CPU estimator owns one.

A decoder layer's recompute modes are the exception to timing each shape alone: recomputation only adds work, but two
blocks timed minutes apart meet different loads, so all modes of a layer shape are timed together, in interleaved
rounds, and priced as the plain block plus what the pairing says checkpointing adds, never less than the re-run
forward (:func:`paired_layer_s`).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from meshplan.core.atomic import write_atomic
from meshplan.costmodel.ops import OpSpec

CACHE_VERSION = 5  # 5: a layer's recompute modes measured together (paired_layer_s)
MIN_REPS = 8  # at least this many repetitions: the fastest of 8 is rarely preempted on a shared 2-core host
MAX_REPS = 40
TARGET_S = 0.25  # wall time spent per op shape (forward and backward each), seconds
COLD_FACTOR = 2.0  # input sets span this many times the last-level cache
MAX_SETS = 64
DEFAULT_LLC_BYTES = 32 * 2**20  # when the calibration records no last-level cache


def _key(op: OpSpec) -> str:
    return f"{op.kind}|{'x'.join(map(str, op.shape))}|{op.dtype}|{int(op.causal)}"


def _tdtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(name, torch.float32)


def _builder(op: OpSpec) -> Callable[[], tuple[Callable, tuple]]:
    """A function making (forward closure, leaf tensors) for ``op``."""
    import torch
    import torch.nn.functional as F

    dt = _tdtype(op.dtype)
    s = op.shape

    def leaf(*shape):
        return torch.randn(*shape, dtype=dt).requires_grad_(True)

    if op.kind == "matmul":  # C[m,n] = A[m,k] @ B[k,n]; nn.Linear stores B transposed
        m, n, k = s
        return lambda: ((lambda x, w: F.linear(x, w)), (leaf(m, k), leaf(n, k)))
    if op.kind == "bmm":
        b, m, n, k = s
        return lambda: (torch.bmm, (leaf(b, m, k), leaf(b, k, n)))
    if op.kind == "attention":
        b, h, sq, skv, d = s
        return lambda: ((lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=op.causal and sq == skv)),
                        (leaf(b, h, sq, d), leaf(b, h, skv, d), leaf(b, h, skv, d)))
    if op.kind in ("layernorm", "rmsnorm"):
        rows, cols = s
        if op.kind == "layernorm":
            return lambda: ((lambda x, w, bb: F.layer_norm(x, (cols,), w, bb)), (leaf(rows, cols), leaf(cols),
                                                                                 leaf(cols)))
        return lambda: ((lambda x, w: F.rms_norm(x, (cols,), w)), (leaf(rows, cols), leaf(cols)))
    if op.kind == "softmax":
        rows, cols = s
        return lambda: ((lambda x: torch.softmax(x, -1)), (leaf(rows, cols),))
    if op.kind == "activation":
        return lambda: ((lambda x: F.gelu(x, approximate="tanh")), (leaf(s[0]),))
    if op.kind == "embedding":
        tokens, hidden = s
        return lambda: ((lambda w: F.embedding(torch.randint(0, tokens, (tokens,)), w)), (leaf(tokens, hidden),))
    # elementwise, copy, cast: a binary op on the whole tensor (residual add, dropout mask product)
    return lambda: ((lambda x, y: x + y), (leaf(s[0]), leaf(s[0])))


def _time(fn: Callable[[int], object], n_sets: int) -> float:
    """Fastest time of ``fn(i)`` over repetitions cycling through ``n_sets`` input sets (after a warm-up pass)."""
    for i in range(n_sets):
        fn(i)  # warm-up: allocate, pick kernels, fault in every set's pages
    times: list[float] = []
    t_end = time.perf_counter() + TARGET_S
    i = 0
    while len(times) < MIN_REPS or (time.perf_counter() < t_end and len(times) < MAX_REPS):
        t0 = time.perf_counter()
        fn(i % n_sets)
        times.append(time.perf_counter() - t0)
        i += 1
    return min(times)


@contextmanager
def _one_thread():
    """torch on one thread inside the block (what each torchrun rank gets), the caller's count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure(op: OpSpec, llc_bytes: int = DEFAULT_LLC_BYTES) -> tuple[float, float]:
    """Measure ``op`` now, cache-cold (input sets spanning ``COLD_FACTOR`` x ``llc_bytes``): (forward s, backward s)
    on one thread."""
    import math

    import torch

    with _one_thread():
        make = _builder(op)
        fwd_fn, leaves0 = make()
        out = fwd_fn(*leaves0)
        set_bytes = sum(t.numel() * t.element_size() for t in leaves0) + 2 * out.numel() * out.element_size()
        n_sets = max(1, min(MAX_SETS, math.ceil(COLD_FACTOR * llc_bytes / max(1, set_bytes))))
        sets = [leaves0] + [make()[1] for _ in range(n_sets - 1)]
        grad = torch.ones_like(out)

        def fwd(i):
            return fwd_fn(*sets[i])

        def both(i):
            fwd_fn(*sets[i]).backward(grad)
            for t in sets[i]:
                t.grad = None

        f = _time(fwd, n_sets)
        fb = _time(both, n_sets)
    return f, max(0.0, fb - f)


def _block(model, tp: int, recompute: str, dtype):
    """A decoder block with this model's shape, its TP shard on one rank (heads / tp, ffn / tp)."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    h, hd = model.hidden_size, model.head_dim
    heads = max(1, model.num_heads // tp)
    kv_heads = max(1, model.num_kv_heads // tp)
    f = model.ffn_hidden_size // tp
    gated = model.gated_mlp
    Norm = (lambda: nn.LayerNorm(h)) if model.norm == "layernorm" else (lambda: nn.RMSNorm(h))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = hd
            self.n1, self.n2 = Norm(), Norm()
            self.q = nn.Linear(h, heads * hd, bias=model.qkv_bias or model.model_type == "gpt2")
            self.k = nn.Linear(h, kv_heads * hd, bias=model.qkv_bias or model.model_type == "gpt2")
            self.v = nn.Linear(h, kv_heads * hd, bias=model.qkv_bias or model.model_type == "gpt2")
            self.o = nn.Linear(heads * hd, h, bias=model.o_bias or model.model_type == "gpt2")
            bias = model.mlp_bias or model.model_type == "gpt2"
            self.up = nn.Linear(h, (2 if gated else 1) * f, bias=bias)
            self.down = nn.Linear(f, h, bias=bias)

        def attn(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)

        def body(self, x):
            b, s, _ = x.shape
            y = self.n1(x)
            q = self.q(y).view(b, s, heads, hd).transpose(1, 2)
            k = self.k(y).view(b, s, kv_heads, hd).transpose(1, 2)
            v = self.v(y).view(b, s, kv_heads, hd).transpose(1, 2)
            a = checkpoint(self.attn, q, k, v, use_reentrant=False) if recompute == "selective" else self.attn(q, k, v)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
            u = self.up(self.n2(x))
            if gated:
                g, u = u.chunk(2, dim=-1)
                u = F.silu(g) * u
            else:
                u = F.gelu(u, approximate="tanh")
            return x + self.down(u)

        def forward(self, x):
            return checkpoint(self.body, x, use_reentrant=False) if recompute == "full" else self.body(x)

    return Block().to(dtype)


RECOMPUTE_MODES = ("none", "selective", "full")  # what _block applies; each re-runs a part of the forward


def _rerun_forward(blk, recompute: str, x):
    """The part of ``blk``'s forward that ``recompute`` runs a second time in backward, as a closure of no
    arguments (autograd on, as the recomputation records its graph): the whole body for ``full``, the attention
    core for ``selective``."""
    import torch

    if recompute == "full":
        return lambda: blk.body(x)
    b, s, _ = x.shape
    with torch.no_grad():
        y = blk.n1(x)
        q, k, v = (lin(y).view(b, s, -1, blk.head_dim).transpose(1, 2) for lin in (blk.q, blk.k, blk.v))
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    return lambda: blk.attn(q, k, v)


def paired_layer_s(model, tp: int, micro_batch: int, seq_len: int, dtype_name: str) -> dict[str, float]:
    """One decoder layer's forward + backward for every recompute mode, seconds, measured together.

    Timed apart (minutes apart, as a plan search reaches each shape) the modes meet different loads on a shared
    host, and a checkpointed block could price faster than the plain one (measured here under load: recompute
    none -> full credited with 122 ms of a 200 ms predicted gain). So the blocks, with the same weights and
    input, run in rounds, each round every mode once in a rotated order, and each mode's price is

        price(none) + max(fastest re-run forward, median over rounds of (mode - none) in the same round)

    with price(none) the fastest plain round, as every op of the host bench: the paired median is what the
    checkpointing adds under the conditions both saw, and it is floored by the work recomputation repeats (the
    re-run forward, timed in the same rounds; its fastest repetition is a free-core time). No mode prices below
    ``none`` by construction, whatever the load.
    """
    import statistics

    import torch

    dt = _tdtype(dtype_name)
    blocks = {m: _block(model, tp, m, dt) for m in RECOMPUTE_MODES}
    for m in RECOMPUTE_MODES[1:]:
        blocks[m].load_state_dict(blocks["none"].state_dict())
    x = torch.randn(micro_batch, seq_len, model.hidden_size, dtype=dt, requires_grad=True)
    grad = torch.ones_like(x)
    reruns = {m: _rerun_forward(blocks["none"], m, x) for m in RECOMPUTE_MODES[1:]}

    def step(blk):
        blk(x).backward(grad)
        x.grad = None
        blk.zero_grad(set_to_none=True)

    jobs = [(m, lambda m=m: step(blocks[m])) for m in RECOMPUTE_MODES]
    jobs += [(f"rerun {m}", f) for m, f in reruns.items()]
    for _, fn in jobs:
        fn()  # warm-up: allocate, pick kernels
    times: dict[str, list[float]] = {name: [] for name, _ in jobs}
    t_end = time.perf_counter() + TARGET_S * len(RECOMPUTE_MODES)
    r = 0
    while r < MIN_REPS or (time.perf_counter() < t_end and r < MAX_REPS):
        for name, fn in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:  # rotated: no mode always runs first
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        r += 1
    base = min(times["none"])
    out = {"none": base}
    for m in RECOMPUTE_MODES[1:]:
        paired = statistics.median(a - b for a, b in zip(times[m], times["none"]))
        out[m] = base + max(min(times[f"rerun {m}"]), paired)
    return out


class HostBench:
    """The measured per-op prices of this host, read from and written to ``cache_file`` (JSON).

    Args:
        cache_file: Where the measurements are kept (beside the host calibration: ``cpu-ops.json``).
        fingerprint: The host's fingerprint (``planner.host.calibrate.host_fingerprint``): a cache of another host,
            CPU count or torch is not used.
        llc_bytes: The host's last-level cache (the calibration's ``l2_bytes``), for cache-cold input sets.
    """

    def __init__(self, cache_file: Path, fingerprint: dict, llc_bytes: int = DEFAULT_LLC_BYTES):
        self.cache_file = Path(cache_file)
        self.fingerprint = fingerprint
        self.llc_bytes = int(llc_bytes) or DEFAULT_LLC_BYTES
        self._mem: dict[str, tuple[float, float]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, tuple[float, float]]:
        if self._mem is None:
            self._mem = {}
            try:
                rec = json.loads(self.cache_file.read_text(encoding="utf-8"))
                if rec.get("version") == CACHE_VERSION and rec.get("fingerprint") == self.fingerprint:
                    self._mem = {k: (float(v[0]), float(v[1])) for k, v in rec.get("ops", {}).items()}
            except (OSError, ValueError, TypeError, KeyError, IndexError):
                self._mem = {}
        return self._mem

    def flush(self) -> None:
        """Write newly measured shapes to the cache (atomically)."""
        if self._dirty and self._mem is not None:
            write_atomic(self.cache_file, json.dumps({"version": CACHE_VERSION, "fingerprint": self.fingerprint,
                                                      "ops": self._mem}, indent=0, sort_keys=True) + "\n")
            self._dirty = False

    def _cached_s(self, key: str, measure_s: Callable[[], float]) -> float:
        """``measure_s()`` on one thread, measured once per ``key`` and kept in the host cache, seconds."""
        cache = self._load()
        if key not in cache:
            with _one_thread():
                cache[key] = (measure_s(), 0.0)
            self._dirty = True
        return cache[key][0]

    def op_times_s(self, op: OpSpec) -> tuple[float, float]:
        """(forward s, backward s) of ``op`` on this host; measured once per shape, then cached."""
        cache = self._load()
        k = _key(op)
        if k not in cache:
            cache[k] = measure(op, self.llc_bytes)
            self._dirty = True
        return cache[k]

    def measure_optimizer_s(self, shapes: list[tuple[int, ...]]) -> float:
        """One ``torch.optim.AdamW`` step over parameters of these shapes, one thread, seconds (cached).

        The per-tensor overhead (PyTorch's CPU AdamW loops over tensors) dominates for small models, so the
        step is measured on the real list of parameter shapes rather than priced from the element count.
        """
        import torch

        def run() -> float:
            params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.AdamW(params, lr=1e-3)
            return _time(lambda _i: opt.step(), 1)

        return self._cached_s("adamw|" + ";".join("x".join(map(str, s)) for s in sorted(shapes)), run)

    def layer_times_s(self, model, tp: int, micro_batch: int, seq_len: int, recompute: str,
                      dtype_name: str) -> float:
        """One decoder layer, forward + backward (+ recompute), one micro-batch, one thread, seconds (cached).

        The whole block is timed, not its operators one by one: in a block each op's inputs are the previous op's
        fresh outputs and the glue (views, transposes, bias adds, ``AccumulateGrad``) runs between them; the sum of
        isolated operator timings comes out about a third below a measured GPT block here. Every recompute mode of
        a shape is measured in one paired session (:func:`paired_layer_s`), so no mode prices below ``none``.
        """
        key = (f"layer|{model.hidden_size}|{model.num_heads}|{model.num_kv_heads}|{model.head_dim}|"
               f"{model.ffn_hidden_size}|{int(model.gated_mlp)}|{model.norm}|{model.model_type}|{tp}|{micro_batch}|"
               f"{seq_len}|{{}}|{dtype_name}")
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute {recompute!r}: the host bench times {', '.join(RECOMPUTE_MODES)}")
        cache = self._load()
        if key.format(recompute) not in cache:
            with _one_thread():
                priced = paired_layer_s(model, tp, micro_batch, seq_len, dtype_name)
            cache.update({key.format(mode): (t, 0.0) for mode, t in priced.items()})
            self._dirty = True
        return cache[key.format(recompute)][0]

    def head_times_s(self, vocab_shard: int, hidden: int, tokens: int, dtype_name: str) -> float:
        """Final norm + LM head + cross-entropy, forward + backward, one micro-batch, one thread, seconds (cached)."""
        import torch
        import torch.nn.functional as F

        def run() -> float:
            dt = _tdtype(dtype_name)
            x = torch.randn(tokens, hidden, dtype=dt, requires_grad=True)
            w = torch.randn(vocab_shard, hidden, dtype=dt, requires_grad=True)
            nw = torch.ones(hidden, dtype=dt, requires_grad=True)
            nb = torch.zeros(hidden, dtype=dt, requires_grad=True)
            y = torch.randint(0, vocab_shard, (tokens,))

            def step(_i):
                logits = F.linear(F.layer_norm(x, (hidden,), nw, nb), w)
                F.cross_entropy(logits.float(), y).backward()
                for t in (x, w, nw, nb):
                    t.grad = None

            return _time(step, 1)

        return self._cached_s(f"head|{vocab_shard}|{hidden}|{tokens}|{dtype_name}", run)
