"""Uneven pipeline stages (issue 12 item 1): the layouts of today's large runs, where the stages cannot all hold
the same number of layers (Llama 3.1 405B: 126 layers, TP8 x PP16 x DP128 on 16,384 H100, Llama 3 paper Table 4)."""
from __future__ import annotations

import itertools
import re

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.splits import balanced_split, format_pp_layout, front_split, parse_pp_layout
from meshplan.planner.plan.schema import load_plan


@pytest.mark.parametrize("layers,pp,megatron", [
    # Megatron-LM --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split: embedding and
    # loss count as one layer each, (L + 2) / pp per stage
    (126, 16, "7+8*14+7"),   # Llama 3.1 405B, PP16
    (94, 8, "11+12*6+11"),   # Qwen3-235B-A22B, PP8
    (62, 16, "3+4*14+3"),    # the example layout
])
def test_split_is_megatrons_when_embedding_and_loss_count_as_layers(layers, pp, megatron):
    assert format_pp_layout(balanced_split(layers, pp)) == megatron
    assert parse_pp_layout(megatron) == balanced_split(layers, pp)


@pytest.mark.parametrize("layers,pp", [(7, 3), (10, 4), (11, 5), (13, 4), (9, 2), (12, 5)])
def test_split_minimises_the_heaviest_stage_against_brute_force(layers, pp):
    """Every composition of ``layers`` into ``pp`` stages of >= 1 layer, first and last carrying one extra layer's
    work: no split has a lighter heaviest stage."""
    def heaviest(split):
        return max(n + (i == 0) + (i == pp - 1) for i, n in enumerate(split))

    best = min(heaviest(c) for c in itertools.product(range(1, layers + 1), repeat=pp) if sum(c) == layers)
    got = balanced_split(layers, pp)
    assert sum(got) == layers and len(got) == pp and heaviest(got) == best


def test_405b_tp8_pp16_dp128_is_planned_and_exported(runner, tmp_path):
    """The Llama 3 split (one chunk per rank: vpp=1 pinned; with vpp free the search interleaves, since issue 12
    lets uneven stages take chunks too, 2*17+3*30+2 over 48 virtual stages)."""
    out = tmp_path / "405b.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-405b", "--cluster", "2048x8xH100", "--global-batch", "2048",
                            "--seq-len", "8192", "--fix", "tp=8,pp=16,vpp=1,cp=1,dp=128", "--top", "1", "--json",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output  # expressible, and not refused as out of memory
    plan = load_plan(out)
    assert (plan.degrees.tp, plan.degrees.pp, plan.degrees.dp) == (8, 16, 128)
    assert [s.num_layers for s in plan.stages] == [7] + [8] * 14 + [7]
    r = runner.invoke(app, ["export", str(out), "--to", "megatron"])
    layout = re.search(r"--pipeline-model-parallel-layout '([^']+)'", r.stdout).group(1)
    unrolled = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), layout)
    assert [s.count("t") for s in unrolled.split("|")] == [7] + [8] * 14 + [7]
    assert unrolled.startswith("E") and unrolled.endswith("L")


def test_a_pinned_split_is_used_and_a_wrong_one_refused(runner, tmp_path):
    args = ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len", "4096",
            "--top", "1", "--json", "--out", str(tmp_path / "p.yaml")]
    r = runner.invoke(app, [*args, "--fix", "tp=1,pp=4,pp_layout=7+9*2+7"])
    assert r.exit_code == 0, r.output
    assert [s.num_layers for s in load_plan(tmp_path / "p.yaml").stages] == [7, 9, 9, 7]
    for bad, needle in (("pp=4,pp_layout=8*5", "adding up to the 32 layers"), ("pp=4,pp_layout=7+x", "7+8*14+7")):
        r = runner.invoke(app, [*args, "--fix", f"tp=1,{bad}"])
        assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    # pp not dividing the 32 layers is searched (it was refused: "does not divide"), and the split is balanced by
    # predicted stage time (issue 12 item 1): Llama 3.1's 128,256-token output layer weighs more than a decoder
    # layer, so the last stage holds fewer layers than Megatron's count split (embedding and loss a layer each)
    six = [a if a != "1x8xH100" else "1x6xH100" for a in args]
    r = runner.invoke(app, [*six, "--fix", "tp=2,pp=3"])
    assert r.exit_code == 0, r.output
    got = tuple(s.num_layers for s in load_plan(tmp_path / "p.yaml").stages)
    assert sum(got) == 32 and got[-1] < balanced_split(32, 3)[-1], got


def _heaviest(split, weights, first, last):
    out, i = [], 0
    for k, n in enumerate(split):
        out.append(sum(weights[i:i + n]) + (first if k == 0 else 0) + (last if k == len(split) - 1 else 0))
        i += n
    return max(out)


@pytest.mark.parametrize("seed", range(12))
def test_time_balanced_split_is_optimal_against_brute_force(seed):
    """Issue 12 item 1: the split balanced by predicted stage time. ``weighted_split`` reaches the smallest heaviest
    stage of every contiguous split (all compositions enumerated), with first/last extras (embedding, head)."""
    import random

    from meshplan.planner.layout.splits import weighted_split

    rng = random.Random(seed)
    n, pp = rng.randint(4, 11), rng.randint(2, 4)
    weights = [rng.choice([1.0, 1.0, 2.5]) * rng.uniform(0.8, 1.2) for _ in range(n)]  # dense and MoE layers
    first, last = rng.uniform(0, 2), rng.uniform(0, 3)
    best = min(_heaviest(split, weights, first, last)
               for cuts in itertools.combinations(range(1, n), pp - 1)
               for split in [tuple(b - a for a, b in zip((0,) + cuts, cuts + (n,)))])
    got = weighted_split(weights, pp, first, last)
    assert sum(got) == n and len(got) == pp and min(got) >= 1
    assert _heaviest(got, weights, first, last) == pytest.approx(best, rel=1e-9)


def test_deepseek_v3_split_follows_predicted_time_not_layer_count():
    """DeepSeek-V3's first three layers are dense (cheap) and its output layer over 129,280 tokens is dear: the
    time-balanced split of 61 layers on 16 stages gives the first stage more layers and the last fewer than the
    layer-count split (3+3+4*13+3 with embedding and loss counted as one layer each)."""
    from meshplan.costmodel.api import Pricer
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.estimate.gpu import GpuEstimator
    from meshplan.planner.layout.layout import Layout
    from meshplan.planner.model.config import load_model

    m = load_model("deepseek-v3")
    est = GpuEstimator(Pricer.shipped())
    work = Workload(m, load_cluster("256x8xH100"), 2048, 4096, "bf16")
    lay = Layout(dp_replicate=16, tp=8, pp=16, micro_batch=1, sequence_parallel=True)
    split = est.time_balanced_split(work, lay)
    even = balanced_split(m.num_layers, 16)
    assert sum(split) == 61 and split[0] > even[0] and split[-1] <= even[-1]


@pytest.mark.parametrize("model,cluster,batch,fix,stages", [
    ("llama-3.1-8b", "4x8xH100", "256", "vpp=2", None),  # a pinned vpp with pp free: the pp that take it
    ("llama-3.1-8b", "1x8xH100", "64", "pp=4,first_stage_layers=5", [5, 9, 9, 9]),  # vpp free: only vpp=1 takes it
    ("llama-3.1-405b", "32x8xH100", "512", "pp_layout=7+8*14+7,tp=8", [7] + [8] * 14 + [7]),  # pp from the layout
    ("qwen2.5-7b", "3x8xH100", "96", "pp=3,tp=4,recompute=full:9", None),  # re-split keeps chunks >= 9 layers
    # 126 layers over 16 x 8 virtual stages: only the count split exists (the embedding and the loss fill virtual
    # stages of their own, 0+1*126+0); the time-weighted re-split has none to offer and must not end the search
    ("llama-3.1-405b", "64x4xGB200-NVL72", "512", "tp=4,pp=16,vpp=8,mbs=1", [0] + [1] * 126 + [0]),
])
def test_pinned_splits_with_the_rest_free(runner, tmp_path, model, cluster, batch, fix, stages):
    """Review findings: a pin that some free pp / vpp cannot take narrows the search instead of ending it; a
    pinned pp_layout sets pp; the time-balanced re-split never breaks the plan's own rules."""
    from meshplan.planner.plan.build import plan_layout

    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "--model", model, "--cluster", cluster, "--global-batch", batch, "--seq-len",
                            "4096", "--fix", fix, "--top", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    if stages:
        assert [s.num_layers for s in plan.stages] == stages
    lay = plan_layout(plan)
    lay.validate(world_size=plan.cluster.world_size, num_layers=plan.model.num_layers,
                 num_heads=plan.model.num_attention_heads, num_kv_heads=plan.model.num_kv_heads, seq_len=4096,
                 global_batch=plan.global_batch, num_experts=plan.model.num_experts)


def test_more_virtual_stages_than_layers_names_pp_times_vpp(runner, tmp_path):
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "4x8xH100", "--global-batch", "256",
                            "--seq-len", "4096", "--fix", "pp=8,vpp=8", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and "pp(8) * vpp(8) = 64 virtual stages" in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("layers,stages,automodel", [
    # NeMo AutoModel's generate_hf_model_fqn_per_model_part (components/distributed/pipelining/functional.py @
    # 89e3a9fdd): layers // stages each, the first layers % stages stages one more. Its docstring's example is 32
    # layers over 4 stages, 8 each; DeepSeek-V3's 61 layers over its benchmark config's pp 4 x (layers_per_stage 2:
    # ceil(61 / 2) + 1 = 32 virtual stages) hold 2 on stages 0-28 and 1 on 29-31
    (32, 4, "8*4"),
    (61, 32, "2*29+1*3"),
    (94, 8, "12*6+11*2"),
])
def test_front_split_is_automodels(layers, stages, automodel):
    assert format_pp_layout(front_split(layers, stages)) == automodel


def test_a_pinned_split_rule_is_the_split_that_runs(runner, tmp_path):
    """Under AutoModel's profile (pp_split=front) an uneven layout takes AutoModel's split as it stands, and with
    pp_split=megatron pinned Megatron's account-for-embedding/loss split: a pinned rule is the stack's, which the
    search does not re-balance by priced time."""
    fix = "tp=1,pp=4,vpp=8,ep=64,mbs=1,zero=3,recompute=full"
    args = ["plan", "--model", "deepseek-v3", "--cluster", "32x8xH100", "--global-batch", "512", "--seq-len", "4096",
            "--top", "1", "--json"]
    stages = {}
    for name, extra in (("front", ["--stack", "automodel@89e3a9fdd", "--fix", fix]),
                        ("megatron", ["--fix", fix + ",pp_split=megatron"])):
        out = tmp_path / f"{name}.yaml"
        r = runner.invoke(app, [*args, *extra, "--out", str(out)])
        assert r.exit_code == 0, r.output
        stages[name] = tuple(s.num_layers for s in load_plan(out).stages)
    assert stages["front"] == (2,) * 29 + (1,) * 3
    assert stages["megatron"] == balanced_split(61, 32) != stages["front"]


def test_pp_split_front_refuses_more_stages_than_layers():
    with pytest.raises(MeshplanError, match="at least one of the 4 layers"):
        front_split(4, 8)


@pytest.mark.parametrize("fix, stages", [
    ("pp=2,first_stage_layers=12,last_stage_layers=20", [12, 20]),  # no middle stage: the two ends hold every layer
    ("pp=4,first_stage_layers=5,last_stage_layers=9", [5, 9, 9, 9]),
    ("pp=2,first_stage_layers=12,last_stage_layers=12", None),  # 24 of 32: no middle stage to take the rest
    ("pp=4,first_stage_layers=20,last_stage_layers=12", None),  # nothing left for the two middle stages
    ("pp=4,first_stage_layers=6,last_stage_layers=9", None),  # 17 over two middle stages
])
def test_first_and_last_stage_layers_follow_megatron_core(runner, tmp_path, fix, stages):
    """Uneven ends as Megatron-Core's TransformerConfig takes them (core_v0.16.0 ``__post_init__``, "Uneven PP"): the
    middle stages share what the ends leave evenly, and there are either middle stages and layers for them or
    neither, so at pp=2 the two ends hold every layer. Megatron-Core's own check is the truth: the plan's stages are
    accepted or refused as it accepts or refuses them, and a refusal is one line naming the pins."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    kv = dict(item.split("=") for item in fix.split(","))
    try:
        TransformerConfig(num_layers=32, hidden_size=256, num_attention_heads=8, pipeline_dtype=torch.bfloat16,
                          pipeline_model_parallel_size=int(kv["pp"]),
                          num_layers_in_first_pipeline_stage=int(kv["first_stage_layers"]),
            num_layers_in_last_pipeline_stage=int(kv["last_stage_layers"]) if "last_stage_layers" in kv else None)
        megatron_takes = True
    except (ValueError, AssertionError):
        megatron_takes = False
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "4096", "--fix", f"tp=1,vpp=1,{fix}", "--top", "1", "--out", str(out)])
    assert (r.exit_code == 0) == megatron_takes == (stages is not None), r.output
    if stages:
        assert [s.num_layers for s in load_plan(out).stages] == stages
    else:
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "first_stage_layers=" in r.output


def test_an_end_stage_longer_than_the_model_is_refused(runner, tmp_path):
    """An end stage of more layers than the model has is no split at all (Megatron-Core's ``__post_init__`` lets
    pp=2 with 40 first-stage layers of 32 through: its middle count goes to -8 over one middle stage); one line."""
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "4096", "--fix", "tp=1,pp=2,first_stage_layers=40", "--out",
                            str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "40 layers on the end stages, of the model's 32" in r.output
