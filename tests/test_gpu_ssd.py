"""bench/gpu_ssd.py, the prepared GPU timing of mamba_ssm's SSD scan forward and backward: its recurrence reference
against values worked by hand, its mixer shapes against the Nemotron 3 HF configs it cites, and its --quick mode
(the reference timed on this CPU) writing the schema its --tables reads."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers import load_gpu_script

ROOT = Path(__file__).resolve().parents[1]
LN2 = math.log(2.0)


@pytest.fixture(scope="module")
def ssd_script():
    return load_gpu_script("gpu_ssd")


def _ones(*shape):
    return torch.ones(*shape, dtype=torch.float32)


def test_reference_is_the_recurrence_worked_by_hand(ssd_script):
    # dt = softplus(0) = ln 2 and A = -1: each step keeps exp(-ln 2) = 1/2 of the state and adds ln 2 * x * B, so
    # with x = B = C = 1 the outputs are ln 2, (1/2 + 1) ln 2, (1/4 + 1/2 + 1) ln 2
    x, dt, a = _ones(1, 3, 1, 1), torch.zeros(1, 3, 1), -_ones(1)
    y = ssd_script.ssd_reference(x, dt, a, _ones(1, 3, 1, 1), _ones(1, 3, 1, 1))
    assert y.flatten().tolist() == pytest.approx([LN2, 1.5 * LN2, 1.75 * LN2], rel=1e-6)
    # D adds D * x; z gates by silu(z) = z * sigmoid(z); dt_bias shifts dt before the softplus
    d, z = torch.tensor([2.0]), torch.full((1, 3, 1, 1), 1.0)
    gated = ssd_script.ssd_reference(x, dt, a, _ones(1, 3, 1, 1), _ones(1, 3, 1, 1), D=d, z=z)
    silu1 = 1.0 / (1.0 + math.exp(-1.0))
    assert gated.flatten().tolist() == pytest.approx([(v + 2.0) * silu1 for v in (LN2, 1.5 * LN2, 1.75 * LN2)],
                                                     rel=1e-6)
    shifted = ssd_script.ssd_reference(x[:, :1], dt[:, :1], a, _ones(1, 1, 1, 1), _ones(1, 1, 1, 1),
                                       dt_bias=torch.tensor([1.0]))
    assert shifted.item() == pytest.approx(math.log1p(math.e), rel=1e-6)  # softplus(1) * x * B * C


def test_heads_of_a_group_share_its_b_and_c(ssd_script):
    torch.manual_seed(0)
    x = torch.randn(1, 5, 1, 3).expand(1, 5, 2, 3).contiguous()  # two heads, the same input
    dt, a = torch.zeros(1, 5, 2), torch.tensor([-0.5, -0.5])
    b, c = torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4)
    y = ssd_script.ssd_reference(x, dt, a, b, c)
    assert torch.equal(y[:, :, 0], y[:, :, 1])
    alone = ssd_script.ssd_reference(x[:, :, :1], dt[:, :, :1], a[:1], b, c)
    assert torch.allclose(alone[:, :, 0], y[:, :, 0])


def test_mixers_are_the_hf_configs(ssd_script):
    for name, file in (("nemotron3-nano", "nemotron-3-nano-30b-a3b.json"),
                       ("nemotron3-super", "nemotron-3-super-120b-a12b.json")):
        cfg = json.loads((ROOT / "data" / "published_runs" / "configs" / file).read_text(encoding="utf-8"))
        assert ssd_script.MIXERS[name] == (cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["ssm_state_size"],
                                           cfg["n_groups"])
    assert ssd_script.shape_of("nemotron3-super", 2) == (64, 64, 128, 4)  # TP splits heads and groups


def test_quick_mode_writes_the_schema_and_tables_read_it(tmp_path, ssd_script):
    out = tmp_path / "s.json"
    assert ssd_script.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    sec = result["sections"]["ssd"]
    assert result["schema"] == "meshplan.gpu_ssd/1" and sec["impl"].startswith("ssd_reference")
    assert [(r["tp"], r["heads"], r["groups"]) for r in sec["records"]] == [(1, 4, 2), (2, 2, 1)]
    for r in sec["records"]:
        assert r["token_heads"] == r["batch"] * r["seq_len"] * r["heads"] and "fwd_bwd_kernels" in r
    checked = ssd_script.check(ssd_script.ssd_reference, ssd_script.QUICK_PLAN, torch.device("cpu"))
    assert checked["output_rel_diff"] == 0 and checked["dx_rel_diff"] == 0  # the GPU run's check, on itself
    # a scan 2% off in its output (and so in every gradient) is reported 2% off, in bf16's rounding
    off = ssd_script.check(lambda **kw: ssd_script.ssd_reference(**kw) * 1.02, ssd_script.QUICK_PLAN,
                           torch.device("cpu"))
    assert off["output_rel_diff"] == pytest.approx(0.02, abs=0.008) and off["dx_rel_diff"] == pytest.approx(0.02,
                                                                                                             abs=0.008)
    table = "\n".join(ssd_script.tables(str(out)))
    assert "ssd_reference" in table and table.count("tiny") == 2


def test_a_missing_source_distribution_is_named(tmp_path, ssd_script):
    with pytest.raises(FileNotFoundError, match="mamba_ssm-"):
        ssd_script.load_scan(tmp_path)
