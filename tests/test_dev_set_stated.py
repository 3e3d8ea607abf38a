"""Runs from a source the dev-set harness has no mapping for (runs kept apart, from any publication) are priced from
what their rows state and a stack profile, through the same ``python bench/dev_set.py RUNS_DIR`` (issues 25, 26).

Truths: the device catalogue's own names, the same run priced by its source's own mapping, and the harness's
command line reading back what it printed.
"""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from meshplan.planner.layout.stacks import load_stacks
from tests.helpers import data_path, jsonl_rows, load_dev_set

dev_set = load_dev_set()


@pytest.fixture(scope="module")
def runs_dir():
    return data_path("published_runs")


@pytest.mark.parametrize("gpu, device", [
    ("GB300 (DGX-GB300, NVL72)", "GB300"),  # the alias DGX-GB300 and the name agree
    ("B300 (DGX-B300)", "B300"),  # not GB300: a word is looked up whole
    ("H100-SXM 80GB (DGX-H100)", "H100-SXM"),
    ("A100 40GB", "A100-40GB"),  # two words naming a part beat one naming its sibling (A100 = the 80 GB part)
    ("H100 80GB HBM3", "H100-SXM"),
    ("GB200 NVL72", "GB200"),
])
def test_the_gpu_text_names_one_catalogued_device(gpu, device):
    assert dev_set.stated_device({"name": "r", "gpu": gpu}) == device


@pytest.mark.parametrize("gpu, said", [("TPU v5p", "names no catalogued device"),
                                       ("A100 and H100", "names A100-80GB and H100-SXM")])
def test_a_gpu_text_naming_none_or_two_is_refused_by_name(gpu, said):
    with pytest.raises(dev_set.MeshplanError, match=said):
        dev_set.stated_device({"name": "r", "gpu": gpu})


def test_a_rack_part_defaults_to_nvl72_trays_and_spreads_over_the_fewest_racks():
    """GB300 rows that do not say their nodes: 4-GPU trays in NVL72 racks; 256 GPUs over 4 racks of 64."""
    assert dev_set.stated_cluster({}, 64, "GB300") == ("16x4xGB300-NVL72", "")
    cluster, spread = dev_set.stated_cluster({}, 256, "GB300")
    assert cluster == "64x4xGB300-NVL64" and "4 NVL72 racks" in spread
    assert dev_set.stated_cluster({"gpus_per_node": 8, "nvlink_domain": 8}, 64, "B200") == ("8x8xB200", "")


@pytest.mark.parametrize("name", ["nemo2407-gpt3-5b", "nemo2407-llama2-70b", "nemo2407-llama3-70b"])
def test_the_same_run_stated_alone_prices_as_its_source_mapping_does(runs_dir, tmp_path, name):
    """A NeMo 24.07 row copied as a run of an unknown source that states only its table's facts, its ZeRO stage and
    its stack (``nemo@24.07``) prices, profile-only, to the same step as the NeMo mapping prices it: the mapping's
    other settings (sequence parallelism, overlapped pipeline sends, ring CP) are what the search chooses anyway."""
    row = next(r for r in jsonl_rows(runs_dir / "dev_runs.jsonl") if r["name"] == name)
    stated = {k: v for k, v in row.items() if k != "recompute"} | {"source_id": "X", "stack": "nemo@24.07", "zero": 1}
    own = dev_set.price_row(row, runs_dir, tmp_path, profile_only=True)
    alone = dev_set.price_row(stated, runs_dir, tmp_path, profile_only=True)
    assert own.status == alone.status == "priced"
    assert alone.inputs["per_row"] == () and alone.inputs["profile"] == "nemo@24.07"
    assert alone.predicted_step_s == pytest.approx(own.predicted_step_s, rel=1e-12)


def _held_out_rows(runs_dir):
    """A Megatron-Bridge GB300 row as another publication would state it (no recipe, no container), a row whose GPU
    no catalogue part matches, and one lacking its TP degree."""
    b1 = next(r for r in jsonl_rows(runs_dir / "blackwell_dev.jsonl")
              if r["name"] == "mbridge26.04-llama3-70b-gb300-mxfp8")
    stated = {k: v for k, v in b1.items() if k not in ("recipe", "container", "layout_assumptions", "system",
                                                       "gpus_per_node", "nvlink_domain", "recompute", "sp")}
    stated |= {"name": "x-llama3-70b-gb300", "source_id": "X", "config": str(runs_dir / b1["config"]),
               "published": {"source": "a blog", "tokens_per_s_per_gpu": b1["published"]["tokens_per_s_per_gpu"]}}
    return [stated, stated | {"name": "x-tpu", "gpu": "TPU v5p"},
            {k: v for k, v in stated.items() if k != "tp"} | {"name": "x-no-tp"}]


def test_a_folder_of_held_out_runs_prices_through_the_harness_command(runs_dir, tmp_path):
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _held_out_rows(runs_dir)))
    app = typer.Typer()
    app.command()(dev_set.main)  # the script's own command line (``typer.run(main)``)
    res = CliRunner().invoke(app, [str(tmp_path), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    got = {r["name"]: r for r in out["rows"]}
    priced = got["x-llama3-70b-gb300"]
    assert priced["status"] == "priced", priced["detail"]
    inp = priced["inputs"]
    assert inp["profile"] == load_stacks().get("megatron-bridge").ref  # the default stack's newest
    assert inp["cluster"] == "16x4xGB300-NVL72" and inp["per_row"] == []
    pinned = dict(kv.split("=") for kv in inp["fix"].split(","))
    assert {k: pinned[k] for k in ("tp", "pp", "vpp", "cp", "ep", "mbs", "fp8")} == \
        {"tp": "1", "pp": "4", "vpp": "5", "cp": "1", "ep": "1", "mbs": "1", "fp8": "mxfp8"}
    assert not {"zero", "recompute", "dp_shard"} & set(pinned)  # unstated: the search's
    assert got["x-tpu"]["status"] == "not expressible" and "names no catalogued device" in got["x-tpu"]["detail"]
    assert got["x-no-tp"] == {**got["x-no-tp"], "status": "not expressible", "detail": "row lacks tp"}
    assert [s for s in out["summary"] if s["source"] == "X"][0]["priced"] == 1


def test_the_held_out_copy_keeps_what_the_tables_state(runs_dir):
    """``bench/as_held_out.py`` cuts a row down to its table's facts: no recipe, container or curator's assumptions;
    torchtitan's activation checkpointing as its table states it, in the --fix words the torchtitan mapping uses."""
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    rows = {r["name"]: r for r in dev_set.load_rows(runs_dir)}
    b1 = held.as_stated(rows["mbridge26.04-llama3-70b-gb300-mxfp8"], runs_dir, None)
    assert b1["source_id"] == "B1*" and not {"recipe", "container", "layout_assumptions", "zero"} & set(b1)
    assert dev_set.is_stated_row(b1) and dev_set.stated_row_problem(b1) == ""
    for name, ac in (("row39", "full:16"), ("row41", "full"), ("row45", "op")):
        row = rows[name]
        own = dev_set.row_needs(row, runs_dir).fix  # the torchtitan mapping's pins
        assert held.as_stated(row, runs_dir, "own")["recompute"] == ac == own["recompute"]


def test_a_row_lacking_facts_or_with_bad_counts_says_which(runs_dir):
    row = _held_out_rows(runs_dir)[0]
    assert dev_set.stated_row_problem(row) == ""
    assert dev_set.stated_row_problem({k: v for k, v in row.items() if k not in ("config", "n_gpus", "dp")}) == \
        "row lacks config, n_gpus (or dp)"
    assert dev_set.stated_row_problem(row | {"tp": "2", "mbs": 0}) == \
        "row has tp='2', mbs=0: not what the field holds"
    assert dev_set.stated_row_problem(row | {"task": "lora"}) == ""  # no rank: its stack's (next test)


def test_a_lora_row_stating_no_rank_trains_its_stacks_default_adapters(runs_dir, tmp_path):
    """B2's LoRA rows as another publication states them (no rank): priced with the adapters the stack profile's
    recipe trains, which for the performance scripts are what the source's own mapping reads from each row's recipe
    file (rank 16 on linear_qkv), and for the library the 70B recipe's rank 16 on all four linears; a stack stating
    no LoRA default leaves the row not expressible, saying why."""
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    row = next(r for r in dev_set.load_rows(runs_dir) if r["name"] == "mbridge26.06-llama3-70b-lora-gb300-fp8")
    own = dev_set.row_needs(row, runs_dir).lora
    for stack, want in (("own", own), (None, "16")):
        stated = held.as_stated(row, runs_dir, stack)
        assert stated["task"] == "lora" and "lora" not in stated
        inp = dev_set.row_needs(stated, runs_dir)
        assert inp.lora == want and f"lora={want}" in inp.from_profile
    assert own == "16:qkv"
    bare = held.as_stated(row, runs_dir, "megatron-lm")
    got = dev_set.price_row(bare, runs_dir, tmp_path)
    assert got.status == "not expressible" and "states no rank" in got.detail


@pytest.mark.parametrize("change, said", [
    ({"config": "no-such-config.json", "layers": None}, "file not found"),
    ({"stack": "nosuchstack"}, "nosuchstack"),
    ({"n_gpus": 4, "tp": 8, "dp": None}, "tp*pp*cp = 32 does not divide its 4 GPUs"),
    ({"n_gpus": 64, "dp": 8}, "dp=8 is not n_gpus / (tp*pp*cp) = 64 / 4"),
    ({"gpus_per_node": "8"}, "gpus_per_node='8'"),
    ({"published": ["a list"]}, "published=['a list']"),
    ({"published": {"step_time_s": "abc"}}, "published.step_time_s='abc'"),
    ({"config": 5}, "config=5"),
    ({"n_gpus": 12, "tp": 1, "pp": 4, "dp": None, "gpu": "H100"}, "12 GPUs do not fill whole nodes of 8"),
])
def test_a_bad_held_out_row_is_reported_and_the_others_still_price(runs_dir, tmp_path, change, said):
    row = {k: v for k, v in (_held_out_rows(runs_dir)[0] | change).items() if v is not None}
    res = dev_set.price_row(row, runs_dir, tmp_path)
    assert res.status == "not expressible" and said in res.detail, res.detail


def test_free_text_where_meshplan_words_go_is_said_unread(runs_dir, tmp_path):
    """The dev set's rows hold ZeRO stage and recomputation as prose (the Bridge rows' 'DDP with distributed
    optimizer ...'): a held-out row may too. What is not meshplan's words is left to the search and named."""
    row = _held_out_rows(runs_dir)[0] | {"zero": "1", "recompute": "fulll", "sp": "true"}
    said = dev_set.row_needs(row, runs_dir).assumptions[0]
    assert "not read: zero='1', sp='true', recompute='fulll'" in said
    row = _held_out_rows(runs_dir)[0] | {"zero": 1, "recompute": "full", "sp": False}
    inp = dev_set.row_needs(row, runs_dir)
    assert {"zero": "1", "recompute": "full", "sp": "false"}.items() <= dict(
        kv.split("=") for kv in inp.fix_string.split(",")).items() and "not read" not in inp.assumptions[0]


def test_a_job_inside_one_node_takes_its_gpus_of_it(runs_dir, tmp_path):
    """A 4-GPU H100 row (nodes of 8 unless it says): one node's 4 GPUs, not 0 nodes of 8."""
    row = _held_out_rows(runs_dir)[0] | {"gpu": "H100 80GB", "n_gpus": 4, "tp": 4, "pp": 1, "dp": 1,
                                         "pp_interleave": 1, "config": "llama-3.1-8b", "dtype": "bf16",
                                         "name": "a/b c"}  # a name that is no file name: the plan file's is made one
    res = dev_set.price_row(row, runs_dir, tmp_path)
    assert res.status == "priced", res.detail
    assert res.inputs["cluster"] == "1x4xH100-SXM" and "attention" not in res.inputs["fix"]


@pytest.mark.parametrize("name, split", [
    ("mbridge26.04-deepseekv3-b200-mxfp8", "4*15+1"),  # PP 16, its VP unstated: the library recipe's layout map
    ("mbridge26.04-deepseekv3-gb300-mxfp8", "4*15+1"),  # PP 2 x VP 8: the workload preset's pp_layout
])
def test_an_uneven_pipeline_takes_the_stack_profiles_own_split(runs_dir, tmp_path, name, split):
    """DeepSeek-V3's 61 layers over 16 virtual stages stated alone, under its Megatron-Bridge performance profile: the
    split is the one the profile reads off the recipe at that mesh (``deepseek_v3.py`` layout_map, or the workload
    preset's ``pp_layout``: embedding + 4 layers first, 1 + loss last, "4*15+1"), not a split the harness assumes for
    the row, and no per-row setting."""
    from meshplan.planner.search.job import PlanRequest, plan_job
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    row = next(r for r in dev_set.load_rows(runs_dir) if r["name"] == name)
    stated = held.as_stated(row, runs_dir, "own")
    inp = dev_set.row_needs(stated, runs_dir)
    assert inp.profile == "megatron-bridge-perf@26.04" and "pp_layout" not in inp.fix
    assert not [s for s in inp.per_row if s.startswith(("pp_layout", "pp_split"))]
    res = dev_set.price_row(stated, runs_dir, tmp_path)
    pinned = plan_job(PlanRequest.of(inp.model, inp.cluster, inp.global_batch, inp.seq_len,
                                     fix=inp.fix_string + f",pp_layout={split}", stack=inp.profile, top=1,
                                     dtype=inp.dtype, out=tmp_path / "pinned.yaml"))
    assert res.status == "priced"
    assert res.predicted_step_s == pytest.approx(pinned.rows[0]["step_time_s"], rel=1e-12)


def test_unstated_virtual_stages_are_the_searchs(runs_dir, tmp_path):
    """NeMo 24.07's SFT table has no VP column: its Llama-2-13B row stated alone leaves the virtual pipeline stages
    to the search, as an unstated expert parallelism is, and prices no slower than the same job at one stage a rank
    (the search's optimum); the same row stating ``pp_interleave`` keeps it."""
    from meshplan.planner.search.job import PlanRequest, plan_job
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    row = next(r for r in dev_set.load_rows(runs_dir) if r["name"] == "nemo2407-sft-llama2-13b")
    stated = held.as_stated(row, runs_dir, "own")
    assert stated.get("pp_interleave") is None and stated["pp"] == 4
    inp = dev_set.row_needs(stated, runs_dir)
    assert "vpp" not in inp.fix
    res = dev_set.price_row(stated, runs_dir, tmp_path)
    one = plan_job(PlanRequest.of(inp.model, inp.cluster, inp.global_batch, inp.seq_len, fix=inp.fix_string + ",vpp=1",
                                  stack=inp.profile, top=1, dtype=inp.dtype, task=inp.task, out=tmp_path / "one.yaml"))
    assert res.status == "priced" and res.predicted_step_s <= one.rows[0]["step_time_s"]
    assert dev_set.row_needs(stated | {"pp_interleave": 1}, runs_dir).fix["vpp"] == 1


def test_every_row_the_dev_set_prices_is_judged_apart(runs_dir):
    """The judged-apart harness takes the rows the dev set prices, the hybrid Mamba rows it maps to a config among
    them (the three AutoModel Nemotron V3 rows, whose table says 'no: hybrid'), and Ultra's config, one of
    meshplan's model presets, resolves as the dev set's mapping resolves it."""
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "judged_rows")
    rows = dev_set.load_rows(runs_dir)
    judged = {r["name"] for r in held.judged_rows(runs_dir)}
    priced_by_dev_set = {r["name"] for r in rows if dev_set.row_needs(r, runs_dir).out_of_scope == ""}
    assert judged == priced_by_dev_set and set(dev_set.HYBRID_CONFIGS) <= judged
    ultra = next(r for r in rows if r["name"] == "automodel-nemotronv3-ultra-128")
    stated = held.as_stated(ultra, runs_dir, "own")
    assert stated["config"] == dev_set.row_needs(ultra, runs_dir).model == "nemotron-3-ultra-550b-a55b"


def test_a_row_names_its_attention_kernel_and_dispatcher_in_meshplans_words(runs_dir):
    """A held-out row may state the attention kernel and the MoE dispatcher it ran, as it may its router: read where
    they are ``--fix`` words, named unread where not."""
    row = _held_out_rows(runs_dir)[0] | {"attention": "flex", "moe_dispatcher": "deepep"}
    inp = dev_set.row_needs(row, runs_dir)
    assert {"attention": "flex", "moe_dispatcher": "deepep"}.items() <= inp.fix.items()
    said = dev_set.row_needs(row | {"attention": "flash-4"}, runs_dir).assumptions[0]
    assert "not read: " in said and "attention='flash-4'" in said.split("not read: ")[1]


def test_automodels_table_states_its_fsdp_and_its_kernels(runs_dir):
    """AutoModel's table (header '| ... | FSDP | Kernel Optimizations | ...') states a row's FSDP size and kernels:
    judged apart, GPT-OSS 120B keeps FSDP2 over 64 GPUs (zero=3), 'TE + DeepEP + FlexAttn' (FlexAttention, DeepEP)
    and Nemotron 3 Nano 'TorchSDPA' (SDPA's FlashAttention-2); a Megatron-Bridge row states none of them."""
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    rows = {r["name"]: r for r in dev_set.load_rows(runs_dir)}
    gptoss = held.as_stated(rows["automodel-gptoss-120b-64"], runs_dir, "own")
    assert (gptoss["zero"], gptoss["attention"], gptoss["moe_dispatcher"]) == (3, "flex", "deepep")
    assert held.as_stated(rows["automodel-nemotronv3-nano-8"], runs_dir, "own")["attention"] == "flash2"
    bridge = held.as_stated(rows["mbridge26.04-llama3-70b-gb300-mxfp8"], runs_dir, None)
    assert not {"zero", "attention", "moe_dispatcher"} & set(bridge)


def test_automodels_table_states_its_pipeline_runs_in_its_ga_column(runs_dir, tmp_path):
    """AutoModel's pipelined rows state LBS and GA with GBS = LBS x GA x the data-parallel size (DeepSeek-V3 on 1,024
    GPUs: '| 8192 | 1 | 8 | 4 |' at PP 4 and FSDP 256): GA whole pipeline schedules a step. Judged apart the row
    keeps them (4; Kimi K2's 2) and prices as its own mapping does; an unpipelined row (GA 16, PP 1) states none."""
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    rows = {r["name"]: r for r in dev_set.load_rows(runs_dir)}
    assert held.as_stated(rows["automodel-dsv3-1024"], runs_dir, "own")["pp_runs"] == 4
    assert held.as_stated(rows["automodel-kimik2-256"], runs_dir, "own")["pp_runs"] == 2
    assert "pp_runs" not in held.as_stated(rows["automodel-qwen3-30b-8"], runs_dir, "own")
    row = rows["automodel-dsv3-1024"]
    own = dev_set.price_row(row, runs_dir, tmp_path, profile_only=True)
    alone = dev_set.price_row(held.as_stated(row, runs_dir, "own"), runs_dir, tmp_path)
    assert own.status == alone.status == "priced"
    assert "pp_runs=4" in alone.inputs["fix"]
    assert alone.predicted_step_s == pytest.approx(own.predicted_step_s, rel=1e-9)


def test_torchtitans_table_states_torch_compile(runs_dir, tmp_path):
    """torchtitan's Grand Teton table names its compiled runs ('| FSDP + torch.compile | 6,667 | 77.0 |'): judged
    apart under torchtitan's profile the row runs the compiled kernels (stack=torchtitan) and prices as its own
    mapping does; its uncompiled twin ('| FSDP | ...') keeps the profile's eager default. Under another stack the
    word is said unread."""
    from tests.helpers import load_bench

    held = load_bench("as_held_out", "as_stated")
    rows = {r["name"]: r for r in dev_set.load_rows(runs_dir)}
    for name, compiled in (("row46", True), ("row52", False)):
        stated = held.as_stated(rows[name], runs_dir, "own")
        own = dev_set.price_row(rows[name], runs_dir, tmp_path, profile_only=True)
        alone = dev_set.price_row(stated, runs_dir, tmp_path)
        assert ("stack=torchtitan" in dev_set.row_needs(stated, runs_dir).fix_string) == compiled
        assert alone.predicted_step_s == pytest.approx(own.predicted_step_s, rel=1e-9)
    other = held.as_stated(rows["row46"], runs_dir, "megatron-bridge")
    said = dev_set.row_needs(other, runs_dir).assumptions[0]
    assert "not read: compile=True" in said
