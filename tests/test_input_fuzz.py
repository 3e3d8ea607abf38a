"""Fuzz suite (hypothesis) of the planner's inputs (issue 16 item 5): HF config.json files, cluster specs and YAML
files, plan files, ``--fix`` strings, sizes and bandwidths, and the options of ``plan``, ``export`` and ``check``.

Every input ends in a result or a clean refusal (one line, :class:`MeshplanError`, exit 2): never a traceback.
The default run tries a few dozen inputs per target (seconds); ``-m slow`` runs thousands. ``pytest -s`` prints the
counts (BENCHMARKS.md records a long run). Mutation values are the trace fuzzer's (tests/test_profiler_fuzz.py).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.core.units import parse_bandwidth, parse_size
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.schema import load_plan
from tests.helpers import REPO
from tests.test_profiler_fuzz import _values

COUNTS: Counter = Counter()
_FAST = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
_LONG = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)

CONFIG = REPO / "planner" / "presets" / "models" / "llama-3.1-8b-instruct.json"
CLUSTER = REPO / "planner" / "presets" / "clusters" / "mixed-a100-l4.yaml"
PLAN = REPO / "plans" / "llama-3.1-8b.yaml"
_words = st.one_of(st.text(max_size=20), st.sampled_from(
    ["16x8xH100", "0x8xH100", "8xA100+", "local:2", "local:-1", "1e3xH100", "2x8xH100+4x4xL4", "x", "tp=8,pp=4",
     "tp=0", "tp=8,tp=4", "recompute=maybe", "zero=9", "mbs=1e9", "=", ",", "25Gbps", "-1GB/s", "nanGbps",
     "1e400B", "4MiB", "12 bytes"]))


def _clean(target: str, fn: Callable[[], object]) -> None:
    """Run ``fn``: a result, or one clean line of refusal; anything else fails the test."""
    COUNTS[f"{target} inputs"] += 1
    try:
        fn()
        COUNTS[f"{target} accepted"] += 1
    except MeshplanError as exc:
        assert "\n" not in str(exc) and 0 < len(str(exc)) < 2000, str(exc)
        COUNTS[f"{target} refused cleanly"] += 1


def _mutate(doc: dict, draw, keys: list[str]) -> dict:
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["set", "drop", "nest"]))
        key = draw(st.sampled_from(keys))
        if what == "set":
            doc[key] = draw(_values)
        elif what == "drop":
            doc.pop(key, None)
        elif isinstance(doc.get(key), dict):
            doc[key][draw(st.text(max_size=8))] = draw(_values)
    return doc


@st.composite
def _configs(draw) -> str:
    doc = json.loads(CONFIG.read_text())
    return json.dumps(_mutate(doc, draw, list(doc) + ["num_local_experts", "head_dim", "rope_parameters"]),
                      allow_nan=True)


@st.composite
def _cluster_files(draw) -> str:
    doc = yaml.safe_load(CLUSTER.read_text())
    if draw(st.booleans()):
        g = doc["groups"][draw(st.integers(0, len(doc["groups"]) - 1))]
        _mutate(g, draw, list(g) + ["intra_link", "nodez"])
    else:
        _mutate(doc, draw, list(doc) + ["inter_link", "group"])
    return yaml.safe_dump(doc)


@st.composite
def _plan_files(draw) -> str:
    doc = yaml.safe_load(PLAN.read_text())
    part = draw(st.sampled_from(["", "model", "degrees", "cluster", "prediction"]))
    target = doc if not part or not isinstance(doc.get(part), dict) else doc[part]
    _mutate(target, draw, list(target))
    text = yaml.safe_dump(doc)
    return text[:draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


def _check_config(tmp: Path, text: str) -> None:
    (tmp / "config.json").write_text(text)
    _clean("config.json", lambda: load_model(str(tmp / "config.json")))


def _check_cluster_file(tmp: Path, text: str) -> None:
    (tmp / "c.yaml").write_text(text)
    _clean("cluster YAML", lambda: load_cluster(str(tmp / "c.yaml")))


def _check_plan_file(tmp: Path, text: str) -> None:
    (tmp / "p.yaml").write_text(text)
    _clean("plan file", lambda: load_plan(tmp / "p.yaml"))


def _check_strings(text: str) -> None:
    _clean("--fix", lambda: parse_fix(text))
    _clean("cluster spec", lambda: load_cluster(text) if not text.startswith("local:") else parse_fix(None))
    _clean("bandwidth", lambda: parse_bandwidth(text))
    _clean("size", lambda: parse_size(text))


_plan_opts = st.lists(st.tuples(st.sampled_from(["--fix", "--dtype", "--top", "--global-batch", "--seq-len",
                                                 "--workload", "--net", "--quality-budget", "--error-budget",
                                                 "--gen-len", "--name"]), _words), max_size=3)


def _check_cli(runner, tmp: Path, opts: list[tuple[str, str]]) -> None:
    """``plan`` (then ``export`` and ``check`` of what it wrote) with fuzzed options: exit 0, 1 or 2, no traceback."""
    args = ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len",
            "2048", "--top", "1", "--json", "--out", str(tmp / "p.yaml")]
    for k, v in opts:
        args += [k, v]
    COUNTS["CLI option sets"] += 1
    res = runner.invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    assert res.exit_code in (0, 2), (args, res.output)
    if res.exit_code == 0:
        for target in ("torchrun", "megatron", "deepspeed", "torchtitan", "accelerate", "slurm", "kubeflow"):
            r = runner.invoke(app, ["export", str(tmp / "p.yaml"), "--to", target, "--json"])
            assert r.exception is None or isinstance(r.exception, SystemExit), (target, repr(r.exception))
            assert r.exit_code in (0, 2), (target, r.output)
    r = runner.invoke(app, ["check", str(tmp / "p.yaml"), str(tmp), "--tolerance", opts[0][1] if opts else "x"])
    assert r.exception is None or isinstance(r.exception, SystemExit) and r.exit_code == 2, repr(r.exception)
    COUNTS["CLI ran" if res.exit_code == 0 else "CLI refused cleanly"] += 1


@pytest.fixture(scope="module", autouse=True)
def _print_counts():
    yield
    print("\ninput fuzz counts:", dict(sorted(COUNTS.items())))


_TARGETS = {"config.json": (_configs, _check_config), "cluster YAML": (_cluster_files, _check_cluster_file),
            "plan file": (_plan_files, _check_plan_file), "strings": (lambda: _words, None)}


def _fuzz(target: str, how: settings, tmp_path_factory) -> None:
    strategy, check = _TARGETS[target]

    @how
    @given(text=strategy())
    def run(text):
        if check is None:
            _check_strings(text)
        else:
            check(tmp_path_factory.mktemp("f"), text)

    run()


@pytest.mark.parametrize("target", list(_TARGETS))
def test_fuzz_inputs(target, tmp_path_factory):
    _fuzz(target, _FAST, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("target", list(_TARGETS))
def test_fuzz_inputs_long(target, tmp_path_factory):
    _fuzz(target, _LONG, tmp_path_factory)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(opts=_plan_opts)
def test_fuzz_cli_options(runner, tmp_path_factory, opts):
    _check_cli(runner, tmp_path_factory.mktemp("o"), opts)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(opts=_plan_opts)
def test_fuzz_cli_options_long(runner, tmp_path_factory, opts):
    _check_cli(runner, tmp_path_factory.mktemp("o"), opts)


def test_yaml_alias_bombs_and_huge_files_are_refused(tmp_path, runner):
    """Nested aliases ("billion laughs": 9 levels of 9 references = 387M leaves once walked) and a file past the
    byte budget end in one line, exit 2, at once (issue 16 item 2)."""
    from meshplan.core.yamlio import MAX_YAML_BYTES

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    (tmp_path / "bomb.yaml").write_text(bomb)
    big = tmp_path / "big.yaml"
    with big.open("w") as fh:
        fh.write("notes:\n")
        line = "- " + "x" * 1000 + "\n"
        for _ in range(MAX_YAML_BYTES // len(line) + 1):
            fh.write(line)
    for path, needle in ((tmp_path / "bomb.yaml", "aliases"), (big, "larger than")):
        r = runner.invoke(app, ["export", str(path), "--to", "torchrun"])
        assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
        r = runner.invoke(app, ["devices", "cluster", str(path)])
        assert r.exit_code == 2 and needle in r.output, r.output


@pytest.mark.parametrize("key,value,needle", [("hidden_size", 5_000_000_000, "'hidden_size' must be at most 1048576"),
                                              ("num_hidden_layers", "32", "'num_hidden_layers' must be an integer"),
                                              ("rope_theta", float("inf"), "rope_theta: inf is not a finite number"),
                                              ("vocab_size", 0, "'vocab_size' must be an integer >= 1")])
def test_config_json_is_typed_at_the_edge(tmp_path, runner, key, value, needle):
    """planner/model/hf_config.py: the keys meshplan reads have types and the bounds of real models; one line,
    exit 2."""
    cfg = json.loads(CONFIG.read_text())
    cfg[key] = value
    cfg["some_key_meshplan_never_reads"] = {"nested": [1, 2]}  # passes through
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = runner.invoke(app, ["models", "show", str(tmp_path / "config.json")])
    if r.exit_code != 2:  # `models show` may not take a path: plan reads it the same way
        r = runner.invoke(app, ["plan", "--model", str(tmp_path / "config.json"), "--cluster", "8xH100",
                                "--global-batch", "8", "--seq-len", "512", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_cost_model_metadata_is_typed_at_the_edge(tmp_path, runner):
    """A model folder whose metadata points a kind at a file outside the folder, or holds a non-object: refused in
    one line naming metadata.json and the key (it was a KeyError / a path out of the folder)."""
    import shutil

    src = REPO / "costmodel" / "data" / "model"
    for mutate, needle in ((lambda m: m["kinds"][next(iter(m["kinds"]))].update(file="../../etc/passwd"), "kinds."),
                           (lambda m: m.update(kinds=["matmul"]), "kinds"),
                           (lambda m: m.update(features="x"), "features")):
        dest = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        shutil.copytree(src, dest)
        meta = json.loads((dest / "metadata.json").read_text())
        mutate(meta)
        (dest / "metadata.json").write_text(json.dumps(meta))
        r = runner.invoke(app, ["costmodel", "predict", "--op", "matmul", "--shape", "64x64x64", "--device", "H100",
                                "--model", str(dest)])
        assert r.exit_code == 2 and "metadata.json" in r.output and needle in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1


# ---- generated from the option definitions: every int/float option of every command, every output flag ----------

def _commands():
    """(command words, click command) for every leaf command of the Typer app."""
    import typer

    out, todo = [], [((), typer.main.get_command(app))]
    while todo:
        words, cmd = todo.pop()
        subs = getattr(cmd, "commands", None)
        if subs:
            todo.extend((words + (n,), c) for n, c in subs.items())
        else:
            out.append((words, cmd))
    return sorted(out, key=lambda wc: wc[0])


def _numeric_options() -> list[tuple[tuple[str, ...], str, type]]:
    """(command words, option, int or float) of every numeric option (Typer's declared annotation, unwrapped from
    Optional)."""
    kinds = {"int": int, "float": float}
    return [(w, p.opts[0], kinds[str(p.bare_type())]) for w, c in _commands() for p in c.params
            if p.opts[0].startswith("--") and str(p.bare_type()) in kinds and not getattr(p, "is_flag", False)]


def _bases(tmp: Path) -> dict[tuple[str, ...], list[str]]:
    """A valid (and quick) invocation of each command the numeric or output options belong to; a command's own
    bad options are added after it. ``profile`` names a script that does not exist: it must refuse before launching."""
    from tests.helpers import DATA

    plan = str(REPO / "plans" / "llama-3.1-8b.yaml")
    return {
        ("plan",): ["plan", "-m", "llama-3.1-8b", "-c", "1x8xH100", "-b", "64", "-s", "2048", "--top", "1", "--json",
                    "--out", str(tmp / "p.yaml")],
        ("export",): ["export", plan, "--to", "torchrun"],
        ("check",): ["check", plan, str(tmp / "run"), "--no-breakdown"],
        ("replay",): ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--json", "--no-cache"],
        ("profile",): ["profile", "--out", str(tmp / "prof"), str(tmp / "no_such_script.py")],
        ("models", "show"): ["models", "show", "llama-3.1-8b"],
        ("costmodel", "collect"): ["costmodel", "collect", "--out", str(tmp / "c"), "--quick"],
        ("costmodel", "train"): ["costmodel", "train", "--out", str(tmp / "m"), "--data", str(tmp / "nodata")],
        ("costmodel", "predict"): ["costmodel", "predict", "--op", "allreduce", "--shape", "1048576", "--device",
                                   "H100"],
    }


# Values generated for a numeric option: its edges (0, -1) and beyond any count, as text; floats add inf/nan.
_INT_VALUES = st.one_of(st.sampled_from(["0", "-1", "-5", str(2**40 + 1), str(2**63), "1" + "0" * 30, "x", ""]),
                        st.integers(-10**6, 0).map(str), st.integers(2**40 + 1, 2**70).map(str))
_FLOAT_VALUES = st.one_of(_INT_VALUES, st.sampled_from(["inf", "-inf", "nan", "1e309", "-0.5", "1e-400"]),
                          st.floats(allow_nan=True, allow_infinity=True).map(repr))


class _Hang(Exception):
    pass


def _invoke_bounded(runner, args: list[str], seconds: int = 60):
    """``runner.invoke`` that fails the test after ``seconds`` (a hang, as ``train --rounds 0`` was)."""
    import signal

    def _alarm(_sig, _frame):
        raise _Hang(" ".join(args))

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        return runner.invoke(app, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _ends_cleanly(res, args: list[str], target: str) -> None:
    """Exit 0, or 2 with one ``error:`` line or Typer's usage box (a value outside an option's range); no
    traceback, no hang."""
    assert not isinstance(res.exception, _Hang), f"hung: {args}"
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    assert res.exit_code in (0, 2), (args, res.exit_code, res.output[-2000:])
    COUNTS[f"{target} cases"] += 1
    if res.exit_code == 0:
        COUNTS[f"{target} ran"] += 1
        return
    lines = res.output.strip().splitlines()
    one_line = len(lines) == 1 and lines[0].startswith("error:")
    assert one_line or "Usage:" in res.output, (args, res.output[-2000:])
    COUNTS[f"{target} refused cleanly"] += 1


def test_numeric_options_are_found():
    """The walk sees every command's numeric options (a command added later is fuzzed without editing this)."""
    found = {(w, o) for w, o, _t in _numeric_options()}
    assert {(("plan",), "--gen-len"), (("costmodel", "train"), "--rounds"), (("costmodel", "collect"), "--repeats"),
            (("costmodel", "predict"), "--group-size"), (("plan",), "--quality-budget")} <= found
    assert {w for w, _o in found} <= set(_bases(Path("/x"))), "a command with numeric options has no base call"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_fuzz_numeric_options_from_definitions(runner, tmp_path_factory, data):
    words, opt, typ = data.draw(st.sampled_from(_numeric_options()))
    value = data.draw(_FLOAT_VALUES if typ is float else _INT_VALUES)
    tmp = tmp_path_factory.mktemp("n")
    args = _bases(tmp)[words] + [opt, value]
    _ends_cleanly(_invoke_bounded(runner, args), args, "numeric option")


def test_every_numeric_option_at_zero_and_negative(runner, tmp_path):
    """Each numeric option at 0 and -1 (counts of zero or less mean nothing): refused, or a result where 0 is a
    real value (a rank, a step, a budget)."""
    for words, opt, _typ in _numeric_options():
        for value in ("0", "-1"):
            args = _bases(tmp_path)[words] + [opt, value]
            _ends_cleanly(_invoke_bounded(runner, args), args, "numeric option at 0/-1")


_OUTPUT_NAMES = ("out", "junit", "summary", "timeline")
_FOLDER_OUTPUTS = {("profile",), ("costmodel", "collect"), ("costmodel", "train"), ("costmodel", "fit")}


def _output_flags() -> list[tuple[tuple[str, ...], str]]:
    return [(w, p.opts[0]) for w, c in _commands() for p in c.params
            if p.name in _OUTPUT_NAMES and str(p.bare_type()) == "Path" and w in _bases(Path("/x"))]


def _bad_outputs(tmp: Path, words: tuple[str, ...], base: list[str]) -> dict[str, str]:
    """Where an output must not go: a folder (for a file output), a path under a regular file, a file in a
    read-only folder, and the command's own input. Tests run as root, where chmod does not stop a write: /proc
    refuses new files to root too, so a path there is the read-only folder."""
    (tmp / "afile").write_text("x")
    own_input = next((a for a in base[len(words):] if not a.startswith("-") and Path(a).exists()), None)
    bad = {"under a file": str(tmp / "afile" / "out"), "read-only folder": "/proc/meshplan-fuzz-out"}
    if words not in _FOLDER_OUTPUTS:
        (tmp / "adir").mkdir(exist_ok=True)
        bad["a folder"] = str(tmp / "adir")
    if own_input:
        bad["its own input"] = own_input
    return bad


def test_every_output_flag_at_bad_places(runner, tmp_path):
    """Every output flag of the commands above at each bad place: one line naming the path, exit 2, nothing
    written over an input."""
    from tests.test_check import _plan as make_plan
    from tests.test_check import _run as make_run

    flags = _output_flags()
    assert {(("plan",), "--out"), (("export",), "--out"), (("check",), "--summary"), (("check",), "--junit"),
            (("replay",), "--timeline")} <= set(flags)
    for words, flag in flags:
        tmp = tmp_path / "_".join(words + (flag.strip("-"),))
        tmp.mkdir()
        base = _bases(tmp)[words]
        if words == ("check",):  # a run of the plan to check
            plan = make_plan(tmp)
            make_run(tmp, {"0": [0.2] * 5, "1": [0.2] * 5}, plan=plan)
            base = ["check", str(plan), str(tmp / "run"), "--no-breakdown"]
        base = [a for i, a in enumerate(base) if not (a == flag or (i and base[i - 1] == flag))]
        for place, path in _bad_outputs(tmp, words, base).items():
            before = Path(path).read_bytes() if Path(path).is_file() else None
            args = base + [flag, path]
            res = _invoke_bounded(runner, args, 120)
            assert res.exit_code == 2, (place, args, res.output[-2000:])
            _ends_cleanly(res, args, f"output flag at {place}")
            if before is not None:
                assert Path(path).read_bytes() == before, (place, args)
