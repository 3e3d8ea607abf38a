"""Read Megatron-Bridge's performance presets (``scripts/performance/configs/*/*workload_base_configs.py``) at the
tags behind the ``megatron-bridge-perf`` stack profiles, into ``presets/stacks/workloads/<profile>.yaml``.

    python -m meshplan.planner.search.workloads_extract BRIDGE_GIT_DIR

``BRIDGE_GIT_DIR``: a clone (or bare mirror) of NVIDIA-NeMo/Megatron-Bridge holding the tags of ``TAGS``. Each
preset file is evaluated with its imports replaced by a recorder of keyword arguments, so a preset keeps exactly the
fields its file sets (``dataclasses.replace`` chains included) and nothing of Bridge's code runs. A preset of a
model meshplan does not bundle (``MODELS``) or a name in neither naming scheme is left out and counted.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import yaml

# profile version -> the tag it was read at. 25.09's r0.1.0 kept its presets as YAML perf matrices
# (``read_perf_matrix``), the later tags as workload configs.
TAGS = {"25.09": "r0.1.0", "25.11": "v0.2.0", "26.02": "v0.3.0", "26.02.01": "v0.3.1", "26.04": "v0.4.0",
        "26.04.01": "v0.4.2", "26.06": "v0.5.0", "26.06.01": "v0.5.1"}

# Bridge's model recipe name (upper case, as in a preset's name) -> meshplan's bundled model of the same shapes
MODELS = {"DEEPSEEK_V3": "deepseek-v3", "KIMI_K2": "kimi-k2", "QWEN3_30B_A3B": "qwen3-30b-a3b",
          "QWEN3_235B_A22B": "qwen3-235b-a22b", "QWEN3_NEXT_80B_A3B": "qwen3-next-80b-a3b",
          "LLAMA3_8B": "llama-3.1-8b-instruct", "LLAMA3_70B": "llama-3.1-70b-instruct",
          "LLAMA31_405B": "llama-3.1-405b", "GPT_OSS_120B": "gpt-oss-120b", "GPT_OSS_20B": "gpt-oss-20b",
          "NEMOTRONH_56B": "nemotron-h-56b", "NEMOTRON_3_NANO": "nemotron-3-nano-30b-a3b",
          "NEMOTRON_3_SUPER": "nemotron-3-super-120b-a12b", "NEMOTRON_3_ULTRA": "nemotron-3-ultra-550b-a55b"}
# r0.1.0's perf-matrix keys -> WorkloadBaseConfig's field names (what ``workloads`` reads); the rest keep their own
PERF_MATRIX_FIELDS = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
                      "cp": "context_parallel_size", "vp": "virtual_pipeline_model_parallel_size",
                      "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size",
                      "mbs": "micro_batch_size", "gbs": "global_batch_size", "fsdp": "use_megatron_fsdp"}
GPUS = {"GB300": "GB300", "GB200": "GB200", "B300": "B300", "B200": "B200", "H100": "H100-SXM"}
DTYPES = ("BF16", "FP8_CS", "FP8_MX", "FP8_DS", "FP8_SC", "NVFP4")
# r0.1.0's --compute_dtype / --fp8_recipe pairs (argument_parser.py: bf16 or fp8 with ds, cs, mx or ss)
R010_DTYPES = ("bf16", "fp8_ds", "fp8_cs", "fp8_mx", "fp8_ss")
_DT = "|".join(DTYPES)
_GPU = "|".join(GPUS) + "|VR200|R200"
# v0.3.0 on: get_workload_base_config's {model_recipe_name}_{task}_config_{gpu}_{compute_dtype}[_{variant}]
NEW_NAME = re.compile(rf"^(?P<model>[A-Z0-9_]+?)_(?P<task>PRETRAIN|SFT|LORA)_CONFIG_(?P<gpu>{_GPU})_(?P<dtype>{_DT})"
                      r"(?:_(?P<variant>V\d+|LARGE_SCALE|GBS\d+))?$")
# v0.2.0: {model_name}_{model_size}_{gpu}[_{task}]_{compute_dtype}_BASE_CONFIG, pre-training without a task
OLD_NAME = re.compile(rf"^(?P<model>[A-Z0-9_]+?)_(?P<gpu>{_GPU})(?:_(?P<task>SFT|LORA))?_(?P<dtype>{_DT})_BASE_CONFIG$")


class _Preset(dict):
    """The keyword arguments a preset file passes, accumulated along ``replace`` chains."""


def _replace(base, **changes):
    return _Preset({**base, **changes})


def read_presets(source: str) -> dict[str, tuple[dict, int]]:
    """{name: (fields set, line)} of every module-level preset in one workload file's ``source``."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    scope = {"WorkloadBaseConfig": lambda **kw: _Preset(kw), "replace": _replace}
    exec(compile(tree, "<workload>", "exec"), scope)  # noqa: S102 - the file's assignments only, imports removed
    lines = {t.id: n.lineno for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
             if isinstance(t, ast.Name)}
    return {k: (dict(v), lines.get(k, 0)) for k, v in scope.items() if isinstance(v, _Preset)}


# A performance script's recipe function: {recipe}_{task}_config_{gpu} (``configs/qwen/qwen3_llm_pretrain.py``)
RECIPE_FUNCTION = re.compile(r"^(?P<model>[a-z0-9_]+?)_(?P<task>pretrain|sft|lora)_config_(?P<gpu>[a-z0-9]+)$")


def read_dispatcher_types(source: str) -> dict[tuple[str, str, str], tuple[str, int]]:
    """{(model, task, gpu) in preset-name case: (dispatcher type, line)} of the recipe functions in one performance
    script's ``source`` that end by setting ``cfg.model.moe_token_dispatcher_type`` to a literal with no
    ``apply_flex_dispatcher_backend`` call after it: Megatron-Core then runs that dispatcher whatever flex backend the
    workload preset names (``moe_flex_dispatcher_backend`` is read only under the "flex" type), as Qwen3 235B's B300
    and B200 functions set "alltoall" at v0.3.1 and v0.4.0."""
    out = {}
    for fn in ast.parse(source).body:
        m = RECIPE_FUNCTION.match(fn.name) if isinstance(fn, ast.FunctionDef) else None
        if m is None:
            continue
        last = None  # (type, line) of the function's last dispatcher assignment, unless a flex call follows it
        for node in ast.walk(fn):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and any(ast.unparse(t) == "cfg.model.moe_token_dispatcher_type" for t in node.targets)):
                if last is None or node.lineno > last[1]:
                    last = (str(node.value.value), node.lineno)
        flex_calls = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call)
                      and ast.unparse(n.func).endswith("apply_flex_dispatcher_backend")]
        if last and not any(line > last[1] for line in flex_calls):
            out[m["model"].upper(), m["task"], m["gpu"].upper()] = last
    return out


def parse_name(name: str) -> dict | None:
    """(model, task, gpu, dtype, variant) of a preset's name in either naming scheme; None for a base preset."""
    m = NEW_NAME.match(name) or OLD_NAME.match(name)
    if m is None:
        return None
    d = m.groupdict()
    return {"model": d["model"], "task": (d.get("task") or "PRETRAIN").lower(), "gpu": d["gpu"],
            "dtype": d["dtype"].lower(), "variant": (d.get("variant") or "").lower()}


def read_perf_matrix(source: str) -> list[tuple[str, dict, int, str, str]]:
    """(name, fields, line, gpu, dtype) of every launch an r0.1.0 perf matrix holds: ``perf_matrix.<gpu>.num_gpus_<N>``
    with its ``common`` block merged under each precision's (utils/helpers.py apply_perf_matrix_overrides @ r0.1.0:
    the dtype's block, when present, deep-merged over common), for every precision the launcher takes, keys renamed
    to WorkloadBaseConfig's (``PERF_MATRIX_FIELDS``) and ``num_gpus`` from the entry's key."""
    data = yaml.safe_load(source).get("perf_matrix") or {}
    lines = {}  # (gpu, num_gpus_N) -> the entry's line, from the composed nodes
    for key, value in yaml.compose(source).value:
        if key.value == "perf_matrix":
            for gpu_key, gpu_node in value.value:
                lines |= {(gpu_key.value, k.value): k.start_mark.line + 1 for k, _ in gpu_node.value}
    out = []
    for gpu, entries in data.items():
        for entry, blocks in entries.items():
            for dtype in R010_DTYPES:
                merged = {**(blocks.get("common") or {}), **(blocks.get(dtype) or {})}
                fields = {PERF_MATRIX_FIELDS.get(k, k): v for k, v in merged.items()}
                out.append((f"perf_matrix.{gpu}.{entry}.{dtype}",
                            {"num_gpus": int(entry.removeprefix("num_gpus_")), **fields},
                            lines[gpu, entry], gpu.upper(), dtype))
    return out


def _r010_presets(git_dir: Path, tag: str) -> tuple[list[dict], int]:
    """The presets of r0.1.0's perf matrices (``configs/<family>/<recipe>_llm_pretrain.yaml``: pre-training only)."""
    presets, skipped = [], 0
    for path in _git(git_dir, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs").split():
        model = Path(path).name.removesuffix("_llm_pretrain.yaml").upper()
        for name, fields, line, gpu, dtype in read_perf_matrix(_git(git_dir, "show", f"{tag}:{path}")):
            if model not in MODELS or gpu not in GPUS:
                skipped += 1
                continue
            presets.append({"name": name, "file": path, "line": line, "model": MODELS[model], "task": "pretrain",
                            "gpu": GPUS[gpu], "dtype": dtype, "variant": "", "settings": dict(sorted(fields.items()))})
    return presets, skipped


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True,
                          text=True).stdout


def extract(git_dir: Path, version: str) -> dict:
    """The workloads file of ``megatron-bridge-perf@version``."""
    tag = TAGS[version]
    commit = _git(git_dir, "rev-parse", f"{tag}^{{commit}}").strip()
    listed = _git(git_dir, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs").split()
    files = [f for f in listed if f.endswith("workload_base_configs.py")]
    presets, skipped = _r010_presets(git_dir, tag) if tag == "r0.1.0" else ([], 0)
    forced = {}  # (model, task, gpu) -> the dispatcher its recipe function sets last, where and on which line
    for path in listed:
        if path.endswith(("_llm_pretrain.py", "_llm_finetune.py")):
            for key, (kind, line) in read_dispatcher_types(_git(git_dir, "show", f"{tag}:{path}")).items():
                forced[key] = {"type": kind, "file": path, "line": line}
    for path in files:
        for name, (fields, line) in read_presets(_git(git_dir, "show", f"{tag}:{path}")).items():
            parsed = parse_name(name)
            if parsed is None:
                continue
            if parsed["model"] not in MODELS or parsed["gpu"] not in GPUS:
                skipped += 1
                continue
            preset = {"name": name, "file": path, "line": line, **parsed,
                      "model": MODELS[parsed["model"]], "gpu": GPUS[parsed["gpu"]],
                      "settings": {k: v for k, v in sorted(fields.items())}}
            said = forced.get((parsed["model"], parsed["task"], parsed["gpu"]))
            if said:
                preset["recipe_dispatcher"] = said
            presets.append(preset)
    presets.sort(key=lambda p: (p["model"], p["task"], p["gpu"], p["dtype"], p["variant"]))
    return {"profile": f"megatron-bridge-perf@{version}",
            "source": f"NVIDIA-NeMo/Megatron-Bridge @ {tag} ({commit[:9]}), scripts/performance/configs: each preset's "
                      "fields as its file sets them (read by meshplan.planner.search.workloads_extract)",
            "default_variant": "v2",
            "default_variant_source": {"r0.1.0": "r0.1.0's perf matrices carry no variant (utils/common.py "
                                                 "get_perf_matrix_overrides: one entry per GPU and GPU count)",
                                       "v0.2.0": "v0.2.0 names carry no variant (utils/utils.py "
                                                 "get_workload_base_config)"}.get(
                tag, f"scripts/performance/argument_parser.py @ {tag}: --config_variant defaults to 'v2', and "
                     "utils/utils.py get_workload_base_config falls back to 'v1', then to the unversioned name"),
            "left_out": skipped,
            "presets": presets}


class _NoAliases(yaml.SafeDumper):
    """Every preset written out in full (no YAML anchors between presets that share a list)."""

    def ignore_aliases(self, data) -> bool:
        return True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m meshplan.planner.search.workloads_extract BRIDGE_GIT_DIR", file=sys.stderr)
        return 2
    git_dir = Path(argv[0])
    out = Path(__file__).resolve().parent.parent / "presets" / "stacks" / "workloads"
    out.mkdir(exist_ok=True)
    for version in TAGS:
        data = extract(git_dir, version)
        (out / f"{data['profile']}.yaml").write_text(yaml.dump(data, Dumper=_NoAliases, sort_keys=False,
                                                               width=120), encoding="utf-8")
        print(f"{data['profile']}: {len(data['presets'])} presets ({data['left_out']} of models meshplan lacks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
