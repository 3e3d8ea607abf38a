"""Dataset loaders, units, features and the bad-input paths of the cost model (real public data, data/)."""
from __future__ import annotations

import numpy as np
import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets import load
from meshplan.costmodel.datasets.deepbench import load_gemm
from meshplan.costmodel.datasets.neusight import load_file
from meshplan.costmodel.features import flops_bytes
from meshplan.costmodel.ops import COMPUTE_KINDS, OpSpec
from tests.helpers import data_path, open_data


def test_neusight_rows_and_units_match_provenance():
    root = data_path("kernels", "neusight")
    t = load([root]).table
    # Golden counts from kernels/neusight/PROVENANCE.md: 158,441 kernel latencies in train + test.
    assert len(t) == 158_441
    assert (t.source == "neusight/test").sum() == 13_461 + 8_254 + 4_558 + 533 + 533
    # First data row of train/bmm/Tesla_T4.csv: Latency 0.035466667264699936 ms, B,M,N,K = 13,27,15,29 with N the
    # contraction dim -> meshplan bmm (b=13, m=27, n=29, k=15).
    one = load_file(root / "train" / "bmm" / "Tesla_T4.csv", "neusight/train")
    assert one.latency_s[0] == pytest.approx(0.035466667264699936e-3)
    assert (one.b[0], one.m[0], one.n[0], one.k[0]) == (13, 27, 29, 15)
    assert one.device[0] == "T4"
    assert one.flops[0] == 2 * 13 * 27 * 29 * 15


def test_vidur_and_deepbench_rows():
    t = load([data_path("kernels", "vidur"), data_path("kernels", "deepbench")]).table
    # Vidur PROVENANCE.md: 6,264 compute rows (9 of the 10 sub-ops loaded; RoPE left out) and 13,916 network rows.
    assert (np.char.startswith(t.source.astype(str), "vidur/") & ~np.isin(t.op, ("allreduce",
                                                                                 "sendrecv"))).sum() == 6264 * 9
    assert np.isin(t.op, ("allreduce", "sendrecv")).sum() - (t.source == "deepbench/allreduce").sum() == 13_916
    # DeepBench PROVENANCE.md: 160 GEMMs per device and precision: 8 NVIDIA fp32 sheets + V100/T4 fp16.
    assert (t.source == "deepbench").sum() == 160 * 10
    # Vidur network size is bytes: 64 MiB all-reduce on 8xH100 ~0.32-0.35 ms median (PROVENANCE.md sanity check).
    s = (t.device == "h100_dgx") & (t.op == "allreduce") & (t.group_size == 8) & (t.m == 64 << 20)
    assert 0.30e-3 < float(np.median(t.latency_s[s])) < 0.36e-3


def test_deepbench_keeps_operand_layout():
    """NN and TN of one shape are distinct rows (up to 3-4x apart, bench/lodo_floor.py); other sources: NaN."""
    t = load_gemm(data_path("kernels", "deepbench", "tidy", "gemm.csv"))
    assert sorted(np.unique(t.trans).tolist()) == [0.0, 1.0, 2.0]  # NN, NT, TN; no TT in DeepBench
    s = (t.device == "TitanX-Pascal") & (t.m == 8448) & (t.n == 24000) & (t.k == 2816)
    by = {float(c): float(x) for c, x in zip(t.trans[s], t.latency_s[s])}
    assert by[2.0] / by[0.0] > 3.0  # TN 348.7 ms vs NN 110.9 ms
    v = load([data_path("kernels", "vidur")]).table
    assert np.isnan(v.trans).all()


def test_missing_column_names_file_and_column(tmp_path):
    with open_data("kernels", "neusight", "train", "ln.csv") as fh:
        lines = fh.read().splitlines()
    header = lines[0].split(",")
    i = header.index("Latency")
    bad = tmp_path / "ln.csv"
    bad.write_text("\n".join([",".join(header[:i] + ["Lat"] + header[i + 1:])] + lines[1:50]) + "\n")
    with pytest.raises(MeshplanError, match=r"ln\.csv: missing column 'Latency'"):
        load_file(bad, "neusight/train")


def test_unit_mismatch_detected(tmp_path):
    # Latency written in microseconds instead of ms: median 1000x too large.
    import csv

    with open_data("kernels", "neusight", "train", "softmax.csv") as fh:
        rows = list(csv.reader(fh))
    li = rows[0].index("Latency")
    for r in rows[1:]:
        r[li] = str(float(r[li]) * 1000)
    bad = tmp_path / "softmax.csv"
    with bad.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with pytest.raises(MeshplanError, match=r"softmax\.csv: column 'Latency' unit mismatch"):
        load_file(bad, "neusight/train")
    # DeepBench: time_ms given in seconds disagrees with the file's own tflops_reported.
    with open_data("kernels", "deepbench", "tidy", "gemm.csv") as fh:
        g = list(csv.reader(fh))
    ti = g[0].index("time_ms")
    for r in g[1:]:
        r[ti] = str(float(r[ti]) / 1000)
    bad = tmp_path / "gemm.csv"
    with bad.open("w", newline="") as fh:
        csv.writer(fh).writerows(g)
    with pytest.raises(MeshplanError, match=r"gemm\.csv: column 'time_ms' unit mismatch"):
        load_gemm(bad)


def test_flops_bytes_agree_with_opspec():
    shapes = {"matmul": (96, 80, 64), "bmm": (3, 96, 80, 64), "attention": (2, 4, 128, 128, 64),
              "layernorm": (64, 512), "rmsnorm": (64, 512), "softmax": (64, 512), "elementwise": (4096,),
              "activation": (4096,), "swiglu": (4096,), "embedding": (128, 256), "optimizer": (4096,),
              "copy": (4096,), "cast": (4096,)}
    from meshplan.costmodel.learned import op_fields

    for kind in COMPUTE_KINDS:
        op = OpSpec(kind, shapes[kind], "bf16")
        b, m, n, k = op_fields(op)
        f, by = flops_bytes(np.array([kind], dtype=object), [b], [m], [n], [k], np.array(["bf16"], dtype=object))
        assert f[0] == pytest.approx(op.flops), kind
        assert by[0] == pytest.approx(op.bytes), kind
    # Unary activations read one tensor and write one (2 accesses per element); binary elementwise ops read two.
    assert OpSpec("activation", (4096,), "bf16").bytes == 2 * 2 * 4096
    assert OpSpec("elementwise", (4096,), "bf16").bytes == 3 * 2 * 4096
    # A fused SwiGLU reads gate and up and writes their product: 3 accesses per output element.
    assert OpSpec("swiglu", (4096,), "bf16").bytes == 3 * 2 * 4096


def test_cli_bad_dataset_is_one_line(runner, tmp_path):
    from meshplan.cli.main import app

    d = tmp_path / "data" / "neusight"
    (d / "train").mkdir(parents=True)
    (d / "test").mkdir()
    with open_data("kernels", "neusight", "test", "ln.csv") as fh:
        (d / "test" / "ln.csv").write_text(fh.read())
    (d / "train" / "ln.csv").write_text("OPName,Device,B,H\nln,Tesla T4,1,2\n")
    r = runner.invoke(app, ["costmodel", "train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "m")])
    assert r.exit_code == 2
    assert "missing column 'Latency'" in r.output and "Traceback" not in r.output
