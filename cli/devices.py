"""``meshplan devices``: the device catalogue, one device's figures, cluster specs, and local CPU calibration."""
from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import console, handle_errors, print_json
from meshplan.costmodel.devices import DTYPES, device_to_dict
from meshplan.planner.cluster.spec import load_cluster, preset_names
from meshplan.planner.host.calibrate import (
    CALIBRATION_STEPS,
    calibration_for,
    find_device,
    known_devices,
    load_calibration,
)

devices_app = typer.Typer(help="Device catalogue, cluster specs and local calibration.", invoke_without_command=True,
                          no_args_is_help=False)

_SHOWN_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "nvfp4")


def _tflops(dev, dtype: str) -> str:
    if dtype not in dev.peak_flops:
        return "-"
    t = dev.peak_flops[dtype] / 1e12
    return f"{t:.0f}" if t >= 100 else f"{t:.1f}" if t >= 10 else f"{t:.2f}"


@devices_app.callback()
@handle_errors
def devices(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print the catalogue as JSON.")] = False,
) -> None:
    """List the device catalogue (dense peak TFLOP/s per dtype, memory, bandwidth)."""
    if ctx.invoked_subcommand is not None:
        return
    devs = known_devices()  # with cpu-local when this host was calibrated; never measures here
    if json_out:
        print_json([device_to_dict(d) for d in devs])
        return
    table = Table(title="Device catalogue: dense peak TFLOP/s ('-' = unsupported), memory, bandwidth",
                  box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("name", no_wrap=True)
    for dt in _SHOWN_DTYPES:
        table.add_column(dt, justify="right", no_wrap=True)
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("GB/s", justify="right", no_wrap=True)
    table.add_column("SMs", justify="right", no_wrap=True)
    for d in devs:
        table.add_row(d.name, *(_tflops(d, dt) for dt in _SHOWN_DTYPES),
                      f"{d.memory_bytes / 2**30:,.0f}", f"{d.mem_bw_bytes_per_s / 1e9:,.0f}", str(d.sm_count))
    console.print(table)
    console.print("Aliases are accepted everywhere: `meshplan devices show 'NVIDIA H100 80GB HBM3'`.")


@devices_app.command("show")
@handle_errors
def show(
    name: Annotated[str, typer.Argument(help="Device name or alias (e.g. H100, a100, Tesla_T4, cpu-local).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the device as JSON.")] = False,
) -> None:
    """Show one device: every figure with its source."""
    dev = find_device(name)
    data = device_to_dict(dev)
    if json_out:
        print_json(data)
        return
    table = Table(title=f"{dev.name} ({dev.vendor}, family {dev.family})")
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("source", overflow="fold")
    for dt in DTYPES:
        if dt in dev.peak_flops:
            table.add_row(f"peak {dt}", f"{dev.peak_flops[dt] / 1e12:,.2f} TFLOP/s", dev.sources.get("peak_flops", ""))
    table.add_row("memory", f"{dev.memory_bytes / 2**30:,.1f} GiB", dev.sources.get("memory_bytes", ""))
    table.add_row("memory bandwidth", f"{dev.mem_bw_bytes_per_s / 1e9:,.1f} GB/s", dev.sources.get("mem_bw", ""))
    table.add_row("SMs / CUs / cores", str(dev.sm_count), dev.sources.get("sm_count", ""))
    table.add_row("L2 / LLC", f"{dev.l2_bytes / 2**20:,.1f} MiB", dev.sources.get("l2_bytes", ""))
    table.add_row("clock", f"{dev.clock_hz / 1e6:,.0f} MHz", dev.sources.get("clock_hz", ""))
    console.print(table)
    if dev.aliases:
        console.print(f"aliases: {', '.join(dev.aliases)}")


@devices_app.command("cluster")
@handle_errors
def cluster(
    spec: Annotated[str, typer.Argument(help="16x8xH100, 8xA100, 4xT4+1xA100, local:2, a preset or a YAML file.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the cluster as JSON.")] = False,
) -> None:
    """Show how a cluster spec is read: groups, devices and the links the cost model will use."""
    data = load_cluster(spec, calibration=calibration_for(spec)).to_dict()  # local:N: this host's calibration
    if json_out:
        print_json(data)
        return
    table = Table(title=f"{data['spec']}: {data['world_size']} devices on {data['num_nodes']} node(s)"
                        + (" (heterogeneous)" if data["heterogeneous"] else ""),
                  box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("group", "nodes", "dev/node", "device", "intra link", "GB/s", "us", "net GB/s/GPU"):
        table.add_column(col, justify="left" if col in ("device", "intra link") else "right", no_wrap=True)
    for i, g in enumerate(data["groups"]):
        il = g["intra_link"]
        table.add_row(str(i), str(g["nodes"]), str(g["devices_per_node"]), g["device"], il["name"],
                      f"{il['bandwidth_bytes_per_s'] / 1e9:,.1f}", f"{il['latency_s'] * 1e6:,.1f}",
                      f"{g['nic_link']['bandwidth_bytes_per_s'] / 1e9:,.2f}")
    console.print(table)
    for i, g in enumerate(data["groups"]):
        link = "NVLink" if g["intra_link"]["name"].startswith("nvlink") else g["intra_link"]["name"]
        console.print(f"{link} domain{f' of group {i}' if len(data['groups']) > 1 else ''}: "
                      + _domain_words(g["nvlink_domain"], g["devices_per_node"], g["nodes"]))
    inter = data["inter_link"]
    console.print(f"inter-node link: {inter['name']}, {inter['bandwidth_bytes_per_s'] / 1e9:,.2f} GB/s per GPU, "
                  f"{inter['latency_s'] * 1e6:,.1f} us; presets: {', '.join(preset_names())}")


def _domain_words(domain_gpus: int, devices_per_node: int, nodes: int) -> str:
    """A group's NVLink domain in words: the node, or the GPUs one domain joins over how many nodes, and how many
    domains the group fills (a last one only in part where its nodes do not fill it)."""
    if domain_gpus <= devices_per_node:
        return f"each node ({devices_per_node} GPUs)"
    full, rest = divmod(nodes * devices_per_node, domain_gpus)
    parts = [f"{full} full domain{'s' * (full > 1)}" if full else "", f"one of {rest} GPUs" if rest else ""]
    return (f"{domain_gpus} GPUs over {domain_gpus // devices_per_node} nodes: "
            + " and ".join(p for p in parts if p))


@devices_app.command("calibrate")
@handle_errors
def calibrate(
    json_out: Annotated[bool, typer.Option("--json", help="Print the calibration as JSON.")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer gloo calls per size, one launch per table: ~35 s "
                                        "instead of ~2 min on 2 cores, noisier figures.")] = False,
) -> None:
    """Measure this host for local:N clusters (GEMM, memory bandwidth, gloo all-reduce) and cache it."""
    steps = list(CALIBRATION_STEPS)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=json_out) as bar:
        task = bar.add_task("calibrating", total=len(steps))

        def progress(step: str) -> None:
            bar.update(task, description=step, completed=steps.index(step) if step in steps else 0)

        cal = load_calibration(force=True, progress=progress, quick=quick)
        bar.update(task, completed=len(steps))
    data = {"cache": str(cal.path), "device": device_to_dict(cal.device),
            "link": {"name": cal.link.name, "bandwidth_bytes_per_s": cal.link.bandwidth_bytes_per_s,
                     "latency_s": cal.link.latency_s},
            "measured": cal.measured}
    if json_out:
        print_json(data)
        return
    d = cal.device
    table = Table(title=f"{d.name}: this host, 1 thread per process (cached at {cal.path})")
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_row("GEMM fp32", f"{d.peak_flops['fp32'] / 1e9:,.1f} GFLOP/s")
    table.add_row("GEMM bf16", f"{d.peak_flops['bf16'] / 1e9:,.1f} GFLOP/s")
    table.add_row("memory bandwidth (copy)", f"{d.mem_bw_bytes_per_s / 1e9:,.2f} GB/s")
    table.add_row("gloo all-reduce bandwidth", f"{cal.link.bandwidth_bytes_per_s / 1e9:,.3f} GB/s")
    table.add_row("gloo latency (alpha)", f"{cal.link.latency_s * 1e6:,.1f} us")
    table.add_row("fit check at 8 MiB (predicted/measured)", f"{cal.measured.get('check_ratio', float('nan')):.2f}")
    table.add_row("memory (host RAM)", f"{d.memory_bytes / 2**30:,.1f} GiB")
    table.add_row("logical CPUs", str(d.sm_count))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(devices_app, name="devices")
