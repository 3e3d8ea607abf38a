"""Stack profiles (``planner.layout.stacks``): each value is read back from the stack's own code where the stack
is installed here (torchtitan 0.2.2, megatron-core 0.16.1: the test extras), every profile loads against the
decision registry, and ``--stack`` plans start from the profile while ``--fix`` overrides it."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.decisions import BY_FIX_KEY
from meshplan.planner.layout.stacks import _version_key, load_stacks
from meshplan.planner.search.job import PlanRequest, plan_job
from tests.test_export_parsers import _torchtitan


def test_every_profile_loads_and_cites_a_version_for_each_value() -> None:
    cat = load_stacks()
    assert {"nemo", "torchtitan", "automodel", "megatron-lm", "megatron-bridge"} <= set(cat.newest)
    bridge = sorted(p.version for p in cat.profiles.values() if p.name == "megatron-bridge")
    assert bridge == ["25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01"]
    assert cat.get("megatron-bridge").version == "26.06.01"  # the newest is the default
    core = sorted((p.version for p in cat.profiles.values() if p.name == "megatron-lm"), key=_version_key)
    assert core == ["core_v0.14.0", "core_v0.15.0", "core_r0.16.0", "core_v0.17.0", "core_v0.18.0", "core_v0.19.0"]
    assert cat.get("megatron-lm").version == "core_v0.19.0"  # the tag names differ in r / v, the numbers order them
    for prof in cat.profiles.values():
        assert prof.values, prof.ref
        for v in prof.values:
            # a layout decision only as a recipe sets it on one mesh (DeepSeek-V3's pipeline layout by pp and vp)
            assert BY_FIX_KEY[v.key].by_stack or v.mesh, (prof.ref, v.key)
            assert "@" in v.source or prof.version in v.source or "torch.distributed" in v.source, (prof.ref, v.key)


def test_bridge_perf_scripts_profiles_add_bf16_gradients_to_their_library_release() -> None:
    """Megatron-Bridge's performance scripts (which launched the published runs) keep the library release's
    defaults, reduce gradients in bf16 and, in a bf16 run, keep Adam's master weights as remainders (the
    precision-aware optimizer; both from 25.11 on), give Hybrid-EP 32 SMs (from 25.11 on: ``utils/helpers.py``, then
    ``utils/overrides.py``), and run every layer under tensor-wise fp8 (the library's preset keeps the first and the
    last in bf16): each perf profile equals its release's library profile but for those, for every workload, and
    says where."""
    cat = load_stacks()
    perf = sorted(p.version for p in cat.profiles.values() if p.name == "megatron-bridge-perf")
    assert perf == ["25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01"]
    assert cat.get("megatron-bridge-perf").version == "26.06.01"
    for version in perf:
        prof, lib = cat.get(f"megatron-bridge-perf@{version}"), cat.get(f"megatron-bridge@{version}")
        assert prof.base == lib.ref and lib.source.split(" (")[0] in prof.source
        for dtype, fp8 in (("bf16", ""), ("fp8", ""), ("fp8", "mxfp8"), ("nvfp4", "")):
            for moe in (False, True):
                got, want = prof.defaults(dtype, moe, fp8), lib.defaults(dtype, moe, fp8)
                assert want["grad_dtype"] == "fp32" and "optim_dtype" not in want, (version, dtype)
                more = {} if version == "25.09" else {"grad_dtype": "bf16", "hybridep_sms": "32"}
                if dtype == "bf16" and version != "25.09":
                    more["optim_dtype"] = "remainder"
                if dtype == "fp8" and not fp8:  # the profile's own recipe, tensor-wise
                    assert (want["bf16_first_layers"], want["bf16_last_layers"]) == ("1", "1"), version
                    more.update(bf16_first_layers="0", bf16_last_layers="0")
                assert got == {**want, **more}, (version, dtype, fp8)
        assert set(lib.unpriced) <= set(prof.unpriced)
        sms = [v for v in prof.values if v.key == "hybridep_sms" and v.model is None]
        assert all("moe_hybridep_num_sms = 32" in v.source and "_perf_overrides" in v.source for v in sms)
        assert len(sms) == (version != "25.09")


def _catalogue_in(tmp_path, monkeypatch, files: dict):
    from meshplan.planner.layout import stacks

    for name, body in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(body))
    monkeypatch.setattr(stacks, "resources", type("R", (), {"files": staticmethod(lambda _: tmp_path.parent)}))
    monkeypatch.setattr(stacks, "STACKS_DIR", tmp_path.name)
    return stacks.load_stacks


def test_a_profile_on_a_base_keeps_its_values_and_refuses_a_missing_base(tmp_path, monkeypatch) -> None:
    base = {"name": "x", "version": "1", "title": "t", "source": "somewhere @ v1",
            "values": [{"key": "grad_dtype", "value": "fp32", "source": "somewhere @ v1"},
                       {"key": "fp8", "value": "tensorwise", "when": "fp8", "source": "somewhere @ v1"}]}
    top = {"name": "x-perf", "version": "1", "title": "t", "source": "somewhere @ v1", "base": "x@1",
           "values": [{"key": "grad_dtype", "value": "bf16", "source": "somewhere else @ v1"}]}
    load = _catalogue_in(tmp_path, monkeypatch, {"x@1.yaml": base, "x-perf@1.yaml": top})
    got = load().get("x-perf@1").defaults("fp8", False)
    assert got == {"grad_dtype": "bf16", "fp8": "tensorwise"}
    (tmp_path / "x-perf@1.yaml").write_text(yaml.safe_dump({**top, "base": "x@2"}))
    with pytest.raises(MeshplanError, match="base x@2 is not a shipped profile"):
        load()
    (tmp_path / "x-perf@1.yaml").write_text("name: [unclosed")
    with pytest.raises(MeshplanError, match="x-perf@1.yaml: not YAML"):
        load()


def test_lora_defaults_come_from_the_base_unless_the_profile_names_its_own(tmp_path, monkeypatch) -> None:
    src = "somewhere @ v1"
    base = {"name": "x", "version": "1", "title": "t", "source": src, "values": [],
            "lora": [{"value": "32", "source": src}, {"value": "16", "model": "llama-3.1-70b-instruct", "source": src}]}
    top = {"name": "x-perf", "version": "1", "title": "t", "source": src, "base": "x@1", "values": [],
           "lora": [{"value": "16:qkv", "model": "llama-3.1-70b-instruct", "source": "the perf script @ v1"}]}
    load = _catalogue_in(tmp_path, monkeypatch, {"x@1.yaml": base, "x-perf@1.yaml": top})
    perf, lib = load().get("x-perf@1"), load().get("x@1")
    assert [perf.lora_default(m).value for m in ("llama-3.1-70b-instruct", "llama-3.1-8b", None)] == \
        ["16:qkv", "32", "32"]
    assert lib.lora_default("llama-3.1-70b-instruct").value == "16"
    (tmp_path / "x@1.yaml").write_text(yaml.safe_dump({**base, "lora": base["lora"] * 2}))
    with pytest.raises(MeshplanError, match="two LoRA defaults for one model"):
        load()


def test_torchtitan_profile_is_torchtitans_own_defaults() -> None:
    """Read back from torchtitan 0.2.2's own JobConfig dataclasses."""
    _torchtitan()  # loads torchtitan's config modules without its GPU kernels, or skips
    from torchtitan.config.job_config import Compile, Parallelism, Training

    prof = load_stacks().get("torchtitan@0.2.2")
    got = prof.defaults("fp8", False)
    assert got["reduce_dtype"] == {"float32": "fp32"}[Training().mixed_precision_reduce]
    assert got["stack"] == ("torchtitan" if Compile().enable else "eager")
    assert got["tp_overlap"] == str(Parallelism().enable_async_tensor_parallel).lower()
    assert Parallelism().context_parallel_rotate_method in BY_FIX_KEY["cp_kind"].choices


def test_torchtitan_attention_is_the_sdpa_backend_its_code_puts_first() -> None:
    """0.2.2's attention wrapper, read back from the installed package (loaded from its file: the package's
    ``__init__`` needs GPU kernels), puts cuDNN ahead of FlashAttention-2 with ``set_priority``; the December 2024
    code the dev set's torchtitan rows ran (0.0.2 at 4d88a8a) called SDPA plainly, FlashAttention-2 first, and those
    rows price with it. The default profile is 0.2.2."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        pytest.skip("torchtitan not installed (pip install torchtitan==0.2.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "attention.py"
    mod_spec = importlib.util.spec_from_file_location("_torchtitan_attention", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    first = mod.ScaledDotProductAttentionWrapper().sdpa_backends[0].name
    cat = load_stacks()
    assert cat.get("torchtitan").version == "0.2.2"
    assert cat.get("torchtitan@0.2.2").defaults("bf16", False)["attention"] == {"CUDNN_ATTENTION": "cudnn"}[first]
    assert cat.get("torchtitan@0.0.2").defaults("bf16", False)["attention"] == "flash2"


def test_megatron_lm_profile_is_megatron_cores_own_defaults() -> None:
    """Read back from megatron-core 0.16.1's own config dataclasses (the core_r0.16 line the profile cites)."""
    core = pytest.importorskip("megatron.core", reason="megatron-core not installed (the test extras have it)")
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.optimizer.optimizer_config import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    assert core is not None
    got = load_stacks().get("megatron-lm@core_r0.16.0").defaults("fp8", False)
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    assert got["fp8"] == defaults["fp8_recipe"]
    mp = {f.name: f.default for f in dataclasses.fields(ModelParallelConfig)}
    assert got["tp_overlap"] == str(mp["tp_comm_overlap"]).lower()
    opt = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}
    assert got["optim_dtype"] == ("fp32" if not opt["use_precision_aware_optimizer"] else "remainder")


def test_a_profile_value_that_is_the_searchs_to_choose_is_refused(tmp_path, monkeypatch) -> None:
    from meshplan.planner.layout import stacks

    bad = tmp_path / "x@1.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "version": "1", "title": "t", "source": "somewhere @ v1",
                                   "values": [{"key": "zero", "value": "3", "source": "somewhere @ v1"}]}))
    monkeypatch.setattr(stacks, "resources", type("R", (), {"files": staticmethod(lambda _: tmp_path.parent)}))
    monkeypatch.setattr(stacks, "STACKS_DIR", tmp_path.name)
    with pytest.raises(MeshplanError, match="'zero' is the search's to choose"):
        stacks.load_stacks()
    bad.write_text(yaml.safe_dump({"name": "x", "version": "1", "title": "t", "source": "somewhere @ v1",
                                   "values": [{"key": "tp", "value": "8", "source": "somewhere @ v1"}]}))
    with pytest.raises(MeshplanError, match="'tp' is not a decision"):
        stacks.load_stacks()


def test_unknown_stack_or_version_is_one_line() -> None:
    with pytest.raises(MeshplanError, match="known: automodel"):
        load_stacks().get("no-such-stack")
    with pytest.raises(MeshplanError, match="no profile of nemo at 1.0"):
        load_stacks().get("nemo@1.0")


def test_plan_starts_from_the_profile_and_fix_overrides_it(tmp_path) -> None:
    mesh = "tp=1,pp=1,cp=1,ep=8,mbs=1,zero=3,recompute=full"  # the layout pinned: the profile's decisions stay free
    plan = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xH100", 512, 4096, stack="automodel", fix=mesh, top=1,
                                   out=tmp_path / "a.yaml")).plan
    assert plan.stack_profile.startswith("automodel@")
    assert (plan.fsdp, plan.moe_dispatcher, plan.reduce_dtype, plan.optim_dtype) == ("torch", "deepep", "fp32",
                                                                                      "bf16")
    plan = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xH100", 512, 4096, stack="automodel",
                                   fix=mesh + ",moe_dispatcher=alltoall", top=1, out=tmp_path / "b.yaml")).plan
    assert plan.moe_dispatcher == "alltoall" and plan.fsdp == "torch"
    plain = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xH100", 512, 4096, fix=mesh, top=1,
                                    out=tmp_path / "c.yaml")).plan
    assert plain.stack_profile == "" and "stack_profile" not in (tmp_path / "c.yaml").read_text()


def test_a_fine_tuning_value_replaces_the_pre_training_one_for_sft_only(tmp_path, monkeypatch) -> None:
    values = [{"key": "optim_dtype", "value": "remainder", "source": "somewhere @ v1"},
              {"key": "optim_dtype", "value": "bf16", "when": "sft", "source": "somewhere/sft.yaml @ v1"},
              {"key": "grad_dtype", "value": "bf16", "source": "somewhere @ v1"},
              {"key": "fp8_params", "value": "true", "when": "sft+fp8", "source": "somewhere/sft_fp8.sh @ v1"}]
    body = {"name": "x", "version": "1", "title": "t", "source": "somewhere @ v1", "values": values}
    load = _catalogue_in(tmp_path, monkeypatch, {"x@1.yaml": body})
    prof = load().get("x@1")
    assert prof.defaults("bf16", False) == {"optim_dtype": "remainder", "grad_dtype": "bf16"}
    assert prof.defaults("bf16", False, task="sft") == {"optim_dtype": "bf16", "grad_dtype": "bf16"}
    assert prof.defaults("fp8", False) == {"optim_dtype": "remainder", "grad_dtype": "bf16"}
    sft_fp8 = {"optim_dtype": "bf16", "grad_dtype": "bf16", "fp8_params": "true"}
    assert prof.defaults("fp8", False, task="sft") == sft_fp8
    with pytest.raises(MeshplanError, match="--task finetune: not a task"):
        prof.defaults("bf16", False, task="finetune")
    again = {"key": "optim_dtype", "value": "fp32", "when": "sft", "source": "other @ v1"}
    twice = {**body, "values": values + [again]}
    (tmp_path / "x@1.yaml").write_text(yaml.safe_dump(twice))
    with pytest.raises(MeshplanError, match="two values of one decision hold for a bf16 dense workload fine-tuning"):
        load()


def test_nemo_fine_tuning_plans_with_its_sft_confs_optimizer(tmp_path) -> None:
    """NeMo 24.07: pre-training keeps an fp32 optimizer over bf16 weights (param remainders); its launcher's
    fine-tuning confs run a bf16 one and its fp8 fine-tuning scripts hold the weights in fp8, which ``--task sft``
    takes and ``--fix`` still overrides."""
    def plan(task: str, fix: str = "tp=1,pp=1,mbs=1") -> object:
        return plan_job(PlanRequest.of("llama-3.1-8b-instruct", "1x8xH100", 64, 4096, stack="nemo@24.07", fix=fix,
                                       dtype="fp8", task=task, top=1, out=tmp_path / f"{task}.yaml")).plan

    assert (plan("pretrain").optim_dtype, plan("pretrain").fp8_params) == ("remainder", False)
    assert (plan("sft").optim_dtype, plan("sft").fp8_params) == ("bf16", True)
    assert plan("sft", "tp=1,pp=1,mbs=1,optim_dtype=fp32").optim_dtype == "fp32"
    with pytest.raises(MeshplanError, match="--task tune: expected one of pretrain, sft"):
        PlanRequest.of("llama-3.1-8b-instruct", "1x8xH100", 64, 4096, task="tune")


def test_a_task_that_changes_nothing_is_said(tmp_path) -> None:
    def notes(stack) -> tuple:
        return plan_job(PlanRequest.of("llama-3.1-8b-instruct", "1x8xH100", 64, 4096, stack=stack, task="sft",
                                       fix="tp=1,pp=1,mbs=1", top=1, out=tmp_path / f"{stack}.yaml")).notes

    assert not [n for n in notes("nemo@24.07") if n.startswith("--task")]
    assert "--task sft: no --stack profile named, so the plan is priced as pre-training would be" in notes(None)
    assert any("stack profile torchtitan@0.2.2 holds no sft value" in n for n in notes("torchtitan@0.2.2"))


def test_nemotron_3_nano_keeps_megatron_cores_hybridep_sms() -> None:
    """The perf scripts' 32 Hybrid-EP SMs are set only where the model's backend is already hybridep when
    ``_set_common_perf_overrides`` runs: Nemotron 3 Nano's library recipe sets deepep and its perf config switches to
    hybridep after (16, Megatron-Core's own), Super's library recipe sets hybridep first (32), in every release that
    has a Nano perf config (26.02.01 on); no other model of the perf profiles is set apart."""
    cat = load_stacks()
    for version in ("26.02.01", "26.04", "26.04.01", "26.06", "26.06.01"):
        prof = cat.get(f"megatron-bridge-perf@{version}")
        assert prof.defaults("fp8", True, "mxfp8")["hybridep_sms"] == "32"
        assert prof.model_defaults("nemotron-3-nano-30b-a3b", "fp8", True, "mxfp8")["hybridep_sms"] == "16"
        assert "hybridep_sms" not in prof.model_defaults("nemotron-3-super-120b-a12b", "fp8", True, "mxfp8")
        own = {v.model for v in prof.values if v.key == "hybridep_sms" and v.model}
        assert own == {"nemotron-3-nano-30b-a3b"}, version
