"""Fuzz suite (hypothesis) of the trace reader, the run.json reader and the replay command's options.

Every input must end in a result (exit 0) or a clean refusal (:class:`MeshplanError`, exit 2): never a traceback.
The default run tries a few dozen inputs per target (seconds); ``-m slow`` runs thousands. Each target counts
what it tried; ``pytest -s`` prints the counts (BENCHMARKS.md records a long run).
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.profiler.capture import load_run_json
from meshplan.profiler.runs import load_run
from tests.helpers import DATA, data_path

COUNTS: Counter = Counter()
_FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
_LONG = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# Values a hostile or broken producer could put in any field.
# Edges of the bounds in core.bounds: integers of 1,000 digits, nesting 100 deep.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True,
                     allow_infinity=True), st.text(max_size=12),
                     st.sampled_from(["many", "1e8", "-3", "", "[0, 1]", "train.py --plan 'p.yaml"]),
                     st.sampled_from([10**1000, -(10**1000), json.loads("[" * 100 + "]" * 100)]))
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c,
                                                                                                max_size=4)),
                       max_leaves=12)
_FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
_ARGS = ["correlation", "stream", "Input Dims", "Input type", "Collective name", "In msg nelems", "Process Group Name",
         "Process Group Ranks", "Seq", "dtype", "Concrete Inputs", "cuda_sync_kind", "wait_on_stream"]
_HEADER = ["distributedInfo", "baseTimeNanoseconds", "deviceProperties", "host_name", "INFO", "traceEvents"]


def _base_doc() -> dict:
    src = data_path("traces", "external", "hta_cuda_event_sync_a100", "event_sync_trace.json.gz")
    return json.loads(gzip.decompress(src.read_bytes()))


@st.composite
def _mutated_traces(draw) -> str:
    doc = _base_doc()
    evs = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["event", "arg", "header", "dist", "drop", "dup"]))
        i = draw(st.integers(0, len(evs) - 1))
        if what == "event":
            evs[i][draw(st.sampled_from(_FIELDS))] = draw(_values)
        elif what == "arg":
            if isinstance(evs[i].get("args"), dict):
                evs[i]["args"][draw(st.sampled_from(_ARGS))] = draw(_values)
        elif what == "header":
            doc[draw(st.sampled_from(_HEADER))] = draw(_values)
        elif what == "dist":
            doc["distributedInfo"] = draw(st.dictionaries(st.sampled_from(["rank", "world_size", "pg_config",
                                                                           "backend"]), _values, max_size=4))
        elif what == "drop":
            evs.pop(i)
        else:
            evs.append(dict(evs[i]))
    text = json.dumps(doc, allow_nan=True)
    if draw(st.booleans()):  # also cut the text short sometimes
        text = text[:draw(st.integers(0, len(text)))]
    return text


def _check_trace(tmp: Path, text: str) -> None:
    p = tmp / "rank0.trace.json"
    p.write_text(text)
    COUNTS["trace inputs"] += 1
    try:
        load_run(p, workers=1)
        COUNTS["trace loaded"] += 1
    except MeshplanError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2000
        COUNTS["trace refused cleanly"] += 1


@st.composite
def _run_records(draw) -> str:
    run = {"format": "meshplan-run/1", "world_size": 2, "backend": "gloo",
           "step_times_s": {"0": [0.1, 0.11], "1": [0.1, 0.12]},
           "traces": {"0": "rank0.trace.json.gz", "1": "rank1.trace.json.gz"}}
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(list(run) + ["unprofiled_step_times_s", "hostnames", "pinned_cores",
                                                "peak_memory_bytes", "warmup_steps_skipped", "argv", "plan",
                                                "plan_copy", "pinned", "max_rss_bytes", "nproc_per_node"]))
        run[key] = draw(_values)
    return json.dumps(run, allow_nan=True)


def _check_run_json(tmp: Path, text: str) -> None:
    (tmp / "run.json").write_text(text)
    COUNTS["run.json inputs"] += 1
    try:
        load_run_json(tmp)
        COUNTS["run.json accepted"] += 1
    except MeshplanError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2000
        COUNTS["run.json refused cleanly"] += 1


_opt_values = st.one_of(st.text(max_size=14), st.sampled_from(["0", "-3", "99999", "1e9", "inf", "nan", "0-1",
                                                               "1,0", "compute=inf", "name~x=2", "optimizer"]))
_options = st.lists(st.tuples(st.sampled_from(["--what-if", "--step", "--ranks", "--steps-at", "--fit-steps",
                                               "--workers", "--timeline-format"]), _opt_values), max_size=3)


def _check_cli(runner, opts: list[tuple[str, str]]) -> None:
    args = ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--json"]
    for k, v in opts:
        args += [k, v]
    COUNTS["replay option sets"] += 1
    res = runner.invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    assert res.exit_code in (0, 2), (args, res.output)
    COUNTS["replay ran" if res.exit_code == 0 else "replay refused cleanly"] += 1


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module", autouse=True)
def _print_counts():
    yield
    print("\nfuzz counts:", dict(sorted(COUNTS.items())))


@_FAST
@given(text=_mutated_traces())
def test_fuzz_trace_reader(tmp_path_factory, text):
    _check_trace(tmp_path_factory.mktemp("f"), text)


@_FAST
@given(text=_run_records())
def test_fuzz_run_json(tmp_path_factory, text):
    _check_run_json(tmp_path_factory.mktemp("r"), text)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(opts=_options)
def test_fuzz_replay_options(runner, opts):
    _check_cli(runner, opts)


@pytest.mark.slow
@_LONG
@given(text=_mutated_traces())
def test_fuzz_trace_reader_long(tmp_path_factory, text):
    _check_trace(tmp_path_factory.mktemp("f"), text)


@pytest.mark.slow
@_LONG
@given(text=_run_records())
def test_fuzz_run_json_long(tmp_path_factory, text):
    _check_run_json(tmp_path_factory.mktemp("r"), text)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(opts=_options)
def test_fuzz_replay_options_long(runner, opts):
    _check_cli(runner, opts)
