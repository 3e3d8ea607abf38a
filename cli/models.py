"""``meshplan models``: list the bundled model presets, or show one model's normalised spec."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from meshplan.cli.common import console, handle_errors, print_json
from meshplan.planner.model.config import list_presets, load_model

models_app = typer.Typer(help="Model presets and normalised model specs.", invoke_without_command=True,
                         no_args_is_help=False)


def _billions(n: int) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


@models_app.callback()
@handle_errors
def models(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print the preset list as JSON.")] = False,
) -> None:
    """List model presets (name, type, total and active parameters)."""
    if ctx.invoked_subcommand is not None:
        return
    presets = list_presets()
    if json_out:
        print_json(presets)
        return
    table = Table(title="Model presets")
    table.add_column("name", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("params", justify="right", no_wrap=True)
    table.add_column("active", justify="right", no_wrap=True)
    table.add_column("source", overflow="fold")
    for p in presets:
        active = _billions(p["active_params"]) if p["active_params"] != p["num_params"] else "="
        table.add_row(p["name"], p["model_type"], _billions(p["num_params"]), active, p["source"])
    console.print(table)
    console.print("Aliases and HF ids are accepted too: `meshplan models show llama-3.1-8b`.")


@models_app.command("show")
@handle_errors
def show(
    model: Annotated[str, typer.Argument(help="Preset name, alias, HF id of a preset, or a config.json path.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the spec as JSON.")] = False,
    mtp: Annotated[bool, typer.Option("--mtp", help="Count DeepSeek-V3 multi-token-prediction modules.")] = False,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", min=1,
                                                   help="Also report training FLOPs per token at this length.")] = None,
) -> None:
    """Show the normalised spec of one model, with its exact parameter counts."""
    spec = load_model(model, mtp=mtp)
    data = spec.to_dict()
    if seq_len is not None:
        data["seq_len"] = seq_len
        data["model_flops_per_token"] = spec.model_flops_per_token(seq_len)
    if json_out:
        print_json(data)
        return
    table = Table(title=f"{spec.name} ({spec.model_type})", show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in data.items():
        if key == "moe_layers" and value:
            value = f"{len(value)} layers: {value[0]}..{value[-1]}"
        elif isinstance(value, int) and not isinstance(value, bool) and key.endswith("params"):
            value = f"{value:,} ({_billions(value)})"
        elif key == "model_flops_per_token":
            value = f"{value / 1e9:,.2f} GFLOP"
        table.add_row(key, str(value))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
