import json
import os
import shutil
import tempfile
from pathlib import Path

# The suite must stay within 10 minutes on 2 cores beside another job. OpenMP's default wait policy keeps a thread
# that waits at a barrier spinning, and this process holds two OpenMP runtimes (PyTorch's libgomp and the one XGBoost
# bundles): beside two busy processes their spinning threads took the cores the working ones waited for. The suite
# took 858 s there against 368 s alone; test_neusight_gemm_unseen_h100_quick 38.8 s after a torch test, 8.4 s with
# waiting threads put to sleep. One PyTorch intra-op thread (what torchrun gives each worker) then took the suite to
# 555 s beside the two busy processes and 356 s alone: its ops here are small, and a second thread only contends
# (BENCHMARKS.md, "The suite on a shared 2-core host"). XGBoost's training sets its own thread count. Both are read
# once, when each runtime loads, so they are set before torch or xgboost is imported; every process the tests start
# (the CLI, torchrun workers) inherits them. A value the caller set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="session", autouse=True)
def private_cache():
    """The suite never reads or writes the user's cache (``MESHPLAN_CACHE``, by default ~/.cache/meshplan): a
    calibration or fitted host terms left there by earlier work must not decide what the tests see. One private
    folder per session (not under pytest's basetemp, which other pytest sessions prune while this one runs)."""
    cache = Path(tempfile.mkdtemp(prefix="meshplan-test-cache-"))
    old = os.environ.get("MESHPLAN_CACHE")
    os.environ["MESHPLAN_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("MESHPLAN_CACHE", None)
    else:
        os.environ["MESHPLAN_CACHE"] = old
    shutil.rmtree(cache, ignore_errors=True)


# The worker processes of one run (pytest-xdist) share one calibration: the first to need it measures, the others
# wait and copy it (below). Made by the controlling process before its workers start, which inherit the variable.
SHARED_ENV = "MESHPLAN_TEST_SHARED"
CALIBRATION_FILE = "calibration-cpu.json"  # what ``devices calibrate`` caches (planner.host.calibrate)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controlling process (or the only one, under -n 0)
        config._meshplan_shared = tempfile.mkdtemp(prefix="meshplan-test-shared-")
        os.environ[SHARED_ENV] = config._meshplan_shared


def pytest_unconfigure(config):
    shared = getattr(config, "_meshplan_shared", None)
    if shared:
        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop(SHARED_ENV, None)


@pytest.fixture(scope="session")
def host_calibration(private_cache):
    """One real calibration of this host for ``local:N`` (GEMM, copy, 2- and 4-process gloo) through the CLI, shared
    by every test that plans on ``local:N``: (cache folder, the calibration as ``devices calibrate --json`` prints
    it). The ``--quick`` calibration (one launch per table, fewer calls: 34 s on a quiet 2-core host instead of 121 s):
    the tests assert what holds at any host speed, the accuracy figures are bench/closed_loop.py's, which
    calibrates in full. One measurement for the whole run: the first worker process to need it calibrates under a
    lock and leaves the cached file and the printed JSON in the run's shared folder; the others copy them into
    their own cache (two workers calibrating at once on a 2-core host would each measure the other's load)."""
    import fcntl

    from meshplan.cli.main import app

    shared = Path(os.environ[SHARED_ENV])
    with open(shared / "calibration.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        printed, cached = shared / "calibrate.json", shared / CALIBRATION_FILE
        if not printed.is_file():
            res = CliRunner().invoke(app, ["devices", "calibrate", "--json", "--quick"])
            assert res.exit_code == 0, res.output
            shutil.copyfile(private_cache / CALIBRATION_FILE, cached)
            printed.write_text(res.output)
        shutil.copyfile(cached, private_cache / CALIBRATION_FILE)
        return private_cache, json.loads(printed.read_text())
