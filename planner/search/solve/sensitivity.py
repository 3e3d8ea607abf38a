"""Quality indicators for precision and gradient-compression choices.

Default (analytic) indicators — LLM-PQ's idea (Zhao et al. 2024, §4.3: a layer's indicator is the variance its
weight quantization injects, scaled per layer type): the relative mean-square error ``E[(q(w)-w)^2] / E[w^2]``
of round-to-nearest quantization of Gaussian-distributed weights, times a per-type factor.

- Integer, symmetric, ``b`` bits, one scale per group of ``n`` weights (max-abs scaling): step
  ``D = 2 max|w| / (2^b - 1)`` and noise variance ``D^2 / 12``; with ``E[max|w|] ~ sigma sqrt(2 ln 2n)`` for ``n``
  Gaussian weights, the relative MSE is ``2 ln(2n) / (3 (2^b - 1)^2)``. int8 uses per-channel scales
  (``n`` = fan-in, LLM.int8/SmoothQuant), int4 groups of 128 (GPTQ, Frantar et al. 2023; AWQ, Lin et al. 2024).
- Floating point with ``m`` mantissa bits: absolute rounding error uniform in half an ulp, mantissas
  log-distributed (Benford's law), so relative MSE ``ln 2 * 2^(-2m) / 18``: fp16 (m=10) 3.7e-8, bf16 (m=7)
  2.4e-6, fp8 e4m3 (m=3) 6.0e-4; fp32 is the reference (0).
- Training (QSync, Zhao et al. 2023): both GEMM operands are cast, so the indicator doubles.

The default per-type factors are 1.0 (no measured preference); :func:`measure_layer_sensitivity` measures real
indicators — QSync's gradient-variance idea: the relative error that quantizing one layer (weights and inputs)
causes in the full gradient of a real model — and :func:`measure_compression_error` measures the relative error
of each gradient compressor on real gradients. Both run on CPU in about a second with :func:`tiny_model`.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from meshplan.core.errors import MeshplanError

MANTISSA_BITS = {"fp32": 23, "tf32": 10, "fp16": 10, "bf16": 7, "fp8": 3}
INT_BITS = {"int8": 8, "int4": 4}
INT4_GROUP = 128
DEFAULT_TYPE_FACTORS = {"attention": 1.0, "mlp": 1.0}


def relative_mse(precision: str, fan_in: int = 4096, reference: str = "fp32") -> float:
    """Analytic relative mean-square error of casting Gaussian weights to ``precision`` (see module docstring).

    Args:
        precision: ``fp32``, ``bf16``, ``fp16``, ``fp8``, ``int8`` or ``int4``.
        fan_in: Weights sharing one int8 scale (per output channel); int4 uses groups of 128.
        reference: The precision counted as error-free (``fp32`` for training, ``fp16``/``bf16`` for serving).

    Raises:
        MeshplanError: an unknown precision name.
    """
    def mse(p: str) -> float:
        if p in MANTISSA_BITS:
            # absolute error uniform in +-ulp/2 (variance ulp^2/12), mantissas log-distributed (Benford):
            # E[x^2] = ulp^2 * 2^(2m) * 1.5/ln 2  ->  relative MSE = ln 2 * 2^(-2m) / 18
            return 0.0 if p == "fp32" else math.log(2) * 2.0 ** (-2 * MANTISSA_BITS[p]) / 18.0
        if p in INT_BITS:
            n = INT4_GROUP if p == "int4" else max(2, fan_in)
            return 2.0 * math.log(2 * n) / (3.0 * (2 ** INT_BITS[p] - 1) ** 2)
        raise MeshplanError(f"precision '{p}': unknown (known: {', '.join(list(MANTISSA_BITS) + list(INT_BITS))})")

    return max(0.0, mse(precision) - mse(reference))


def default_layer_indicators(matrices: Sequence[tuple[str, int, int]], precisions: Sequence[str],
                             reference: str, operands: int = 1,
                             type_factors: Optional[dict[str, float]] = None) -> list[float]:
    """One layer's indicator per precision: parameter-weighted relative MSE of its matrices x type factor.

    Args:
        matrices: ``(type, fan_in, params)`` of each weight matrix of the layer (type ``attention`` or ``mlp``).
        precisions: Columns to compute.
        reference: Error-free precision.
        operands: 1 for weight-only (serving), 2 when inputs are cast too (training GEMMs, QSync).
        type_factors: Per-type multipliers (default :data:`DEFAULT_TYPE_FACTORS`).
    """
    tf = type_factors or DEFAULT_TYPE_FACTORS
    total = sum(n for _, _, n in matrices) or 1
    return [operands * sum(tf.get(t, 1.0) * n * relative_mse(p, fan, reference) for t, fan, n in matrices) / total
            for p in precisions]


# ----------------------------------------------------------------------------------- measured (torch)

class _one_thread:
    """Run torch single-threaded inside the block: the tiny model's ops are too small to gain from threads, and
    intra-op threads only contend with other processes (restored on exit)."""

    def __enter__(self):
        import torch

        self.saved = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.saved)
        return False


def tiny_model(seed: int = 0, vocab: int = 256, hidden: int = 64, layers: int = 4, heads: int = 4):
    """A small decoder (embedding, pre-norm attention + MLP blocks, LM head) that trains on CPU in milliseconds."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, idx):
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(seed)
    return Tiny()


def fake_quantize(t, precision: str):
    """Round ``t`` to ``precision`` and back to fp32 (int: symmetric max-abs per row, int4 in groups of 128)."""
    import torch

    if precision == "fp32":
        return t
    if precision in ("fp16", "bf16"):
        return t.to(torch.float16 if precision == "fp16" else torch.bfloat16).float()
    if precision == "fp8":
        return t.to(torch.float8_e4m3fn).float()
    if precision in INT_BITS:
        qmax = 2 ** (INT_BITS[precision] - 1) - 1
        flat = t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.reshape(1, -1)
        if precision == "int4" and flat.shape[1] % INT4_GROUP == 0:
            flat = flat.reshape(-1, INT4_GROUP)
        scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / qmax
        return (torch.round(flat / scale).clamp(-qmax, qmax) * scale).reshape(t.shape)
    raise MeshplanError(f"precision '{precision}': cannot fake-quantize (known: fp32, fp16, bf16, fp8, int8, int4)")


def _batch(vocab: int, seed: int, batch: int = 8, seq: int = 32):
    import torch

    g = torch.Generator().manual_seed(seed)
    # a learnable stream: each token is the previous one plus a small random step (mod vocab)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    steps = torch.randint(0, 3, (batch, seq), generator=g)
    tokens = (start + steps.cumsum(1)) % vocab
    return tokens[:, :-1], tokens[:, 1:]


def measure_layer_sensitivity(precisions: Sequence[str], model=None, seed: int = 0,
                              warmup_steps: int = 20) -> list[list[float]]:
    """Per-block, per-precision relative gradient error of a real model (QSync's indicator, measured).

    The model is first trained ``warmup_steps`` Adam steps on a synthetic token stream so its gradients are
    those of a model in training, not at initialisation. Then for each block and precision, the block's
    Linear weights and inputs are fake-quantized and the full gradient compared with the fp32 one:
    ``||g_q - g||^2 / ||g||^2``.

    Returns:
        ``[block][precision]`` relative errors.
    """
    with _one_thread():
        return _measure_layer_sensitivity(precisions, model, seed, warmup_steps)


def _measure_layer_sensitivity(precisions, model, seed, warmup_steps):
    import torch

    model = model or tiny_model(seed)
    vocab = model.head.out_features
    x, y = _batch(vocab, seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    lossf = torch.nn.functional.cross_entropy
    for i in range(warmup_steps):
        opt.zero_grad()
        lossf(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()

    def grads() -> torch.Tensor:
        model.zero_grad()
        lossf(model(x).flatten(0, 1), y.flatten()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    ref = grads()
    denom = float(ref.pow(2).sum())
    out = []
    for blk in model.blocks:
        row = []
        linears = [m for m in blk.modules() if isinstance(m, torch.nn.Linear)]
        for prec in precisions:
            saved = [lin.weight.data.clone() for lin in linears]
            hooks = [lin.register_forward_pre_hook(lambda mod, inp, p=prec: (fake_quantize(inp[0], p),))
                     for lin in linears]
            for lin in linears:
                lin.weight.data = fake_quantize(lin.weight.data, prec)
            try:
                g = grads()
            finally:
                for h in hooks:
                    h.remove()
                for lin, w in zip(linears, saved):
                    lin.weight.data = w
            row.append(float((g - ref).pow(2).sum()) / denom)
        out.append(row)
    return out


def real_gradients(seed: int = 0, warmup_steps: int = 20):
    """Flattened real gradient of :func:`tiny_model` after ``warmup_steps`` Adam steps (a torch tensor)."""
    import torch

    model = tiny_model(seed)
    x, y = _batch(model.head.out_features, seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(warmup_steps + 1):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        if _ < warmup_steps:
            opt.step()
    return [p.grad.detach().clone() for p in model.parameters()]


def _compressors() -> dict[str, Callable]:
    import torch

    def topk(g, ratio):
        flat = g.flatten()
        k = max(1, int(round(ratio * flat.numel())))
        out = torch.zeros_like(flat)
        idx = flat.abs().topk(k).indices
        out[idx] = flat[idx]
        return out.view_as(g)

    def powersgd(g, rank):
        # one power iteration from a seeded random Q (Vogels et al. 2019, Alg. 1, without error feedback)
        if g.dim() < 2:
            return g
        mat = g.reshape(g.shape[0], -1)
        r = int(min(rank, *mat.shape))
        q = torch.randn(mat.shape[1], r, generator=torch.Generator().manual_seed(0))
        p, _ = torch.linalg.qr(mat @ q)
        return (p @ (mat.T @ p).T).view_as(g)

    return {
        "none": lambda g, _: g,
        "fp16": lambda g, _: fake_quantize(g, "fp16"),
        "bf16": lambda g, _: fake_quantize(g, "bf16"),
        "int8": lambda g, _: fake_quantize(g, "int8"),
        "topk": topk,
        "powersgd": powersgd,
    }


def measure_compression_error(methods: Sequence[tuple[str, float]], seed: int = 0) -> dict[tuple[str, float], float]:
    """Relative error ``||C(g) - g||^2 / ||g||^2`` of each compressor on the real gradients of :func:`tiny_model`.

    Args:
        methods: ``(method, param)`` pairs; param is the top-k ratio or the PowerSGD rank.
    """
    comp = _compressors()
    with _one_thread():
        gs = real_gradients(seed)
    out = {}
    for method, param in methods:
        if method not in comp:
            raise MeshplanError(f"compression method '{method}': unknown (known: {', '.join(comp)})")
        num = den = 0.0
        for g in gs:
            with _one_thread():
                c = comp[method](g.float(), param)
            num += float((c - g).pow(2).sum())
            den += float(g.pow(2).sum())
        out[(method, param)] = num / den if den else 0.0
    return out


# ----------------------------------------------------------------------------------- files

def write_sensitivity(path, precisions: Sequence[str], rows: Sequence[Sequence[float]], source: str = "") -> None:
    """Save indicators ``[layer][precision]`` as JSON (atomically), for ``meshplan profile --sensitivity``."""
    import json

    from meshplan.core.atomic import write_atomic

    write_atomic(path, json.dumps({"precisions": list(precisions), "layers": [list(map(float, r)) for r in rows],
                                   "source": source}, indent=1))


PROFILE_PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")  # the columns `profile --sensitivity` measures


def measure_sensitivity_file(out_dir, precisions: Sequence[str] = PROFILE_PRECISIONS):
    """``meshplan profile --sensitivity``: measure the indicators on the tiny model and write
    ``out_dir/sensitivity.json``. Returns ``(path, rows [block][precision])``."""
    from pathlib import Path

    rows = measure_layer_sensitivity(precisions)
    path = Path(out_dir) / "sensitivity.json"
    write_sensitivity(path, precisions, rows, source="meshplan profile --sensitivity (tiny GPT, real gradients)")
    return path, rows


def read_sensitivity(path, precisions: Sequence[str], num_layers: int) -> list[list[float]]:
    """Load indicators for the given precision columns, resampled to ``num_layers`` by relative depth.

    A file measured on a model with another layer count (e.g. :func:`tiny_model`) is mapped layer ``i`` ->
    file row ``floor(i * (rows - 1) / (num_layers - 1) + 0.5)`` (nearest relative depth).

    Raises:
        MeshplanError: missing/invalid file, or a requested precision the file lacks (names both).
    """
    import json
    from pathlib import Path

    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        cols, rows = list(data["precisions"]), data["layers"]
    except FileNotFoundError:
        raise MeshplanError(f"{p}: sensitivity file not found") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise MeshplanError(f"{p}: not a sensitivity file ({exc.__class__.__name__}: {exc})") from None
    if not rows or any(len(r) != len(cols) for r in rows):
        raise MeshplanError(f"{p}: expected rows of {len(cols)} numbers ({', '.join(cols)})")
    missing = [q for q in precisions if q not in cols]
    if missing:
        raise MeshplanError(f"{p}: no column for precision {', '.join(missing)} (has {', '.join(cols)})")
    idx = [cols.index(q) for q in precisions]
    n = len(rows)
    pick = [int(i * (n - 1) / max(1, num_layers - 1) + 0.5) for i in range(num_layers)]  # nearest, halves up
    return [[float(rows[j][k]) for k in idx] for j in pick]
