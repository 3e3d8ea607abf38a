"""`meshplan plan`: search output, pinning, atomic plan file, and one clear line per bad input."""
import json

import pytest

from meshplan.cli.main import app
from meshplan.planner.plan.schema import load_plan
from tests.helpers import data_path

KEYS = ("step_time_s", "tokens_per_s", "tflops_per_device", "mfu", "peak_memory_bytes",
        "dp_replicate", "dp_shard", "tp", "pp", "vpp", "cp", "ep")


def _plan(runner, tmp_path, *args):
    return runner.invoke(app, ["plan", *args, "--out", str(tmp_path / "p.yaml")])


def test_json_ranked_best_first(runner, tmp_path):
    res = _plan(runner, tmp_path, "--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "256",
                "--seq-len", "8192", "--top", "5", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["plans"]
    assert len(rows) == 5
    for r in rows:
        assert all(k in r for k in KEYS)
        assert r["dp_replicate"] * r["dp_shard"] * r["tp"] * r["pp"] * r["cp"] == 16
        assert r["peak_memory_bytes"] <= 80 * 1024**3
        # tokens/s is global batch * seq / step time
        assert r["tokens_per_s"] == pytest.approx(256 * 8192 / r["step_time_s"])
    steps = [r["step_time_s"] for r in rows]
    assert all(b >= a * (1 - 1e-3) for a, b in zip(steps, steps[1:]))
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.prediction.step_time_s == pytest.approx(steps[0])
    assert plan.degrees.tp == rows[0]["tp"] and plan.meshplan_version
    b = plan.prediction.breakdown
    assert b.compute_s + b.exposed_comm_s + b.bubble_s + b.other_s == pytest.approx(plan.prediction.step_time_s)


def test_fix_all_evaluates_one(runner, tmp_path):
    fix = "dp=2,dp_shard=1,tp=4,pp=2,vpp=2,cp=1,ep=1,sp=true,mbs=1,zero=1,recompute=selective,attention=flash"
    res = _plan(runner, tmp_path, "--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "64",
                "--seq-len", "4096", "--fix", fix, "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["plans"]
    assert len(rows) == 1
    r = rows[0]
    assert (r["dp"], r["tp"], r["pp"], r["vpp"], r["zero"], r["recompute"], r["sp"]) == \
        (2, 4, 2, 2, 1, "selective", True)
    out = json.loads(res.stdout)  # every decision pinned: a space of one layout, priced
    assert (out["layouts_in_space"], out["layouts_priced"], out["layouts_pruned"]) == (1, 1, 0)


def test_json_counts_the_space(runner, tmp_path):
    """``--json`` says how many layouts the space holds (the enumeration's own count), how many were priced in
    full and how many pruned; the two add up to the space."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.layout.space import Pins, enumerate_layouts
    from meshplan.planner.model.config import load_model

    res = _plan(runner, tmp_path, "--model", "qwen3-30b-a3b", "--cluster", "4x8xH100", "--global-batch", "64",
                "--seq-len", "4096", "--fix", "tp=2,pp=4", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    space = sum(1 for _ in enumerate_layouts(load_model("qwen3-30b-a3b"), load_cluster("4x8xH100").world_size, 8,
                                             64, 4096, Pins(tp=2, pp=4)))
    assert out["layouts_in_space"] == space > 2000  # large enough that the search prunes
    assert out["layouts_priced"] + out["layouts_pruned"] == space and 0 < out["layouts_priced"] < space / 2
    assert out["layouts_timed"] + out["layouts_unfit"] <= out["layouts_pruned"]  # the rest: bounds never reached


def test_pinning_a_slower_choice_never_beats_the_free_search(runner, tmp_path):
    free = json.loads(_plan(runner, tmp_path, "--model", "qwen3-8b", "--cluster", "8xA100", "--global-batch",
                            "64", "--seq-len", "4096", "--json", "--top", "1").stdout)["plans"][0]
    pinned = json.loads(_plan(runner, tmp_path, "--model", "qwen3-8b", "--cluster", "8xA100", "--global-batch",
                              "64", "--seq-len", "4096", "--json", "--top", "1", "--fix", "tp=8").stdout)["plans"][0]
    assert pinned["tp"] == 8
    assert free["step_time_s"] <= pinned["step_time_s"]


def test_table_output_and_plan_file(runner, tmp_path):
    res = _plan(runner, tmp_path, "--model", "mistral-7b", "--cluster", "8xH100", "--global-batch", "32",
                "--seq-len", "4096", "--top", "3")
    assert res.exit_code == 0, res.output
    assert "tokens/s" in res.stdout and "best plan written" in res.stdout
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temp file


def test_config_path_model(runner, tmp_path):
    cfg = data_path("model_configs", "qwen2.5-7b.json")
    res = _plan(runner, tmp_path, "--model", str(cfg), "--cluster", "8xA100", "--global-batch", "32",
                "--seq-len", "2048", "--json", "--top", "1")
    assert res.exit_code == 0, res.output


BAD = [
    ("malformed config", ["--model", "{bad}", "--cluster", "8xH100"], "malformed JSON"),
    ("unknown model_type", ["--model", "{unk}", "--cluster", "8xH100"], "unknown model_type"),
    ("unknown device", ["--model", "llama-3.1-8b", "--cluster", "2x8xR100"], "unknown device 'R100'"),
    ("cluster typo", ["--model", "llama-3.1-8b", "--cluster", "{typo}"], "devices_per_nod"),
    ("degrees do not divide", ["--model", "llama-3.1-8b", "--cluster", "8xH100", "--fix", "tp=3"],
     "tp(3) = 3 does not divide the world size 8"),
    ("batch cannot be split", ["--model", "llama-3.1-8b", "--cluster", "8xH100", "--fix", "dp=8",
                               "--global-batch", "12"], "global batch 12 is not divisible"),
    ("fits nowhere", ["--model", "llama-3.1-70b", "--cluster", "1xT4", "--dtype", "fp16"], "misses by"),
    ("dtype the device lacks", ["--model", "llama-3.1-8b", "--cluster", "1xT4"], "T4 does not support bf16"),
    ("unknown fix key", ["--model", "llama-3.1-8b", "--cluster", "8xH100", "--fix", "foo=1"], "--fix key 'foo'"),
]


@pytest.mark.parametrize("case,args,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_exit_2(case, args, needle, runner, tmp_path):
    (tmp_path / "bad.json").write_text('{"model_type": "llama", "hidden_size": \n')
    (tmp_path / "unk.json").write_text('{"model_type": "foo", "hidden_size": 5}')
    (tmp_path / "typo.yaml").write_text("groups:\n  - nodes: 2\n    devices_per_nod: 8\n    device: H100\n")
    args = [a.format(bad=tmp_path / "bad.json", unk=tmp_path / "unk.json", typo=tmp_path / "typo.yaml")
            for a in args]
    if "--global-batch" not in args:
        args += ["--global-batch", "16"]
    res = _plan(runner, tmp_path, *args, "--seq-len", "4096")
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert needle in lines[0]
    assert "Traceback" not in res.output


def test_search_size_is_checked_before_enumerating(runner, tmp_path):
    """720,720 GPUs (240 divisors) leave a space the search would price for minutes: refused at once, with the
    factors and what to pin; pinning tp and pp brings it back within bounds (issue 16 item 4). The bound counts
    each tp x pp x cp mesh's candidates (issue 12 item 7), so the case is one with candidates to count: an MoE
    model (ep x etp x moe_overlap), fp8 (three recipes) and a global batch every data-parallel degree divides."""
    from meshplan.planner.layout.space import MAX_LAYOUTS, Pins, space_size_bound
    from meshplan.planner.model.config import load_model

    recipes = ("tensorwise", "delayed", "blockwise")
    qwen = load_model("qwen3-30b-a3b")
    bound, _ = space_size_bound(qwen, 720720, 8, 1441440, Pins(), recipes, 8192)
    assert bound > MAX_LAYOUTS
    args = ["--model", "qwen3-30b-a3b", "--cluster", "90090x8xH100", "--global-batch", "1441440", "--seq-len",
            "8192", "--dtype", "fp8"]
    r = runner.invoke(app, ["plan", *args, "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and "holds up to" in r.output and "--fix" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    pinned, _ = space_size_bound(qwen, 720720, 8, 1441440, Pins(tp=8, pp=1), recipes, 8192)
    assert pinned <= MAX_LAYOUTS


def test_explain_is_printed_and_kept_in_the_plan(runner, tmp_path):
    """issue 13 item 6: --explain renders the breakdown (per stage compute by op class, exposed comm by collective
    and link, the efficiency each class was priced at) and writes it into the plan; --json carries it too."""
    args = ["plan", "--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "64", "--seq-len", "4096",
            "--fix", "tp=2,pp=2,mbs=1", "--top", "1", "--explain", "--out", str(tmp_path / "p.yaml")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    for needle in ("s per step (slowest stage", "per stage, seconds per step", "allgather on", "nvlink4",
                   "sendrecv", "efficiency each op class was priced at", "matmul bf16", "attention bf16"):
        assert needle in r.output, needle
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.explain and plan.explain["step_time_s"] == pytest.approx(plan.prediction.step_time_s)
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["explain"]["stages"][0]["compute_s"]
