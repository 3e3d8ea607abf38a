"""Time mamba_ssm's Mamba-2 SSD scan, forward and backward, at the Mamba mixers of the dev set's hybrid models on one
GPU, and keep the figures.

Section ``ssd``: ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=128, D, z, dt_bias, dt_softplus=True)``, the
scan Megatron-Core's ``MambaMixer`` trains through (its memory-efficient path, ``mamba_split_conv1d_scan_combined``,
runs the same forward and backward after the causal convolution), at the mixers of Nemotron 3 Nano and Super at TP 1
and TP 2, micro-batch 1-4 x 4,096 tokens and one sequence of 8,192 / 16,384: forward, forward + backward (the input
gradients, as autograd asks for them in training) and the profiler's device time per kernel of each. The cost model
prices the backward from its kernels' bytes and FLOPs with no timing to check it against (``costmodel.api.SSD_SOURCE``,
``costmodel.ops.ssd_bwd_bytes_per_token``); this run is that timing. Before the cases, a check at a tiny shape:
mamba_ssm's output and input gradient against this file's ``ssd_reference``, the recurrence itself.

mamba_ssm's package ``__init__`` loads its compiled CUDA extension; the scan needs only its Triton kernels, so they are
imported from the source distribution without it (``load_scan``), with einops and packaging (its imports) from wheels
where the machine lacks them. Fetch them once into the ignored ``.gpu_deps/`` folder and carry it to the GPU machine:

    MAMBA_SKIP_CUDA_BUILD=TRUE pip download mamba-ssm==2.3.2.post1 einops packaging --no-deps \\
        --no-binary mamba-ssm --no-build-isolation -d .gpu_deps
    PYTHONUNBUFFERED=1 python3 bench/gpu_ssd.py --out nvidia-h200-ssd.json          # carry: .gpu_deps
    python bench/gpu_ssd.py --quick --out /tmp/s.json     # tiny shapes on CPU (ssd_reference timed): the code paths
    python bench/gpu_ssd.py --tables nvidia-h200-ssd.json                            # a kept run, as a table

Standalone (torch and the standard library, plus bench/gpu_kernels.py and bench/gpu_rope.py beside it): the GPU
machine has no meshplan.
"""
from __future__ import annotations

import json
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_kernels import attempt, empty_cache, parse_one_file_args, run_or_tables, run_sections
from gpu_rope import kernels_us

# (heads, head dim, state, groups) of each Mamba mixer at TP 1: the HF configs in data/published_runs/configs
# (nemotron-3-nano-30b-a3b.json, nemotron-3-super-120b-a12b.json: mamba_num_heads, mamba_head_dim, ssm_state_size,
# n_groups). TP splits heads and groups alike (Megatron-Core MambaMixer: nheads_local, ngroups_local).
MIXERS = {"nemotron3-nano": (64, 64, 128, 8), "nemotron3-super": (128, 64, 128, 8), "tiny": (4, 16, 16, 2)}
# chunk_size: Megatron-Core MambaMixer's default, 128 (the HF configs carry none); (mixer, tp, micro-batch, tokens),
# the dev set's micro-batches first (AutoModel: Nano 4, Super 2; Megatron-Bridge: 1, Super at TP 2 on GB200)
FULL_PLAN = {"chunk": 128, "check": ("tiny", 1, 1, 256, 64),
             "cases": [("nemotron3-nano", 1, 4, 4096), ("nemotron3-super", 1, 2, 4096), ("nemotron3-super", 1, 1, 4096),
                       ("nemotron3-super", 2, 1, 4096), ("nemotron3-nano", 1, 1, 4096), ("nemotron3-nano", 1, 2, 4096),
                       ("nemotron3-nano", 2, 1, 4096), ("nemotron3-super", 1, 1, 8192),
                       ("nemotron3-super", 1, 1, 16384), ("nemotron3-nano", 1, 1, 16384)]}
QUICK_PLAN = {"chunk": 8, "check": ("tiny", 1, 1, 16, 8), "cases": [("tiny", 1, 2, 16), ("tiny", 2, 1, 16)]}
SECTION_BUDGET_S = {"ssd": 270}


def ssd_reference(x, dt, A, B, C, D=None, z=None, dt_bias=None, chunk: int = 0):
    """The selective state-space recurrence the chunked SSD computes (Dao & Gu 2024, arXiv:2405.21060, eq. 1 with A a
    scalar times the identity per head), one token at a time in fp32: dt = softplus(dt + dt_bias);
    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T (state: head dim x state), y_t = h_t C_t + D x_t, times silu(z) when
    z is given; the heads of a group share its B and C. x, z: (b, L, H, P); dt: (b, L, H); B, C: (b, L, G, N).
    ``chunk`` is the scan's and changes nothing here."""
    b, length, heads, p = x.shape
    rep = heads // B.shape[2]
    dt = F.softplus(dt.float() + (0.0 if dt_bias is None else dt_bias.float()))
    bh = B.float().repeat_interleave(rep, dim=2)
    ch = C.float().repeat_interleave(rep, dim=2)
    state = x.new_zeros(b, heads, p, B.shape[3], dtype=torch.float32)
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A.float())[..., None, None]
        state = state * decay + (dt[:, t, :, None] * x[:, t].float())[..., None] * bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, ch[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + D.float()[:, None] * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)


def load_scan(deps: Path):
    """mamba_ssm's ``mamba_chunk_scan_combined`` and its version, from the ``mamba_ssm-*.tar.gz`` (or its unpacked
    folder) in ``deps``, without running the package ``__init__`` (it imports the compiled ``selective_scan_cuda``):
    ``mamba_ssm`` is registered as a bare package over the source's folder, so only the Triton ops and utils load.
    The wheels in ``deps`` go at the end of ``sys.path``: used only where the machine lacks the package."""
    for wheel in sorted(deps.glob("*.whl")):
        sys.path.append(str(wheel))
    found = sorted(p for p in deps.glob("mamba_ssm-*") if p.is_dir() or p.name.endswith(".tar.gz"))
    if not found:
        raise FileNotFoundError(f"{deps}: no mamba_ssm-*.tar.gz (see this script's docstring for the download)")
    src = found[-1]
    name = src.name.removesuffix(".tar.gz")
    if not src.is_dir():
        dest = Path(tempfile.mkdtemp(prefix="mamba_ssm_src."))
        with tarfile.open(src) as tar:
            try:
                tar.extractall(dest, filter="data")
            except TypeError:  # a Python before 3.11.4 has no extraction filters
                tar.extractall(dest)
        src = dest / name
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [str(src / "mamba_ssm")]
    sys.modules["mamba_ssm"] = pkg
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    def scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, chunk: int = 128):
        return mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    return scan, name.removeprefix("mamba_ssm-")


def shape_of(mixer: str, tp: int) -> tuple[int, int, int, int]:
    """(heads, head dim, state, groups) a rank holds at tensor parallelism ``tp``."""
    heads, p, n, groups = MIXERS[mixer]
    return heads // tp, p, n, groups // tp


def inputs(batch: int, seq: int, heads: int, p: int, n: int, groups: int, device) -> dict:
    """The scan's arguments as Megatron-Core's MambaMixer hands them over: x, z, B, C and dt in bf16 (split from the
    input projection), A = -exp(A_log), D and dt_bias in fp32; every one a leaf that takes a gradient."""
    def leaf(*shape, dtype=torch.bfloat16, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=device) * scale + shift).to(dtype).requires_grad_()
    return {"x": leaf(batch, seq, heads, p), "dt": leaf(batch, seq, heads, scale=0.5, shift=-2.0),
            "A": (-torch.rand(heads, device=device) - 0.5).requires_grad_(),
            "B": leaf(batch, seq, groups, n), "C": leaf(batch, seq, groups, n),
            "D": leaf(heads, dtype=torch.float32), "z": leaf(batch, seq, heads, p),
            "dt_bias": leaf(heads, dtype=torch.float32, scale=0.1)}


def check(scan, plan: dict, device) -> dict:
    """The timed scan against ``ssd_reference`` at a tiny shape: the largest output and x-gradient differences, each
    over the reference's largest magnitude."""
    mixer, tp, batch, seq, chunk = plan["check"]
    args = inputs(batch, seq, *shape_of(mixer, tp), device)
    y = scan(**args, chunk=chunk)
    ref = ssd_reference(**args)
    dy = torch.randn_like(ref)
    (gx,) = torch.autograd.grad(y, args["x"], dy)
    (rx,) = torch.autograd.grad(ref, args["x"], dy)

    def rel(a, b):
        a, b = a.detach().float(), b.detach().float()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
    return {"shape": [batch, seq, *shape_of(mixer, tp)], "chunk": chunk, "output_rel_diff": rel(y, ref),
            "dx_rel_diff": rel(gx, rx)}


def case(clock, scan, spec, chunk: int, device) -> dict:
    """Forward and forward + backward of one mixer's scan: CUDA-event medians and the profiler's kernels."""
    mixer, tp, batch, seq = spec
    heads, p, n, groups = shape_of(mixer, tp)
    args = inputs(batch, seq, heads, p, n, groups, device)
    leaves = list(args.values())
    dy = torch.randn_like(args["x"])  # y has x's shape; no call here, so the first timed one autotunes

    def fwd():
        return scan(**args, chunk=chunk)

    def both():
        return torch.autograd.grad(fwd(), leaves, dy, allow_unused=True)
    rec = {"mixer": mixer, "tp": tp, "batch": batch, "seq_len": seq, "heads": heads, "head_dim": p, "state": n,
           "groups": groups, "chunk": chunk, "token_heads": batch * seq * heads,
           "fwd": clock.median_ms(fwd), "fwd_bwd": clock.median_ms(both)}
    rec["bwd_ms"] = rec["fwd_bwd"]["median_ms"] - rec["fwd"]["median_ms"]
    rec["fwd_kernels"] = attempt(lambda msg: None, "profile", lambda: kernels_us(fwd))
    rec["fwd_bwd_kernels"] = attempt(lambda msg: None, "profile", lambda: kernels_us(both))
    return rec


def ssd_section(clock, guard, plan, log) -> dict:
    if clock.cuda:
        scan, version = load_scan(Path(plan["deps"]))
        impl = f"mamba_ssm {version} mamba_chunk_scan_combined (Triton)"
        checked = attempt(log, "check", lambda: check(scan, plan, clock.device))
        log(f"check against the recurrence: {checked}")
    else:
        scan, impl = ssd_reference, "ssd_reference (this file, CPU): no GPU, the code paths only"
        checked = {"skipped": "no GPU: the reference is the scan timed"}
    records = []
    for spec in plan["cases"]:
        if not guard.left():
            break
        rec = attempt(log, f"{spec}", lambda: case(clock, scan, spec, plan["chunk"], clock.device))
        records.append({"case": list(spec), **rec})
        if "fwd" in rec:
            log(f"{spec}: fwd {rec['fwd']['median_ms']:.3f} ms, bwd {rec['bwd_ms']:.3f} ms")
        empty_cache()
    return {"impl": impl, "check": checked, "records": records}


SECTIONS = {"ssd": ssd_section}


def conventions() -> dict:
    return {"timing": "CUDA events around one call, 256 MiB written before each call to flush L2; the first call "
                      "autotunes (first_call_ms), then one warm-up and the median of up to 10 repeats; kernels: the "
                      "profiler's self device time per call, 3 calls; clocks not locked",
            "bwd_ms": "median forward + backward less median forward: the backward autograd runs for the scan's "
                      "eight inputs (x, dt, A, B, C, D, z, dt_bias)",
            "token_heads": "micro-batch x tokens x heads a rank holds"}


def run(args, log) -> dict:
    plan = dict(QUICK_PLAN if args.quick else FULL_PLAN, deps=args.deps)
    return run_sections("meshplan.gpu_ssd/1", SECTIONS, SECTION_BUDGET_S, plan, conventions(), args, log)


def parse(argv):
    def deps(ap):
        ap.add_argument("--deps", default=".gpu_deps",
                        help="folder holding mamba_ssm-*.tar.gz and the wheels it imports")
    return parse_one_file_args(__doc__, SECTIONS, 300.0, argv, extra=deps)


def tables(path: str) -> list[str]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    sec = data["sections"]["ssd"]
    lines = [f"{data['environment'].get('device_name', data['environment']['device_type'])}, "
             f"torch {data['environment']['torch']}: {sec.get('impl', '?')}", f"check: {sec.get('check')}",
             f"{'mixer':16s} {'tp':>2s} {'b x L':>10s} {'heads':>5s} {'fwd ms':>8s} {'bwd ms':>8s} {'bwd/fwd':>7s} "
             f"{'fwd kern':>8s} {'all kern':>8s}"]
    for r in sec["records"]:
        if "fwd" not in r:
            lines.append(f"{r['case']}: {r.get('error')}")
            continue
        kern = [(r.get(k) or {}).get("total_us", float("nan")) / 1e3 for k in ("fwd_kernels", "fwd_bwd_kernels")]
        fwd = r["fwd"]["median_ms"]
        lines.append(f"{r['mixer']:16s} {r['tp']:2d} {r['batch']:>3d} x {r['seq_len']:<5d} {r['heads']:5d} "
                     f"{fwd:8.3f} {r['bwd_ms']:8.3f} {r['bwd_ms'] / fwd:7.2f} {kern[0]:8.3f} {kern[1]:8.3f}")
    lines.append("kern: the profiler's device time per call, ms (forward; forward + backward)")
    return lines


def main(argv=None) -> int:
    return run_or_tables(parse(argv), run, tables)


if __name__ == "__main__":
    sys.exit(main())
