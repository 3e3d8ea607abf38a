"""NVLink5 collectives priced at nccl-tests' measured times (``costmodel.nvlink5_nccl``).

Truth: ai-dynamo/aiconfigurator's nccl_perf tables (NCCL 2.29.2; ``costmodel/data/published/aic_nccl_nvlink5.json``),
read here row by row.
"""
from __future__ import annotations

import statistics

import pytest

from meshplan.costmodel import nvlink5_nccl
from meshplan.costmodel.collectives import collective_time_s, ring_latency_s
from meshplan.costmodel.measured import published_file
from meshplan.planner.cluster.spec import load_cluster

DATA = published_file(nvlink5_nccl.DATA_FILE)
NVLINK5 = 900e9  # bytes/s a direction per GPU (NVIDIA's DGX B200 and GB200 NVL72 datasheets)


def rows_s(kind: str, ranks: int, nbytes: int) -> list[float]:
    return [ms * 1e-3 for part in DATA["parts"].values() for k, p, b, ms in part["rows"]
            if (k, p, b) == (kind, ranks, nbytes)]


def test_four_parts_two_to_eight_ranks_as_their_cards_name_themselves():
    names = {part: data["device_name"] for part, data in DATA["parts"].items()}
    assert names == {"B200": "NVIDIA B200", "GB200": "NVIDIA GB200", "B300": "NVIDIA B300 SXM6 AC",
                     "GB300": "NVIDIA GB300"}
    ranks = {part: sorted({p for _, p, _, _ in data["rows"]}) for part, data in DATA["parts"].items()}
    assert ranks == {"B200": [2, 4, 8], "GB200": [2, 4], "B300": [2, 4, 8], "GB300": [2, 4]}


@pytest.mark.parametrize("kind,ranks,share", [("allgather", 8, 0.69), ("reducescatter", 8, 0.68),
                                              ("allreduce", 8, 0.78), ("alltoall", 8, 0.63),
                                              ("allgather", 2, 0.49), ("alltoall", 4, 0.55)])
def test_the_docstrings_bus_bandwidth_at_537_mb(kind, ranks, share):
    """Well under the 0.80 of 900 GB/s meshplan carried over from NVLink4, and lower for smaller groups."""
    nbytes = 1 << 29
    moved = (2 if kind == "allreduce" else 1) * (ranks - 1) / ranks * nbytes
    assert moved / statistics.median(rows_s(kind, ranks, nbytes)) / NVLINK5 == pytest.approx(share, abs=0.006)


def test_a_measured_point_prices_at_the_parts_median_and_between_points_in_between():
    b = 1 << 26
    assert nvlink5_nccl.time_s("alltoall", b, 8, 3.5e-6) == pytest.approx(statistics.median(rows_s("alltoall", 8, b)))
    lo, hi = (statistics.median(rows_s("alltoall", 8, x)) for x in (b, 2 * b))
    assert lo < nvlink5_nccl.time_s("alltoall", 1.5 * b, 8, 3.5e-6) < hi


def test_a_group_larger_than_measured_takes_eights_bus_rate_and_the_ring_latency_of_its_further_steps():
    b, alpha = float(1 << 28), 3.5e-6
    t8 = nvlink5_nccl.time_s("allgather", b, 8, alpha)
    t64 = nvlink5_nccl.time_s("allgather", b, 64, alpha)
    assert t64 == pytest.approx(t8 * (63 / 64) / (7 / 8) + 56 * alpha)
    assert nvlink5_nccl.time_s("allreduce", b, 16, alpha) == pytest.approx(
        nvlink5_nccl.time_s("allreduce", b, 8, alpha) * (15 / 16) / (7 / 8) + 2 * 8 * alpha)


def test_the_planners_collectives_inside_an_nvlink5_domain_take_the_measured_time():
    node = load_cluster("1x8xB200")
    link = node.collective_link(8, 1)
    assert collective_time_s("reducescatter", 1 << 27, 8, link) == pytest.approx(
        statistics.median(rows_s("reducescatter", 8, 1 << 27)))
    rack = load_cluster("16x4xGB200-NVL72")
    ep = rack.alltoall_link(64, 1)
    assert ep.name == "nvlink5" and collective_time_s("alltoall", 1 << 27, 64, ep) == pytest.approx(
        nvlink5_nccl.time_s("alltoall", 1 << 27, 64, ep.latency_s))


def test_send_receive_and_groups_across_nodes_keep_the_alpha_beta_model():
    two = load_cluster("2x8xB200")
    across = two.collective_link(16, 1)
    assert across.name != "nvlink5"
    assert collective_time_s("allgather", 1 << 28, 16, across) == pytest.approx(
        ring_latency_s("allgather", 16, across) + 15 / 16 * (1 << 28) / across.bandwidth_bytes_per_s)
    link = load_cluster("1x8xB200").collective_link(8, 1)
    assert collective_time_s("sendrecv", 1 << 26, 2, link) == pytest.approx(
        link.latency_s + (1 << 26) / link.bandwidth_bytes_per_s)
