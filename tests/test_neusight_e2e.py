"""End-to-end training step times measured by NeuSight (Lee et al., ASPLOS'25; data/kernels/neusight/labels)
predicted by the planner with the layout pinned (`meshplan plan --fix ...`), single GPU and 4-GPU DP / TP / PP.

NeuSight's measurement (neusight/Tracing/trace.py `measure_e2e`, sitar-lab/NeuSight): HF GPT-2 Large in fp32
(TF32 off), eager attention, train mode (dropout on); e2e = forward + backward, no optimizer step — so the
planner's optimizer time (`breakdown.other_s`) is left out of the comparison. In the 4-GPU labels the batch is
the global batch (dp4 batch 4 = one sequence per GPU; pp4_N = N micro-batches).
"""
import json
import statistics

from meshplan.planner.search.job import PlanRequest, plan_job
from tests.helpers import data_path

DEVICES = {"NVIDIA_H100_80GB_HBM3": "H100", "NVIDIA_A100-SXM4-40GB": "A100-40GB",
           "NVIDIA_A100_80GB_PCIe": "A100-PCIe-80GB", "NVIDIA_L4": "L4", "Tesla_V100-PCIE-32GB": "V100-PCIe-32GB"}


def _rows():
    labels = data_path("kernels", "neusight", "labels")
    rows = []
    for folder, device in DEVICES.items():
        for f in sorted((labels / folder).glob("gpt2_large-train-*.json")):
            parts = f.stem.split("-")
            seq, batch = int(parts[2]), int(parts[3])
            par = parts[4] if len(parts) > 4 else ""
            if not par:
                n, fix = 1, f"dp=1,tp=1,pp=1,mbs={batch}"
            elif par == "dp4":
                n, fix = 4, f"dp=4,tp=1,pp=1,mbs={batch // 4}"
            elif par == "tp4":
                n, fix = 4, f"dp=1,tp=4,pp=1,mbs={batch},sp=false"
            else:  # pp4_N: N micro-batches
                n, fix = 4, f"dp=1,tp=1,pp=4,vpp=1,mbs={batch // int(par.split('_')[1])}"
            fix += ",cp=1,ep=1,zero=0,recompute=none,attention=unfused"
            rows.append((f"{device}:{f.stem}", f"{n}x{device}", batch, seq, fix,
                         json.loads(f.read_text())["e2e_latency"] / 1e3))
    return rows


def test_neusight_measured_steps_median_error(tmp_path):
    rows = _rows()
    assert len(rows) >= 15
    errors = {}
    for label, cluster, batch, seq, fix, measured_s in rows:
        out = plan_job(PlanRequest.of("gpt2-large", cluster, batch, seq, fix=fix, dtype="fp32", top=1,
                                      out=tmp_path / "p.yaml"))
        pred = out.plan.prediction
        errors[label] = (pred.step_time_s - pred.breakdown.other_s - measured_s) / measured_s
    med = statistics.median(abs(e) for e in errors.values())
    assert med <= 0.15, f"median |error| {med:.1%}: " + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items())
    # the distributed runs (4-GPU DP, TP, PP on A100 and H100) are covered and within the same bound
    dist = [abs(v) for k, v in errors.items() if k.split("-")[-1][:3] in ("dp4", "tp4", "pp4")]
    assert len(dist) == 9 and statistics.median(dist) <= 0.15
