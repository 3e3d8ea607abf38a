"""Quality indicators: the analytic defaults against Monte-Carlo quantization of Gaussian weights, and the
measured indicators of a real (tiny) torch model against the known ordering of number formats."""
from __future__ import annotations

import pytest
import torch

from meshplan.core.errors import MeshplanError
from meshplan.planner.search.solve.sensitivity import (
    fake_quantize,
    measure_compression_error,
    measure_layer_sensitivity,
    relative_mse,
)


@pytest.mark.parametrize("precision,fan_in", [("int8", 4096), ("int4", 4096), ("fp8", 1024), ("bf16", 1024),
                                              ("fp16", 1024)])
def test_analytic_relative_mse_matches_monte_carlo(precision, fan_in):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, fan_in, generator=g)
    measured = float((fake_quantize(w, precision) - w).pow(2).mean() / w.pow(2).mean())
    # the max-abs estimate sigma*sqrt(2 ln 2n) is an approximation of E[max]; 35% covers its bias at these n
    assert measured == pytest.approx(relative_mse(precision, fan_in), rel=0.35)


def test_reference_precision_has_no_error_and_unknown_is_refused():
    assert relative_mse("bf16", reference="bf16") == 0.0
    assert relative_mse("fp32") == 0.0
    with pytest.raises(MeshplanError, match="precision 'int3'"):
        relative_mse("int3")


def test_measured_layer_sensitivity_orders_formats():
    rows = measure_layer_sensitivity(["fp16", "bf16", "int4"], warmup_steps=5)
    assert len(rows) == 4  # the tiny model's blocks
    for fp16, bf16, int4 in rows:
        # mantissa bits 10 > 7 > (int4: 15 levels) - the gradient error must grow in that order
        assert 0 < fp16 < bf16 < int4


def test_measured_compression_error_orders_compressors():
    e = measure_compression_error([("fp16", 0), ("int8", 0), ("topk", 0.1), ("topk", 0.01), ("powersgd", 1),
                                   ("powersgd", 8)])
    assert e[("fp16", 0)] < e[("int8", 0)] < e[("topk", 0.1)] < e[("topk", 0.01)] < 1.0
    assert e[("powersgd", 8)] < e[("powersgd", 1)] < 1.0


def test_sensitivity_file_round_trip_and_resampling(tmp_path):
    from meshplan.planner.search.solve.sensitivity import read_sensitivity, write_sensitivity

    f = tmp_path / "sens.json"
    write_sensitivity(f, ["bf16", "int8"], [[0.0, 1.0], [0.0, 2.0], [0.0, 3.0]])
    assert read_sensitivity(f, ["int8"], 5) == [[1.0], [2.0], [2.0], [3.0], [3.0]]
    with pytest.raises(MeshplanError, match="no column for precision int4"):
        read_sensitivity(f, ["int4"], 5)
    with pytest.raises(MeshplanError, match="sensitivity file not found"):
        read_sensitivity(tmp_path / "nope.json", ["int8"], 5)
