"""Rack segments (``planner.search.segments``): the best plan priced again on the same trays allocated in segments
that keep its groups inside one NVLink domain, and the one note that says so.

Truths the note does not compute: Slurm's segments divide the job's node count (``sbatch --segment``; Megatron-Bridge's
launcher takes the largest divisor up to a rack's 18 trays, ``scripts/performance/utils/executors.py``), the rank
arithmetic of a packed allocation (EP groups of 32 consecutive ranks in 72-GPU racks: ranks 64-95 sit 8 in the first
rack and 24 in the second; in 64-GPU segments every group of 32 sits in one), and the shorthand parser's own reading
of ``-NVL64``: the note's step time is the price of the same layout on the cluster it names.
"""
from __future__ import annotations

import json

import pytest

from meshplan.cli.main import app
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.layout.stacks import segment_nodes
from meshplan.planner.search.segments import on_network, segment_sizes, segmented

# DeepSeek-V3 as NVIDIA's GB200 guide lays it out (TP1 PP8 VP4 EP32, micro-batch 1), its degrees pinned
GUIDE = "tp=1,pp=8,vpp=4,ep=32,mbs=1,zero=1,recompute=none,moe_dispatcher=hybridep,cuda_graphs=layers,fp8=mxfp8"


def test_segment_sizes_divide_the_job_below_a_rack() -> None:
    assert segment_sizes(64, 18) == [1, 2, 4, 8, 16]  # Bridge's launcher: 16, the largest
    assert segment_sizes(144, 18) == [1, 2, 3, 4, 6, 8, 9, 12, 16]
    assert segment_sizes(37, 18) == [1]  # a prime count of trays can only go one tray at a time
    # Megatron-Bridge's launcher: the largest divisor of the node count up to 18 (whole racks where they fill)
    assert [segment_nodes(n, 18) for n in (64, 144, 54, 40, 37)] == [16, 18, 18, 10, 1]


def test_a_segmented_cluster_is_the_shorthand_of_its_domain() -> None:
    packed = load_cluster("64x4xGB200-NVL72")
    for trays, spec in ((16, "64x4xGB200-NVL64"), (2, "64x4xGB200-NVL8"), (1, "64x4xGB200-NVL4")):
        seg = segmented(packed, trays)
        assert seg.spec == spec and seg.groups[0].domain_size == trays * 4
        assert seg.groups[0] == load_cluster(spec).groups[0]  # the cluster the note names reads back the same


def test_groups_that_straddle_a_rack_leave_nvlink_only_when_packed() -> None:
    from meshplan.planner.layout.layout import Layout

    lay = Layout(tp=1, pp=8, vpp=4, ep=32, dp_shard=32)
    packed = load_cluster("64x4xGB200-NVL72")
    assert "ep" in on_network(packed, lay)  # 72 is no multiple of 32: ranks 64-95 straddle racks 0 and 1
    assert "ep" not in on_network(load_cluster("64x4xGB200-NVL64"), lay)


def _plan(runner, tmp_path, cluster: str, fix: str, model: str = "deepseek-v3", batch: int = 2048,
          seq: int = 4096, *extra: str):
    res = runner.invoke(app, ["plan", "-m", model, "-c", cluster, "-b", str(batch), "-s", str(seq), "--fix", fix,
                              "--dtype", "fp8", "--top", "1", "--json", "--out", str(tmp_path / "p.yaml"), *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _advice(out: dict) -> dict:
    """The JSON's ``allocation``, and the one note that says it in words."""
    notes = [w for w in out["warnings"] if w.startswith("allocation:")]
    alloc = out["allocation"]
    assert len(notes) == 1 and alloc is not None, out["warnings"]
    assert f"--segment={alloc['segment_trays']}" in notes[0] and f"runs {alloc['step_time_s']:.3f} s" in notes[0]
    return alloc


def test_the_note_prices_the_same_layout_on_the_cluster_it_names(runner, tmp_path) -> None:
    """Packed into NVL72 racks the guide's EP32 groups straddle rack boundaries; in segments of 16 trays they do not,
    and the advice's step time is what the plan costs on ``64x4xGB200-NVL64`` as the shorthand reads it (every
    decision pinned, so the search there finds the same layout)."""
    pins = GUIDE + ",moe_overlap=false,sp=false"
    out = _plan(runner, tmp_path, "64x4xGB200-NVL72", pins)
    alloc = _advice(out)
    assert (alloc["segment_trays"], alloc["nvlink_domain"], alloc["cluster"]) == (16, 64, "64x4xGB200-NVL64")
    assert alloc["same_layout"] and not alloc["cluster_file"] and "ep" in alloc["groups_on_nvlink"]
    row = out["plans"][0]
    assert alloc["packed_step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9)
    assert alloc["layout"] == row["layout"]
    seg = _plan(runner, tmp_path, alloc["cluster"], pins)["plans"][0]
    assert seg["layout"] == row["layout"] and seg["step_time_s"] == pytest.approx(alloc["step_time_s"], rel=1e-9)
    assert alloc["step_time_s"] < row["step_time_s"] * 0.99


def test_the_note_names_the_best_layout_of_the_launchers_segments(runner, tmp_path) -> None:
    """64 trays do not fill whole racks, so the launcher's segments (16 trays) are searched too: a free search of
    Qwen3-235B-A22B finds a layout there faster than re-pricing the packed racks' best, and the advice gives what
    ``meshplan plan -c 64x4xGB200-NVL64`` itself finds."""
    res = runner.invoke(app, ["plan", "-m", "qwen3-235b-a22b", "-c", "64x4xGB200-NVL72", "-b", "8192", "-s", "4096",
                              "--dtype", "fp8", "--top", "1", "--json", "--out", str(tmp_path / "q.yaml")])
    assert res.exit_code == 0, res.output
    alloc = _advice(json.loads(res.output))
    assert not alloc["same_layout"]
    res = runner.invoke(app, ["plan", "-m", "qwen3-235b-a22b", "-c", alloc["cluster"], "-b", "8192", "-s", "4096",
                              "--dtype", "fp8", "--top", "1", "--json", "--out", str(tmp_path / "s.yaml")])
    best = json.loads(res.output)["plans"][0]
    assert best["layout"] == alloc["layout"] and best["step_time_s"] == pytest.approx(alloc["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("cluster", ["16x4xGB200-NVL72", "8x8xB200"])
def test_no_note_where_one_domain_or_plain_nodes_hold_the_job(runner, tmp_path, cluster: str) -> None:
    out = _plan(runner, tmp_path, cluster, "tp=1,pp=1,ep=8", "qwen3-30b-a3b", 512, 4096)
    assert out["allocation"] is None and not [w for w in out["warnings"] if w.startswith("allocation:")]


def test_no_note_where_no_segmenting_saves_a_percent(runner, tmp_path) -> None:
    """Data parallelism alone over four full racks: its gradient sync spans every rack in any allocation, and a
    narrower domain only puts more of each ring on the network."""
    out = _plan(runner, tmp_path, "72x4xGB200-NVL72", "tp=1,pp=1,cp=1,ep=1,dp_shard=288,zero=1",
                "llama-3.1-8b-instruct", 288, 4096)
    assert out["allocation"] is None and not [w for w in out["warnings"] if w.startswith("allocation:")]


def test_a_cluster_file_is_told_the_domain_to_state(runner, tmp_path) -> None:
    """A cluster file's links (here a slower NIC) are what the shorthand would not carry: the advice prices the
    segments on the file's links and says which ``nvlink_domain`` to write there; the same file with that domain
    prices it."""
    body = ("inter_link:\n  bandwidth: 20GB/s\ngroups:\n  - nodes: 64\n    devices_per_node: 4\n    device: GB200\n"
            "    nvlink_domain: {}\n")
    packed, seg = tmp_path / "racks.yaml", tmp_path / "segments.yaml"
    packed.write_text(body.format(72))
    seg.write_text(body.format(64))
    pins = GUIDE + ",moe_overlap=false,sp=false"
    out = _plan(runner, tmp_path, str(packed), pins)
    alloc = _advice(out)
    assert alloc["cluster_file"] and alloc["cluster"] == str(packed) and alloc["nvlink_domain"] == 64
    assert any(w.endswith(f"set nvlink_domain: 64 in {packed} to search that allocation") for w in out["warnings"])
    assert _plan(runner, tmp_path, str(seg), pins)["plans"][0]["step_time_s"] == pytest.approx(
        alloc["step_time_s"], rel=1e-9)
    # packed, the straddling groups cross the file's slower NIC: its price, not the shorthand's, is the one compared
    assert alloc["packed_step_time_s"] == pytest.approx(out["plans"][0]["step_time_s"], rel=1e-9)
    assert _plan(runner, tmp_path, "64x4xGB200-NVL72", pins)["plans"][0]["step_time_s"] < alloc["packed_step_time_s"]
