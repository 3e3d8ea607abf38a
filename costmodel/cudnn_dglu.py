"""The fused grouped MLP's backward dGLU kernel by cuDNN frontend release, from cuDNN frontend's own timings.

Under Megatron-Core's fused grouped MLP (``moe_fused_mlp``) the input gradient of fc2 runs as cuDNN frontend's
block-scaled grouped GEMM with the gated activation's backward in its epilogue (``grouped_gemm_dglu_wrapper_sm100``);
for experts with biases (GPT-OSS) the same epilogue reduces fc1's bias gradient (``generate_dbias``). The estimator
prices that GEMM as the backward of fc2's grouped GEMM, from cuDNN frontend's MoE benchmark at 1.23.0
(``costmodel.blackwell_grouped``: the plain dGLU kernel). Two facts move it, both timed by cuDNN frontend's
developers on one SM100 shape (``costmodel/data/published/cudnn_dglu_dbias.json``, PR #322):

- the bias gradient costs the kernel 155.632 / 138.960 us once fixed;
- releases 1.24.0 to 1.25.x compile the dbias reduction loop into a path that spills to local memory (issue #256,
  "10x slower" on GPT-OSS-20B's dGeGLU workload): 1362.768 us with it, against 139.392 without.

``dgrad_multiple`` is the kernel's time under a release, with or without the bias gradient, over the plain fixed
kernel's: what the estimator multiplies fc2's input-gradient GEMM by (``planner.estimate.gpu``). The releases are
named by the decision ``cudnn_frontend`` a stack profile pins (Megatron-Bridge v0.5.1's ``pyproject.toml``:
``nvidia-cudnn-frontend==1.24.0``).
"""
from __future__ import annotations

from meshplan.costmodel.measured import published_file

DATA_FILE = "cudnn_dglu_dbias.json"  # in costmodel/data/published
# Each release line the decision names -> the build of the pull request's table it runs: 1.23 (and the releases
# after the fix) the fixed kernel, 1.24 and 1.25 (issue #256: "The regression persists in v1.25.0") the one before it
BUILD_OF_RELEASE = {"1.23": "after", "1.24": "before", "1.25": "before"}
SOURCE = ("cuDNN frontend PR #322's SM100 timing of the grouped GEMM + dGLU kernel with and without the bias "
          "gradient, before and after its fix (issue #256: releases 1.24.0-1.25.x)")


def _median_us(build: str, dbias: bool) -> float:
    rows = published_file(DATA_FILE)["rows"]
    return next(r["median_us"] for r in rows if r["build"] == build and r["generate_dbias"] == dbias)


def dgrad_multiple(release: str, dbias: bool) -> float:
    """The dGLU kernel's time under cuDNN frontend ``release`` (``BUILD_OF_RELEASE``), with the bias gradient or not,
    over the fixed kernel's without it (what the estimator's grouped GEMM price stands for)."""
    if release not in BUILD_OF_RELEASE:
        raise ValueError(f"cuDNN frontend release {release!r}: known {', '.join(BUILD_OF_RELEASE)}")
    return _median_us(BUILD_OF_RELEASE[release], dbias) / _median_us("after", False)
