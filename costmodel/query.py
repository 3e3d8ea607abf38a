"""``meshplan costmodel predict`` as one library call: the price of one operator or collective, and why."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.core.units import canonical_dtype
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import resolve
from meshplan.costmodel.features import GEMM_KINDS
from meshplan.costmodel.ops import COLLECTIVE_KINDS, DTYPE_BYTES, OP_KINDS, OpSpec
from meshplan.costmodel.roofline import roofline_predict

SHAPE_DIMS = {"matmul": 3, "bmm": 4, "attention": 5, "layernorm": 2, "rmsnorm": 2, "softmax": 2, "embedding": 2}
# sizes per op class (``costmodel.ops.OpSpec``): m x n x k; b x m x n x k; b x heads x s_q x s_kv x d; rows x cols;
# every other class (element-wise, collectives: the payload in bytes) one number


def parse_shape(text: str, op: str) -> tuple[int, ...]:
    """``8192x8192x8192`` -> ``(8192, 8192, 8192)``, checked against what ``op`` takes.

    Raises:
        MeshplanError: not integers, not positive, or the wrong count for the op class.
    """
    try:
        dims = tuple(int(x) for x in text.lower().replace("*", "x").split("x"))
    except ValueError:
        raise MeshplanError(f"--shape {text}: expected integers separated by 'x' (e.g. 8192x8192x8192)") from None
    if not dims or min(dims) <= 0:
        raise MeshplanError(f"--shape {text}: sizes must be positive")
    need = SHAPE_DIMS.get(op, 1)
    if len(dims) != need:
        raise MeshplanError(f"--shape {text}: {op} takes {need} sizes, got {len(dims)}")
    return dims


def predict_query(op: str, shape: str, device: str, dtype: str = "bf16", model: Optional[Path] = None,
                  group_size: int = 8, link: str = "", backward: bool = False) -> dict:
    """Predicted latency of one op on one device (learned, or roofline when outside the trained range).

    Returns:
        ``{"op", "shape", "dtype", "device", "latency_s", "source", "flops", "bytes", "ideal_roofline_s"}``.

    Raises:
        MeshplanError: unknown op class or device, a bad shape, a corrupt model, a collective without a fitted
            collective model.
    """
    if op not in OP_KINDS:
        raise MeshplanError(f"--op {op}: unknown op class (known: {', '.join(OP_KINDS)})")
    dtype = canonical_dtype(dtype)
    if dtype not in DTYPE_BYTES:  # an unknown dtype was priced as bf16 before: a figure for a dtype nobody asked
        raise MeshplanError(f"--dtype {dtype}: unknown dtype (known: {', '.join(DTYPE_BYTES)}, or a PyTorch name "
                            "such as bfloat16)")
    if group_size < 1:
        raise MeshplanError(f"--group-size {group_size}: a collective needs at least 1 participant")
    dims = parse_shape(shape, op)
    pricer = Pricer.from_dir(model)
    measured = pricer.model.measured_devices.values() if pricer.model is not None else ()
    dev = resolve(device, extra=measured)  # a CPU the model was trained on (``collect``) is known by its model
    if op in GEMM_KINDS:  # tensor-core math in a dtype the device lacks (nvfp4 on an H100) has no price to give
        dev.peak(dtype)
    spec = OpSpec(op, dims, dtype, group_size=group_size if op in COLLECTIVE_KINDS else 1, backward=backward)
    if op in COLLECTIVE_KINDS:
        from meshplan.costmodel.collective_model import predict_collective

        cm = pricer.collective_model()
        if cm is None:
            raise MeshplanError("the model has no fitted collective model; train one with Vidur network data")
        lk = cm.link(link or ("h100_dgx/intra" if "H100" in dev.name else "a100_dgx/intra"))
        sec = predict_collective(op, float(dims[0]), group_size, lk, nodes=2 if lk.name.endswith("inter") else 1,
                                 model=cm)
        src, roof = f"learned ({lk.name})", None
    else:
        if pricer.model is None:
            sec, src = roofline_predict(spec, dev), "roofline (no learned model)"
        else:
            s, srcs = pricer.model.predict_ops([spec], dev)
            sec, src = float(s[0]), str(srcs[0])
        from meshplan.costmodel.learned import ideal_roofline_s

        roof = ideal_roofline_s(spec, dev)
    return {"op": op, "shape": list(dims), "dtype": dtype, "device": dev.name, "latency_s": sec, "source": src,
            "flops": spec.flops, "bytes": spec.bytes, "ideal_roofline_s": roof}
