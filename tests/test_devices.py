"""Device catalogue: figures cross-checked against the public spec tables in data/kernels, physics, aliases, CLI."""
from __future__ import annotations

import csv
import json

import pytest
import yaml

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import (
    DTYPES,
    catalogue,
    device_from_dict,
    device_to_dict,
    get_device,
)
from tests.helpers import data_path, open_data

GIB = 2**30
MIB = 2**20
REL_TOL = 0.015  # "within rounding": datasheets print 2-3 significant figures

# Every shared-table figure that disagrees with the catalogue, with the reason the datasheet value is kept.
# The test below demands that this set is exact: a new disagreement fails, and so does a stale entry.
KNOWN_DISAGREEMENTS = {
    # NeuSight device_configs
    ("neusight", "AMD_Instinct_MI210", "l2_mib"),  # NeuSight 16; CDNA2 whitepaper: 8 MB L2 per GCD
    ("neusight", "AMD_Instinct_MI250", "l2_mib"),  # NeuSight copies its MI210 file; per-GCD L2 is 8 MB
    ("neusight", "NVIDIA_H100_80GB_HBM3", "mem_bw_gbps"),  # NeuSight 3430; H100 SXM datasheet 3.35 TB/s
    ("neusight", "NVIDIA_L4", "sm_count"),  # NeuSight 60 (full AD104); shipping L4 has 58 SMs (7424 cores)
    ("neusight", "NVIDIA_L4", "fp32_gflops"),  # NeuSight derives 31.3 TF from 60 SMs; datasheet 30.3 TF
    ("neusight", "Tesla_P100-PCIE-16GB", "clock_mhz"),  # NeuSight 1380; P100 PCIe boost clock 1303 MHz
    ("neusight", "Tesla_P100-PCIE-16GB", "fp32_gflops"),  # NeuSight 9519; datasheet 9.3 TF
    ("neusight", "Tesla_P4", "sm_count"),  # NeuSight 40 SMs x 64 cores; GP104 has 20 SMs x 128 cores
    ("neusight", "Tesla_P4", "clock_mhz"),  # NeuSight 1113 (max app clock); datasheet boost 1063 MHz
    ("neusight", "Tesla_P4", "fp32_gflops"),  # NeuSight 5699 from 1113 MHz; datasheet 5.5 TF
    ("neusight", "Tesla_T4", "memory_gib"),  # NeuSight 15 = torch-visible after ECC; the card has 16 GB
    # CDMPP device_info.csv
    ("cdmpp", "P100", "clock_mhz"),  # CDMPP 1329 (max clock); datasheet boost 1303 MHz
    ("cdmpp", "P100", "fp32_gflops"),  # CDMPP 9.526 TF from 1329 MHz; datasheet 9.3 TF
    # Habitat MLP devices.csv
    ("habitat_mlp", "V100", "memory_gib"),  # Habitat's V100 is the 16 GB PCIe card; ours is the 32 GB one
}

NEUSIGHT_MAP = {
    "AMD_Instinct_MI100": "MI100",
    "AMD_Instinct_MI210": "MI210",
    "AMD_Instinct_MI250": "MI250",
    "NVIDIA_A100-PCIE-40GB": "A100-PCIe-40GB",
    "NVIDIA_A100-SXM4-40GB": "A100-40GB",
    "NVIDIA_A100_80GB_PCIe": "A100-PCIe-80GB",
    "NVIDIA_H100_80GB_HBM3": "H100-SXM",
    "NVIDIA_L4": "L4",
    "Tesla_P100-PCIE-16GB": "P100",
    "Tesla_P4": "P4",
    "Tesla_T4": "T4",
    "Tesla_V100-PCIE-32GB": "V100-PCIe-32GB",
}
CDMPP_MAP = {"T4": "T4", "P4": "P4", "V100": "V100-SXM2-32GB", "A10": "A10", "A100": "A100-40GB", "P100": "P100"}
HABITAT_MLP_MAP = {"P100": "P100", "T4": "T4", "V100": "V100-PCIe-32GB"}
HABITAT_YML_MAP = {"P4": "P4", "T4": "T4", "V100": "V100-PCIe-32GB", "P100": "P100"}


def _ours(dev, field: str) -> float:
    return {
        "memory_gib": dev.memory_bytes / GIB,
        "mem_bw_gbps": dev.mem_bw_bytes_per_s / 1e9,
        "sm_count": dev.sm_count,
        "clock_mhz": dev.clock_hz / 1e6,
        "fp32_gflops": dev.peak_flops["fp32"] / 1e9,
        "fp16_gflops": dev.peak_flops.get("fp16", 0.0) / 1e9,
        "l2_mib": dev.l2_bytes / MIB,
    }[field]


def _agrees(field: str, theirs: float, ours: float) -> bool:
    if field in ("sm_count", "memory_gib", "l2_mib"):
        return round(ours) == round(theirs)  # counts and GiB/MiB sizes must match exactly after rounding
    return abs(ours - theirs) <= REL_TOL * abs(theirs)


def _shared_figures():
    """(source, row, field, their value, our device) for every figure the shared tables and we both have."""
    out = []
    for stem, name in NEUSIGHT_MAP.items():
        cfg = json.loads(data_path("kernels", "neusight", "device_configs", f"{stem}.json").read_text())
        fp32 = cfg.get("SingleFLOPs", cfg.get("SingleFLOPsMM"))  # AMD: matrix (MFMA) FP32, as in our catalogue
        for field, v in (("memory_gib", cfg["Dev_Mem"]), ("mem_bw_gbps", cfg["Mem_Bw"]), ("sm_count", cfg["Num_Sm"]),
                         ("clock_mhz", cfg["Freq"]), ("fp32_gflops", fp32), ("l2_mib", cfg["L2Cache"])):
            out.append(("neusight", stem, field, float(v), name))
    with data_path("kernels", "device-specs", "cdmpp_device_info.csv").open(encoding="utf-8-sig") as fh:
        for row in csv.DictReader(fh):
            row = {k.strip(): (v or "").strip() for k, v in row.items()}
            name = CDMPP_MAP.get(row["device_name"])
            if not name:
                continue
            # fp16_tflops is skipped: CDMPP mixes CUDA-core FP16 (V100 31.3, A100 78) with tensor FP16 (T4 65).
            for field, col, scale in (("clock_mhz", "clock_MHz", 1), ("sm_count", "SM_count", 1),
                                      ("memory_gib", "memory_gb", 1), ("l2_mib", "L2cache_mb", 1),
                                      ("mem_bw_gbps", "BW_gbps", 1), ("fp32_gflops", "fp32_tflops", 1000)):
                if row[col] not in ("", "N/A"):
                    out.append(("cdmpp", row["device_name"], field, float(row[col]) * scale, name))
    with data_path("kernels", "device-specs", "habitat_mlp_devices.csv").open() as fh:
        for row in csv.DictReader(fh):
            name = HABITAT_MLP_MAP.get(row["device"])
            if not name:
                continue
            for field, col, scale in (("memory_gib", "mem", 1), ("mem_bw_gbps", "mem_bw", 1),
                                      ("sm_count", "num_sm", 1), ("fp32_gflops", "single", 1000),
                                      ("fp16_gflops", "half", 1000)):
                if row[col]:
                    out.append(("habitat_mlp", row["device"], field, float(row[col]) * scale, name))
    habitat = yaml.safe_load(data_path("kernels", "device-specs", "habitat_devices.yml").read_text())
    for key, name in HABITAT_YML_MAP.items():
        # Only the SM count: Habitat's bandwidth and FLOP/s are its own measurements at base clock (PROVENANCE.md).
        out.append(("habitat_yml", key, "sm_count", float(habitat[key]["num_sms"]), name))
    return out


def test_catalogue_agrees_with_shared_spec_tables():
    figures = _shared_figures()
    assert len(figures) >= 90  # 12 NeuSight files x 6 + CDMPP + Habitat: the comparison really ran
    disagreements = {}
    for source, row, field, theirs, name in figures:
        ours = _ours(get_device(name), field)
        if not _agrees(field, theirs, ours):
            disagreements[(source, row, field)] = (theirs, ours)
    unexpected = {k: v for k, v in disagreements.items() if k not in KNOWN_DISAGREEMENTS}
    stale = KNOWN_DISAGREEMENTS - set(disagreements)
    assert not unexpected, f"catalogue disagrees with shared spec tables: {unexpected}"
    assert not stale, f"listed disagreements that now agree (remove them): {stale}"


REQUIRED = ["V100", "A100-40GB", "A100-80GB", "H100-SXM", "H800", "H200", "L4", "T4", "A40", "MI300X",
            "P100", "P4", "A100-PCIe-40GB", "A10"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_devices_present_with_sources(name):
    dev = get_device(name)
    assert dev.vendor in ("nvidia", "amd")
    for key in ("peak_flops", "memory_bytes", "mem_bw", "sm_count", "l2_bytes", "clock_hz"):
        assert dev.sources.get(key), f"{dev.name}: no source for {key}"
    assert set(dev.peak_flops) <= set(DTYPES) and "fp32" in dev.peak_flops


# FP32 lanes per SM (FLOP/clock = 2 x lanes), from the architecture whitepapers: GP100/GV100/GA100/TU10x 64,
# GP104/GA102/AD10x/GH100 128; AMD CDNA matrix FP32: 256 FLOP/clock per CU (CDNA/CDNA2/CDNA3 whitepapers).
FLOP_PER_CLOCK_PER_SM = {
    "H100-SXM": 256, "H100-PCIe": 256, "H800": 256, "H200": 256, "H100-SXM-96GB-500W": 256, "A100-80GB": 128,
    "A100-40GB": 128,
    "A100-PCIe-40GB": 128, "A100-PCIe-80GB": 128, "A40": 256, "A10": 256, "L4": 256, "T4": 128,
    "V100-SXM2-32GB": 128, "V100-PCIe-32GB": 128, "P100": 128, "P4": 256,
    "MI300X": 256, "MI250": 256, "MI210": 256, "MI100": 256,
    # Blackwell: 128 FP32 lanes per SM (NVIDIA Blackwell Ultra architecture blog: "128 CUDA Cores for FP32 and INT32")
    "B200": 256, "GB200": 256, "B300": 256, "GB300": 256,
}


def test_fp32_peak_equals_sms_times_lanes_times_clock():
    assert set(FLOP_PER_CLOCK_PER_SM) == set(catalogue()) - {n for n, d in catalogue().items() if d.vendor == "cpu"}
    for name, per_clock in FLOP_PER_CLOCK_PER_SM.items():
        dev = get_device(name)
        derived = dev.sm_count * per_clock * dev.clock_hz
        assert derived == pytest.approx(dev.peak_flops["fp32"], rel=0.02), name


def test_l2_is_what_each_measured_part_reported():
    # meshplan's own kernel runs record torch.cuda.get_device_properties(0).L2_cache_size with each file
    from meshplan.costmodel.grouped import MEASURED_ON
    from meshplan.costmodel.measured import measured_files

    files = measured_files()
    assert set(MEASURED_ON) <= set(files)
    for name, device in MEASURED_ON.items():
        assert get_device(device).l2_bytes == files[name]["environment"]["l2_bytes"], device


def test_b200_bandwidth_is_the_bus_the_driver_reports():
    # pytorch/ao PR 4002 (2026-03-05) quotes a B200's device query: a 7,680-bit memory bus
    # (cudaDevAttrGlobalMemoryBusWidth) and nvidia-smi's 3,996 MHz maximum memory clock, double data rate
    bus_bytes, mem_clock_hz = 7680 / 8, 3996e6
    assert get_device("B200").mem_bw_bytes_per_s == pytest.approx(bus_bytes * mem_clock_hz * 2, rel=1e-3)


def test_dense_tensor_figures_are_half_the_sparse_datasheet_figures():
    # NVIDIA H100 SXM datasheet (with sparsity): TF32 989, BF16 1979, FP8 3958 TFLOPS.
    h100 = get_device("H100")
    assert h100.peak("tf32") * 2 == pytest.approx(989e12, rel=0.001)
    assert h100.peak("bf16") * 2 == pytest.approx(1979e12, rel=0.001)
    assert h100.peak("fp8") * 2 == pytest.approx(3958e12, rel=0.001)
    # A100 datasheet: BF16 312 TFLOPS dense, 16x the FP32 19.5.
    assert get_device("A100").peak("bf16") == pytest.approx(16 * 19.5e12)


def test_unsupported_dtypes_are_absent():
    assert not get_device("A100").supports("fp8")  # fp8 arrived with Hopper/Ada
    assert not get_device("V100").supports("bf16")  # Volta has no bf16
    assert not get_device("T4").supports("bf16")
    with pytest.raises(MeshplanError, match="A100-80GB does not support fp8"):
        get_device("A100").peak("fp8")


def test_every_device_name_in_the_public_data_resolves():
    expected = {
        # NeuSight CSV `Device` column (torch.cuda.get_device_name)
        "NVIDIA L4": "L4", "Tesla V100-PCIE-32GB": "V100-PCIe-32GB", "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
        "Tesla P100-PCIE-16GB": "P100", "Tesla T4": "T4", "Tesla P4": "P4", "NVIDIA H100 80GB HBM3": "H100-SXM",
        "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
        # Vidur folder names (DGX A100 80GB, DGX H100 and A40 per its docs)
        "a100": "A100-80GB", "h100": "H100-SXM", "a40": "A40",
    }
    seen = set()
    with open_data("kernels", "neusight", "test", "linear.csv") as fh:
        for row in csv.DictReader(fh):
            seen.add(row["Device"])
    assert seen <= set(expected), seen - set(expected)
    for stem in NEUSIGHT_MAP:  # label folder names use underscores
        assert data_path("kernels", "neusight", "labels", stem).is_dir()
        assert get_device(stem).name == NEUSIGHT_MAP[stem]
    for folder in ("a100", "a40", "h100"):
        assert data_path("kernels", "vidur", "compute", folder).is_dir()
    for raw, name in expected.items():
        assert get_device(raw).name == name


def test_unknown_device_suggests_closest():
    with pytest.raises(MeshplanError, match=r"unknown device 'H20'.*did you mean"):
        get_device("H20")


def test_device_from_dict_validation():
    good = {"name": "cpu-x", "vendor": "cpu", "peak_flops": {"fp32": 1e11}, "memory_bytes": 2**34,
            "mem_bw_bytes_per_s": 2e10, "sm_count": 4, "l2_bytes": 2**20, "clock_hz": 3e9}
    dev = device_from_dict(good, "cache.json")
    assert dev.vendor == "cpu" and dev.peak("fp32") == 1e11
    with pytest.raises(MeshplanError, match=r"cache.json: device cpu-x: vendor must be one of"):
        device_from_dict({**good, "vendor": "intel"}, "cache.json")
    with pytest.raises(MeshplanError, match=r"unknown dtype\(s\) fp64"):
        device_from_dict({**good, "peak_flops": {"fp64": 1.0}}, "cache.json")
    with pytest.raises(MeshplanError, match=r"memory_bytes must be positive, got 0"):
        device_from_dict({**good, "memory_bytes": 0}, "cache.json")
    with pytest.raises(MeshplanError, match=r"missing clock_hz"):
        device_from_dict({k: v for k, v in good.items() if k != "clock_hz"}, "cache.json")
    # The optional measured cost of one op call survives the round trip; catalogue GPUs leave it at 0.
    timed = device_from_dict({**good, "launch_s": 1e-6}, "cache.json")
    assert timed.launch_s == 1e-6 and device_from_dict(device_to_dict(timed)) == timed
    assert dev.launch_s == 0.0 and "launch_s" not in device_to_dict(dev)
    with pytest.raises(MeshplanError, match=r"launch_s must be positive"):
        device_from_dict({**good, "launch_s": -1e-6}, "cache.json")


# ---------------------------------------------------------------- CLI

def test_cli_devices_table_and_json(runner):
    res = runner.invoke(app, ["devices"])
    assert res.exit_code == 0, res.output
    for name in REQUIRED[1:]:
        assert get_device(name).name in res.output
    res = runner.invoke(app, ["devices", "--json"])
    assert res.exit_code == 0, res.output
    data = {d["name"]: d for d in json.loads(res.output)}
    assert data["H100-SXM"]["peak_flops"]["bf16"] == 989.4e12
    assert data["T4"]["memory_bytes"] == 16 * GIB


def test_cli_devices_show(runner):
    res = runner.invoke(app, ["devices", "show", "NVIDIA A100 80GB PCIe", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["name"] == "A100-PCIe-80GB" and d["mem_bw_bytes_per_s"] == 1.935e12
    res = runner.invoke(app, ["devices", "show", "mi300x"])
    assert res.exit_code == 0 and "MI300X" in res.output and "304" in res.output


def test_cli_unknown_device_exits_2(runner):
    res = runner.invoke(app, ["devices", "show", "R100"])
    assert res.exit_code == 2
    assert "unknown device 'R100'" in res.output and "Traceback" not in res.output


def test_cached_catalogues_cannot_be_changed_by_a_reader():
    """``catalogue()`` and ``dataset_supplement()`` are cached: one reader changing what it was handed would change
    every later reader's devices. The mappings and each spec's figures are read-only; a reader's own copy is its
    own. Truth: NVIDIA H100 SXM5 datasheet, dense BF16 989.4 TFLOP/s (costmodel/data/devices.yaml cites it)."""
    import copy
    import pickle
    from operator import setitem

    from meshplan.costmodel.devices import dataset_supplement

    h100 = catalogue()["H100-SXM"]
    for mapping, key, value in ((catalogue(), "H100-SXM", None), (h100.peak_flops, "bf16", 1.0),
                                (h100.sources, "bf16", "mine"), (dataset_supplement(), "p4", None)):
        with pytest.raises(TypeError):
            setitem(mapping, key, value)
    mine = dict(h100.peak_flops)
    mine["bf16"] = 1.0
    clone = copy.deepcopy(h100)  # copies (and pickles, for worker processes) stay read-only and equal
    assert clone == h100 == pickle.loads(pickle.dumps(h100)) and isinstance(clone.peak_flops, type(h100.peak_flops))
    assert catalogue()["H100-SXM"].peak_flops["bf16"] == 989.4e12
    assert "p4" in dataset_supplement() and "H100-SXM" in catalogue()
