"""NVLink4 and NVLink5 collectives priced at nccl-tests' measured times (``costmodel.nvlink_nccl``).

Truth: ai-dynamo/aiconfigurator's nccl_perf tables (NCCL 2.29.2; ``costmodel/data/published/aic_nccl_nvlink.json``),
read here row by row.
"""
from __future__ import annotations

import json
import statistics

import pytest

from meshplan.cli.main import app
from meshplan.costmodel import nvlink_nccl
from meshplan.costmodel.collectives import collective_time_s, ring_latency_s
from meshplan.costmodel.measured import published_file
from meshplan.planner.cluster.spec import load_cluster

DATA = published_file(nvlink_nccl.DATA_FILE)
NOMINAL = {"nvlink5": 900e9, "nvlink4": 450e9}  # bytes/s a direction per GPU (NVIDIA's DGX datasheets)


def rows_s(kind: str, ranks: int, nbytes: int, link: str = "nvlink5") -> list[float]:
    return [ms * 1e-3 for part in DATA["parts"].values() if part["link"] == link for k, p, b, ms in part["rows"]
            if (k, p, b) == (kind, ranks, nbytes)]


def test_six_parts_two_to_eight_ranks_as_their_cards_name_themselves():
    names = {part: (data["link"], data["device_name"]) for part, data in DATA["parts"].items()}
    assert names == {"H100-SXM": ("nvlink4", "NVIDIA H100 80GB HBM3"), "H200": ("nvlink4", "NVIDIA H200"),
                     "B200": ("nvlink5", "NVIDIA B200"), "GB200": ("nvlink5", "NVIDIA GB200"),
                     "B300": ("nvlink5", "NVIDIA B300 SXM6 AC"), "GB300": ("nvlink5", "NVIDIA GB300")}
    ranks = {part: sorted({p for _, p, _, _ in data["rows"]}) for part, data in DATA["parts"].items()}
    assert ranks == {"H100-SXM": [2, 4, 8], "H200": [2, 4, 8], "B200": [2, 4, 8], "GB200": [2, 4],
                     "B300": [2, 4, 8], "GB300": [2, 4]}


@pytest.mark.parametrize("link,kind,ranks,share", [
    ("nvlink5", "allgather", 8, 0.69), ("nvlink5", "reducescatter", 8, 0.68), ("nvlink5", "allreduce", 8, 0.78),
    ("nvlink5", "alltoall", 8, 0.63), ("nvlink5", "allgather", 2, 0.49), ("nvlink5", "alltoall", 4, 0.55),
    ("nvlink4", "allgather", 8, 0.75), ("nvlink4", "allreduce", 8, 1.01), ("nvlink4", "allgather", 2, 0.57)])
def test_the_docstrings_bus_bandwidth_at_537_mb(link, kind, ranks, share):
    """Under the 0.80 of the nominal rate meshplan assumed, lower for smaller groups, but NVLink4's all-reduce over
    eight ranks (NVLS)."""
    nbytes = 1 << 29
    moved = (2 if kind == "allreduce" else 1) * (ranks - 1) / ranks * nbytes
    got = moved / statistics.median(rows_s(kind, ranks, nbytes, link)) / NOMINAL[link]
    assert got == pytest.approx(share, abs=0.006)


def test_a_measured_point_prices_at_the_parts_median_and_between_points_in_between():
    b = 1 << 26
    assert nvlink_nccl.time_s("nvlink5", "alltoall", b, 8, 3.5e-6) == pytest.approx(
        statistics.median(rows_s("alltoall", 8, b)))
    lo, hi = (statistics.median(rows_s("alltoall", 8, x)) for x in (b, 2 * b))
    assert lo < nvlink_nccl.time_s("nvlink5", "alltoall", 1.5 * b, 8, 3.5e-6) < hi


def test_a_group_larger_than_measured_takes_eights_bus_rate_and_the_ring_latency_of_its_further_steps():
    b, alpha = float(1 << 28), 3.5e-6
    t8 = nvlink_nccl.time_s("nvlink5", "allgather", b, 8, alpha)
    t64 = nvlink_nccl.time_s("nvlink5", "allgather", b, 64, alpha)
    assert t64 == pytest.approx(t8 * (63 / 64) / (7 / 8) + 56 * alpha)
    assert nvlink_nccl.time_s("nvlink5", "allreduce", b, 16, alpha) == pytest.approx(
        nvlink_nccl.time_s("nvlink5", "allreduce", b, 8, alpha) * (15 / 16) / (7 / 8) + 2 * 8 * alpha)


def test_the_planners_collectives_inside_an_nvlink5_domain_take_the_measured_time():
    node = load_cluster("1x8xB200")
    link = node.collective_link(8, 1)
    assert collective_time_s("reducescatter", 1 << 27, 8, link) == pytest.approx(
        statistics.median(rows_s("reducescatter", 8, 1 << 27)))
    rack = load_cluster("16x4xGB200-NVL72")
    ep = rack.alltoall_link(64, 1)
    assert ep.name == "nvlink5" and collective_time_s("alltoall", 1 << 27, 64, ep) == pytest.approx(
        nvlink_nccl.time_s("nvlink5", "alltoall", 1 << 27, 64, ep.latency_s))


def test_an_h100_nodes_tensor_parallel_pair_takes_nvlink4s_measured_time():
    link = load_cluster("1x8xH100").collective_link(2, 1)
    assert link.name == "nvlink4" and collective_time_s("allgather", 1 << 28, 2, link) == pytest.approx(
        statistics.median(rows_s("allgather", 2, 1 << 28, "nvlink4")))
    a100 = load_cluster("1x8xA100").collective_link(8, 1)  # NVLink3: not measured
    assert nvlink_nccl.time_s(a100.name, "allgather", 1 << 28, 8, a100.latency_s) is None


def test_send_receive_and_groups_across_nodes_keep_the_alpha_beta_model():
    two = load_cluster("2x8xB200")
    across = two.collective_link(16, 1)
    assert across.name != "nvlink5"
    assert collective_time_s("allgather", 1 << 28, 16, across) == pytest.approx(
        ring_latency_s("allgather", 16, across) + 15 / 16 * (1 << 28) / across.bandwidth_bytes_per_s)
    link = load_cluster("1x8xB200").collective_link(8, 1)
    assert collective_time_s("sendrecv", 1 << 26, 2, link) == pytest.approx(
        link.latency_s + (1 << 26) / link.bandwidth_bytes_per_s)


def test_explain_names_the_measurement_nvlink_collectives_rest_on(runner, tmp_path):
    fix = "dp=4,dp_shard=1,tp=2,pp=1,cp=1,ep=1,sp=true,mbs=1,zero=1,recompute=none,attention=flash"
    res = runner.invoke(app, ["plan", "-m", "llama-3.1-8b", "-c", "1x8xH100", "-b", "64", "-s", "4096", "--fix", fix,
                              "--explain", "--json", "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 0, res.output
    basis = json.loads(res.stdout)["explain"]["priced_from"]["NCCL collectives on nvlink4"]
    assert "H100-SXM / H200" in basis and "aiconfigurator" in basis and "(2, 4, 8)" in basis
