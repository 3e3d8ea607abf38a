import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner


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


@pytest.fixture(scope="session")
def host_calibration(private_cache):
    """One real calibration of this host for ``local:N`` (GEMM, copy, 2- and 4-process gloo) through the CLI, shared
    by every test that plans on ``local:N``: (cache folder, the calibration as ``devices calibrate --json`` prints
    it). The ``--quick`` calibration (one launch per table, fewer calls: 34 s on a quiet 2-core host instead of 121 s):
    the tests assert what holds at any host speed, the accuracy figures are bench/closed_loop.py's, which
    calibrates in full."""
    from meshplan.cli.main import app

    res = CliRunner().invoke(app, ["devices", "calibrate", "--json", "--quick"])
    assert res.exit_code == 0, res.output
    return private_cache, json.loads(res.output)
