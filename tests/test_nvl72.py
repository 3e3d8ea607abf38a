"""NVL72 racks: NVLink domains wider than a node (18 compute trays x 4 GPUs), the shorthand and YAML that state
them, and collectives priced on the links their group's ranks actually span.

Golden bandwidths by hand from the cited figures (costmodel/data/devices.yaml, planner/presets/clusters/links.yaml):
NVLink 5 is 1.8 TB/s per GPU bidirectional, 900 GB/s per direction (NVIDIA GB200 NVL72 specifications: 130 TB/s
over 72 GPUs), times the NVLink efficiency 0.80 = 720 GB/s; the GB200 compute tray's NIC is one 400 Gb/s
ConnectX-7 per GPU = 50 GB/s, times the InfiniBand efficiency 0.80 = 40 GB/s.
"""
from __future__ import annotations

import json

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster

NVLINK5_BYTES_PER_S = 900e9 * 0.80  # 720 GB/s
NIC_400G_BYTES_PER_S = 400e9 / 8 * 0.80  # 40 GB/s
NIC_800G_BYTES_PER_S = 800e9 / 8 * 0.80  # 80 GB/s


def test_shorthand_states_trays_and_racks_and_allows_a_partial_last_rack():
    c = load_cluster("64x4xGB200-NVL72")  # 256 GPUs: three full racks and 40 GPUs of a fourth
    assert (c.world_size, c.num_nodes, c.devices_per_node, c.device.name) == (256, 64, 4, "GB200")
    assert c.groups[0].domain_size == 72 and c.nvlink_width == 72
    assert load_cluster("64x4xGB200").groups[0].domain_size == 72  # the GB200 family is the NVL72 rack
    assert load_cluster("4x8xB200").nvlink_width == 8  # DGX B200: the node is the domain
    assert load_cluster("2x4xGB200-NVL8").groups[0].domain_size == 8


def test_group_of_a_whole_rack_prices_as_nvlink_even_across_trays():
    c = load_cluster("64x4xGB200-NVL72")
    link = c.collective_link(72, 1)  # 18 trays, one rack
    assert link.name == "nvlink5" and link.bandwidth_bytes_per_s == pytest.approx(NVLINK5_BYTES_PER_S)
    assert c.alltoall_link(72, 1).bandwidth_bytes_per_s == pytest.approx(NVLINK5_BYTES_PER_S)  # EP 72
    assert c.collective_link(8, 1).name == "nvlink5"  # tp 8 over two trays
    assert c.collective_link(9, 8).name == "nvlink5"  # a strided group of 9 x 8 = 72 ranks tiles the racks


def test_group_spanning_two_racks_prices_on_the_nic():
    c = load_cluster("64x4xGB200-NVL72")
    link = c.collective_link(2, 72)  # one rank in each of two racks: one NIC carries the ring
    assert link.name == "ib-ndr-400" and link.bandwidth_bytes_per_s == pytest.approx(NIC_400G_BYTES_PER_S)
    # 64-rank groups do not tile 72-GPU racks: ranks 64-127 sit 8 in rack 0 and 56 in rack 1, so 8 NICs carry the
    # ring across the boundary (8 x 40 = 320 GB/s)
    wide = c.collective_link(64, 1)
    assert wide.name == "ib-ndr-400x8" and wide.bandwidth_bytes_per_s == pytest.approx(8 * NIC_400G_BYTES_PER_S)
    # an all-to-all over those 64 ranks: 56 of 64 destinations of a rank-0-rack member are remote through its own
    # NIC, 7 over NVLink: time per byte max(56/64 / 40 GB/s, 7/64 / 720 GB/s), as bandwidth (63/64) / that
    a2a = c.alltoall_link(64, 1)
    assert a2a.bandwidth_bytes_per_s == pytest.approx(63 / 64 / (56 / 64 / NIC_400G_BYTES_PER_S))


def test_gb300_racks_use_the_800g_nic():
    c = load_cluster("36x4xGB300-NVL72")
    assert c.collective_link(2, 72).bandwidth_bytes_per_s == pytest.approx(NIC_800G_BYTES_PER_S)
    assert c.collective_link(72, 1).name == "nvlink5"


def test_cluster_yaml_states_the_domain(tmp_path):
    p = tmp_path / "racks.yaml"
    p.write_text("groups:\n  - nodes: 64\n    devices_per_node: 4\n    device: GB200\n    nvlink_domain: 72\n")
    c = load_cluster(str(p))
    short = load_cluster("64x4xGB200-NVL72")
    assert c.groups[0].domain_size == 72
    assert [c.collective_link(s, t) for s, t in ((72, 1), (64, 1), (2, 72))] == \
        [short.collective_link(s, t) for s, t in ((72, 1), (64, 1), (2, 72))]


@pytest.mark.parametrize("spec, pattern", [
    ("4x4xGB200-NVL70", "NVLink domain of 70 GPUs must hold whole nodes of 4"),
    ("4x4xGB200-NVL1000", "at most 576"),
    ("4x4xGB200-NVL0", "-NVL0 names no NVLink domain"),  # it planned as if the suffix were absent
])
def test_bad_domains_are_one_line_errors(spec, pattern):
    with pytest.raises(MeshplanError, match=pattern):
        load_cluster(spec)


@pytest.mark.parametrize("spec, pattern", [
    # DGX / HGX B300 join their 8 GPUs through the baseboard's NVLink switches; NVIDIA sells the board as "HGX B300
    # NVL16", counting dies: read as 16 GPUs, the suffix would price two nodes' traffic on NVLink
    ("2x8xB300-NVL16", r"B300 systems link GPUs only inside a node of 8 \(nvlink5; NVIDIA's 'HGX B300 NVL16' counts "
                       r"the 16 dies of its 8 GPUs\), not -NVL16; drop it$"),
    ("1x8xB300-NVL16", r"only inside a node of 8 .*not -NVL16"),
    ("2x8xB200-NVL16", r"B200 systems link GPUs only inside a node of 8 \(nvlink5\), not -NVL16"),
    ("2x8xA100-NVL16", r"A100-80GB systems link GPUs only inside a node of 8 \(nvlink3\)"),
    ("2x4xL4-NVL8", r"L4 systems link GPUs only inside a node of 4 \(pcie4-x16\)"),  # no NVLink at all
    ("36x4xGB300-NVL144", r"GB300 systems join at most 72 GPUs in one NVLink domain, not -NVL144; drop it for "
                          r"gb300-nvl72's domain of 72"),
    ("64x8xH100-NVL512", r"H100-SXM systems join at most 256 GPUs in one NVLink domain"),  # NVLink Switch System
])
def test_a_domain_wider_than_the_parts_systems_build_is_refused(spec, pattern):
    with pytest.raises(MeshplanError, match=pattern):
        load_cluster(spec)


def test_domains_the_parts_build_are_kept():
    assert load_cluster("32x8xH100-NVL256").groups[0].domain_size == 256  # H100's NVLink Switch System
    assert load_cluster("1x8xB300-NVL8").groups[0].domain_size == 8  # the node, stated
    assert load_cluster("18x4xGB300-NVL36").groups[0].domain_size == 36


def test_yaml_domain_wider_than_the_node_names_the_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("groups:\n  - nodes: 2\n    devices_per_node: 8\n    device: B200\n    nvlink_domain: 16\n")
    with pytest.raises(MeshplanError, match=r"c\.yaml: groups\[0\]: B200 systems link GPUs only inside a node "
                                            r"of 8 \(nvlink5\), not nvlink_domain: 16"):
        load_cluster(str(p))


def test_cluster_command_says_what_shares_nvlink(runner):
    """256 GPUs in racks of 72: three full domains and 40 GPUs of a fourth (256 = 3 x 72 + 40); a DGX H100 pair:
    each node."""
    res = runner.invoke(app, ["devices", "cluster", "64x4xGB200-NVL72"])
    assert res.exit_code == 0
    assert "NVLink domain: 72 GPUs over 18 nodes: 3 full domains and one of 40 GPUs" in " ".join(res.output.split())
    res = runner.invoke(app, ["devices", "cluster", "2x8xH100"])
    assert "NVLink domain: each node (8 GPUs)" in " ".join(res.output.split())


def test_bad_yaml_domain_names_the_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("groups:\n  - nodes: 2\n    devices_per_node: 4\n    device: GB200\n    nvlink_domain: 0\n")
    with pytest.raises(MeshplanError, match=r"groups\[0\]: nvlink_domain must be a whole number >= 1"):
        load_cluster(str(p))


def test_cli_lists_blackwell_and_refuses_a_bad_rack(runner):
    res = runner.invoke(app, ["devices", "--json"])
    assert res.exit_code == 0
    names = {d["name"] for d in json.loads(res.output)}
    assert {"B200", "B300", "GB200", "GB300"} <= names
    bad = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "4x4xGB200-NVL70",
                              "--global-batch", "16", "--seq-len", "1024"])
    assert bad.exit_code == 2 and "NVLink domain of 70" in bad.output and "Traceback" not in bad.output


def test_full_deepseek_v3_search_on_eight_racks_returns_a_plan(runner, tmp_path):
    """No pins: DeepSeek-V3 on 144 GB200 trays of 4 (576 GPUs, eight full NVL72 racks). 61 layers leave a free pp
    of 1 or 61, and tp, cp and ep are powers of two, so the data-parallel degree carries the 9 of 576 = 64 x 9: the
    global batch must be a multiple of 9 (4608 = 576 x 8). Its wall time is recorded in BENCHMARKS.md, not
    asserted."""
    import yaml

    out = tmp_path / "dsv3.yaml"
    res = runner.invoke(app, ["plan", "--model", "deepseek-v3", "--cluster", "144x4xGB200-NVL72",
                              "--global-batch", "4608", "--seq-len", "4096", "--top", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = yaml.safe_load(out.read_text())
    d = plan["degrees"]
    assert d["dp_replicate"] * d["dp_shard"] * d["tp"] * d["pp"] * d["cp"] == 576
    assert d["tp"] <= 72 and plan["cluster"]["spec"] == "144x4xGB200-NVL72"
