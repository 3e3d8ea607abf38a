"""The bad inputs a corpus kept apart from the fuzz suite found getting through (tracebacks, wrong input accepted
with exit 0, hangs), one test per class: each ends in exit 2 with one line naming the input and what was expected
(or Typer's usage box naming the option, for an option outside its range). tests/test_input_fuzz.py generates
more of each class."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from meshplan.cli.main import app
from meshplan.core.bounds import check_tree, loads_json
from meshplan.core.errors import MeshplanError
from tests.helpers import REPO
from tests.test_check import _plan, _run

PLAN = ["plan", "-m", "llama-3.1-8b", "-c", "1x8xH100", "-b", "64", "-s", "2048", "--top", "1"]
CONFIG = REPO / "planner" / "presets" / "models" / "llama-3.1-8b-instruct.json"


def _one_line(res, *needles: str) -> str:
    """Exit 2, no exception but SystemExit, one line (``error: ...``) holding every needle."""
    assert res.exit_code == 2 and (res.exception is None or isinstance(res.exception, SystemExit)), (
        res.exit_code, repr(res.exception), res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def _usage(res, option: str) -> None:
    """Exit 2 with Typer's usage box naming the option (a value outside the option's range)."""
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.exit_code, res.output)
    assert "Usage:" in res.output and option in res.output, res.output


@pytest.mark.parametrize("argv", [
    PLAN + ["--out", "{d}"],
    ["export", str(REPO / "plans" / "llama-3.1-8b.yaml"), "--to", "torchrun", "--out", "{d}"],
])
def test_output_path_that_is_a_folder(runner, tmp_path, argv):
    d = tmp_path / "folder"
    d.mkdir()
    res = runner.invoke(app, [a.replace("{d}", str(d)) for a in argv])
    _one_line(res, str(d), "is a folder")


def test_check_summary_that_is_a_folder(runner, tmp_path):
    plan = _plan(tmp_path)
    run = _run(tmp_path, {"0": [0.2] * 5, "1": [0.2] * 5}, plan=plan)
    for flag in ("--summary", "--junit"):
        res = runner.invoke(app, ["check", str(plan), str(run), "--no-breakdown", flag, str(tmp_path)])
        _one_line(res, str(tmp_path), "is a folder")


@pytest.mark.parametrize("key,value,needle", [
    ("step_times_s", {"0": "abc", "1": [0.2]}, "step_times_s.0"),  # a string where a list belongs
    ("devices", 5, "devices"),  # an int where a mapping belongs
    ("argv", "python train.py --plan 'p.yaml", "argv: Value error, not a shell command line"),  # unbalanced quote
    ("argv", 5, "argv"),
    ("plan", 5, "plan"),
    ("pinned", "x", "pinned"),
    ("peak_memory_bytes", {"0": float("inf")}, "peak_memory_bytes.0: inf is not a finite number"),
    ("peak_memory_bytes", {"0": -1.0}, "peak_memory_bytes.0"),
    ("plan_copy", "../../etc/passwd", "plan_copy"),
])
def test_check_on_run_json_fields_of_wrong_type_or_shape(runner, tmp_path, key, value, needle):
    plan = _plan(tmp_path)
    run = _run(tmp_path, {"0": [0.2] * 5, "1": [0.2] * 5}, plan=plan)
    rec = json.loads((run / "run.json").read_text())
    rec[key] = value
    (run / "run.json").write_text(json.dumps(rec))
    _one_line(runner.invoke(app, ["check", str(plan), str(run), "--no-breakdown"]), "run.json", needle)


def test_recorded_argv_as_a_quoted_string_is_split(tmp_path):
    from meshplan.profiler.capture import load_run_json

    run = _run(tmp_path, {"0": [0.2]}, argv=None)
    rec = json.loads((run / "run.json").read_text())
    rec["argv"] = "train.py --plan 'my plan.yaml' --tp 2"
    (run / "run.json").write_text(json.dumps(rec))
    assert load_run_json(run)["argv"] == ["train.py", "--plan", "my plan.yaml", "--tp", "2"]


@pytest.mark.parametrize("payload,needle", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # was a RecursionError
    ("[" * 65 + "]" * 65, "nested too deeply (more than 64 levels)"),
    ("1" + "0" * 3000, "an integer of 3001 digits"),
    ("NaN", "nan is not a finite number"),
    ("1e999", "inf is not a finite number"),
])
def test_model_config_bounds(runner, tmp_path, payload, needle):
    text = CONFIG.read_text().rstrip().rstrip("}") + ', "extra": ' + payload + "}"
    (tmp_path / "config.json").write_text(text)
    res = runner.invoke(app, PLAN[:1] + ["-m", str(tmp_path / "config.json")] + PLAN[3:]
                        + ["--out", str(tmp_path / "p.yaml")])
    _one_line(res, "config.json", needle)


@pytest.mark.parametrize("argv,option", [
    (PLAN + ["--quality-budget", "inf"], "--quality-budget"),
    (PLAN + ["--quality-budget", "nan"], "--quality-budget"),
    (PLAN + ["--compress", "--error-budget", "inf"], "--error-budget"),
    (PLAN + ["--workload", "serve", "--gen-len", "0"], "--gen-len"),
    (PLAN + ["--workload", "serve", "--gen-len", "-5"], "--gen-len"),
    (["costmodel", "collect", "--out", "{t}/c", "--quick", "--repeats", "0"], "--repeats"),
    (["costmodel", "collect", "--out", "{t}/c", "--quick", "--threads", "0"], "--threads"),
    (["costmodel", "predict", "--op", "allreduce", "--shape", "1048576", "--device", "H100", "--group-size", "0"],
     "--group-size"),
    (["costmodel", "predict", "--op", "allreduce", "--shape", "1048576", "--device", "H100", "--group-size", "-4"],
     "--group-size"),
    (["costmodel", "train", "--out", "{t}/m", "--data", "{t}", "--rounds", "0"], "--rounds"),
    (["costmodel", "train", "--out", "{t}/m", "--data", "{t}", "--rounds", "-3"], "--rounds"),
    (["costmodel", "train", "--out", "{t}/m", "--data", "{t}", "--max-rows", "0"], "--max-rows"),
])
def test_counts_and_budgets_out_of_range(runner, tmp_path, argv, option):
    _usage(runner.invoke(app, [a.replace("{t}", str(tmp_path)) for a in argv]), option)


def test_train_refuses_zero_rounds_in_the_library(tmp_path):
    """The library refuses too (a caller other than the CLI): zero rounds or rows hung the subsampling loop."""
    from meshplan.costmodel.train import train

    for kw in ({"n_estimators": 0}, {"max_rows_per_kind": 0}, {"n_estimators": -3}):
        with pytest.raises(MeshplanError, match="expected a count >= 1"):
            train([tmp_path], tmp_path / "m", **kw)


def test_unknown_dtype_to_costmodel_predict(runner):
    res = runner.invoke(app, ["costmodel", "predict", "--op", "matmul", "--shape", "64x64x64", "--device", "H100",
                              "--dtype", "bogus"])
    _one_line(res, "--dtype bogus", "unknown dtype")
    ok = runner.invoke(app, ["costmodel", "predict", "--op", "matmul", "--shape", "64x64x64", "--device", "H100",
                             "--dtype", "bfloat16", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["dtype"] == "bf16", ok.output


@pytest.mark.parametrize("op, shape, device, dtype", [("matmul", "64x64x64", "H100", "nvfp4"),
                                                      ("bmm", "4x64x64x64", "A100", "fp8"),
                                                      ("attention", "1x8x512x512x64", "V100", "bf16")])
def test_costmodel_predict_refuses_math_the_device_lacks(runner, op, shape, device, dtype):
    """A GEMM or attention in a dtype the device has no math for (the catalogue's peaks: no nvfp4 on an H100, no fp8
    on an A100, no bf16 on a V100) was priced anyway, off another dtype's rate; now one line naming the device."""
    res = runner.invoke(app, ["costmodel", "predict", "--op", op, "--shape", shape, "--device", device, "--dtype",
                              dtype])
    _one_line(res, "does not support " + dtype)
    ok = runner.invoke(app, ["costmodel", "predict", "--op", "cast", "--shape", "4096", "--device", device, "--dtype",
                             dtype, "--json"])  # a memory-bound op: the dtype sets its bytes, no math asked
    assert ok.exit_code == 0, ok.output


def test_fix_key_twice_with_different_values(runner, tmp_path):
    res = runner.invoke(app, PLAN + ["--fix", "tp=8,pp=1,tp=4", "--out", str(tmp_path / "p.yaml")])
    _one_line(res, "--fix tp given twice", "tp=8", "tp=4")


@pytest.mark.parametrize("part,key,value,needle", [
    ("model", "num_layers", 0, "model.num_layers"),
    ("model", "num_attention_heads", 0, "model.num_attention_heads"),
    ("groups", "devices_per_node", -8, "cluster.groups.0.devices_per_node"),
    ("groups", "nodes", 0, "cluster.groups.0.nodes"),
    ("prediction", "step_time_s", float("inf"), "prediction.step_time_s"),
    ("model", "num_params", 10**30, "an integer of 31 digits at line"),
])
def test_plan_files_with_counts_that_mean_nothing(runner, tmp_path, part, key, value, needle):
    import yaml

    doc = yaml.safe_load((REPO / "plans" / "llama-3.1-8b.yaml").read_text())
    target = doc["cluster"]["groups"][0] if part == "groups" else doc[part]
    target[key] = value
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["export", str(tmp_path / "p.yaml"), "--to", "torchrun"])
    _one_line(res, "p.yaml", needle)


def test_plan_yaml_nesting_and_integers_bounded(runner, tmp_path):
    base = (REPO / "plans" / "llama-3.1-8b.yaml").read_text()
    for extra, needle in (("notes: " + "[" * 200 + "]" * 200 + "\n", "nested more than 64"),
                          ("global_batch: 1" + "0" * 40 + "\n", "an integer of 41 digits")):
        (tmp_path / "p.yaml").write_text(base.replace("notes:", "old_notes:") + extra if "notes" in extra
                                         else base.replace("global_batch:", "old_global_batch:") + extra)
        _one_line(runner.invoke(app, ["export", str(tmp_path / "p.yaml"), "--to", "torchrun"]), "p.yaml", needle)


def test_trace_with_integer_of_thousands_of_digits(runner, tmp_path):
    src = REPO / "tests" / "data" / "profiler" / "gloo_ddp_2rank"
    run = tmp_path / "run"
    shutil.copytree(src, run)
    import gzip

    doc = json.loads(gzip.decompress((run / "rank0.trace.json.gz").read_bytes()))
    i, ev = next((i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    old = sys.get_int_max_str_digits()
    for digits in (1000, 5000):
        ev["dur"] = 10 ** digits
        sys.set_int_max_str_digits(0)
        try:
            (run / "rank0.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
        finally:
            sys.set_int_max_str_digits(old)
        res = runner.invoke(app, ["replay", str(run), "--json", "--no-cache"])
        _one_line(res, "rank0.trace.json.gz", "integer")


def test_bounds_are_one_line_naming_the_key():
    with pytest.raises(MeshplanError, match=r"^f: a\.b\[1\]: inf is not a finite number$"):
        check_tree({"a": {"b": [1, float("inf")]}}, "f")
    with pytest.raises(MeshplanError, match=r"^f: x: an integer of 21 digits"):
        check_tree({"x": 10**20}, "f")
    assert loads_json('{"x": 18446744073709551615}', "f") == {"x": 2**64 - 1}  # uint64 max is fine


@pytest.mark.parametrize("doc,needle", [
    ({"precisions": ["bf16"], "layers": [["x"]]}, "layers: expected rows of 1 numbers >= 0"),
    ({"precisions": ["bf16"], "layers": 5}, "layers: expected rows"),
    ({"precisions": ["bf16"], "layers": [[1e999]]}, "layers[0][0]: inf is not a finite number"),
    ({"precisions": ["bf16"], "layers": [[0.1]] * 2, "x": [[[[0]]]] * 1}, None),
])
def test_sensitivity_file_bounds(tmp_path, doc, needle):
    """``plan --sensitivity FILE``: rows of numbers, finite, within the bounds; a wrong one is one line."""
    from meshplan.planner.search.solve.sensitivity import read_sensitivity

    (tmp_path / "s.json").write_text(json.dumps(doc))
    if needle is None:
        assert read_sensitivity(tmp_path / "s.json", ["bf16"], 4) == [[0.1]] * 4
        return
    with pytest.raises(MeshplanError) as exc:
        read_sensitivity(tmp_path / "s.json", ["bf16"], 4)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_collective_shape_of_absurd_dimensions_is_not_a_shape(tmp_path):
    """An ``Input Dims`` of 10^200 x 10^200 on a collective annotation: its bytes would overflow a float; read as
    no shape (0 bytes), not a traceback."""
    from meshplan.profiler.trace import load_trace

    ev = {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 1, "ts": 100.0,
          "dur": 10.0, "args": {"Input Dims": [[10**200, 10**200]], "Input type": ["float"]}}
    step = {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 50.0, "dur": 500.0}
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": [step, ev]}))
    assert [e.bytes for e in load_trace(tmp_path / "rank0.json").events] == [0.0]


def _plan_576(runner, tmp_path, batch: int, *fix: str, cluster: str = "72x8xH100"):
    return runner.invoke(app, ["plan", "-m", "llama-3.1-8b", "-c", cluster, "-s", "4096", "--top", "3", "--json",
                               "-b", str(batch), "--out", str(tmp_path / f"{batch}{fix}.yaml"), *fix])


def test_a_global_batch_no_layout_splits_names_the_batches_that_would(runner, tmp_path):
    """576 GPUs, no pipeline (pp=1 pinned): every data-parallel degree keeps a factor 9 of 576 = 9 x 64 (dp 9 would
    need tp x cp = 64), so none divides 8192 = 2^13. The refusal names the multiples a batch must be and the nearest
    batches that split, and those batches plan: 8190 = 18 x 455 only over dp 18 (its other divisors hold no 32 =
    576 / 18), 8064 = 576 x 14 over every degree (the fastest at dp 576)."""
    def plan(batch: int, *fix: str, cluster: str = "72x8xH100"):
        return _plan_576(runner, tmp_path, batch, *fix, cluster=cluster)
    _one_line(plan(8192, "--fix", "pp=1"), "multiples of 18, 36, 72, 144, 288, 576)", "8190 (dp=18) or 8208 (dp=18)",
              "all do: 8064 or 8640")
    for batch, dps in ((8190, {18}), (8064, {18, 36, 72, 144, 288, 576})):
        res = plan(batch, "--fix", "pp=1")
        assert res.exit_code == 0, res.output
        assert {row["dp"] for row in json.loads(res.output)["plans"]} <= dps
    # micro-batch 2 pinned: multiples of 2 dp, 8172 = 36 x 227, 9216 = 1152 x 8
    _one_line(plan(8192, "--fix", "pp=1,mbs=2"), "multiples of 36, 72,", "8172 (dp=18) or 8208 (dp=18)",
              "8064 or 9216")
    # the interleaved schedule also needs the micro-batches a multiple of pp: 7 -> 8 = 2 dp x 4 micro-batches
    fix = ("--fix", "tp=1,pp=4,vpp=2,cp=1,mbs=1")
    _one_line(plan(7, *fix, cluster="1x8xH100"), "multiples of 8)", "8 (dp=2, pp=4 interleaved)")
    assert plan(8, *fix, cluster="1x8xH100").exit_code == 0


def test_a_free_search_takes_the_factor_into_uneven_pipeline_stages(runner, tmp_path):
    """Left free, the same 8192 over 576 GPUs plans: 9 pipeline stages of Llama 3.1 8B's 32 layers (uneven, which a
    free search tries only when no stage count dividing the layers splits the batch) leave 64 = 2^6 GPUs a stage,
    and every data-parallel degree of those divides 8192. The stages hold the 32 layers, and the note says what was
    searched and which batches even stages split (576 x 14 and 576 x 15)."""
    from meshplan.planner.layout.splits import parse_pp_layout

    res = _plan_576(runner, tmp_path, 8192)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for row in out["plans"]:
        assert row["pp"] == 9 and 8192 % (row["dp"] * row["mbs"]) == 0
        assert row["dp"] * row["tp"] * row["cp"] * row["pp"] == 576
        assert sum(parse_pp_layout(row["pp_layout"])) == 32
    assert ("searched pp=9 with uneven stages as well (global batch 8064 or 8640 splits with even stages)"
            in out["warnings"][0])


@pytest.mark.parametrize("pin, named", [("ep=4", "ep=4"), ("etp=2", "etp=2"), ("ep=2,etp=2", "ep=2, etp=2")])
def test_expert_parallelism_on_a_dense_model_names_what_was_pinned(runner, tmp_path, pin, named):
    """A dense model with an expert degree pinned: the line names the pins the user gave, nothing they did not."""
    res = runner.invoke(app, PLAN + ["--fix", pin, "--out", str(tmp_path / "p.yaml")])
    line = _one_line(res, f"{named} parallelizes experts", "has no experts")
    assert "etp=0" not in line and not (pin == "ep=4" and "etp" in line)
