"""Self-contained HTML report pages: Plotly figures under headings, with plotly.js inlined once, so a page opens
offline (``meshplan plan|check|replay --report``).

Plotly (``plotly.io.to_html``) draws; this module only lays figures out on one page and holds the look every
report shares. Pages are pure values: figures and text in, an HTML string out; the caller writes it
(``core.atomic.write_atomic``).
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from meshplan.core.atomic import refuse_overwrite
from meshplan.core.errors import MeshplanError

# One palette for every report (Plotly's "Safe" qualitative colours: distinct for colour-blind readers)
PALETTE = ("#88CCEE", "#CC6677", "#DDCC77", "#117733", "#332288", "#AA4499", "#44AA99", "#999933", "#882255",
           "#661100", "#6699CC", "#888888")
FORWARD, BACKWARD, WEIGHT = "#4C72B0", "#DD8452", "#55A868"  # pipeline passes, in every schedule drawing

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; margin: 0;
       background: #f6f7f9; color: #1f2328; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
.sub { color: #57606a; margin: 0 0 18px; font-size: 14px; }
section { background: #fff; border: 1px solid #d8dee4; border-radius: 8px; padding: 14px 18px; margin: 14px 0; }
h2 { font-size: 17px; margin: 2px 0 6px; }
p.note { color: #57606a; font-size: 13px; margin: 2px 0 8px; }
table.facts { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
table.facts td { padding: 2px 14px 2px 0; vertical-align: top; }
table.facts td:first-child { color: #57606a; }
footer { color: #8c959f; font-size: 12px; margin-top: 18px; }
"""


@dataclass(frozen=True)
class Section:
    """One block of a page: a heading, a note under it, optional key/value facts, optional figure."""

    heading: str
    note: str = ""
    figure: Optional[go.Figure] = None
    facts: tuple[tuple[str, str], ...] = ()


def styled(fig: go.Figure, height_px: int, **layout) -> go.Figure:
    """``fig`` in the reports' look: white template, compact margins, legend on top, ``height_px`` tall; ``layout``
    overrides any of them."""
    look = dict(template="plotly_white", height=height_px, margin=dict(l=70, r=30, t=40, b=55), font=dict(size=12),
                legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    fig.update_layout(**{**look, **layout})
    return fig


def page(title: str, subtitle: str, sections: list[Section], footer: str = "") -> str:
    """The whole page: plotly.js once in the head, each section's figure rendered into its own div."""
    body = []
    for i, s in enumerate(sections):
        parts = [f"<h2>{html.escape(s.heading)}</h2>"]
        if s.note:
            parts.append(f'<p class="note">{html.escape(s.note)}</p>')
        if s.facts:
            rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in s.facts)
            parts.append(f'<table class="facts">{rows}</table>')
        if s.figure is not None:
            div = pio.to_html(s.figure, full_html=False, include_plotlyjs=False, div_id=f"chart-{i}",
                              config={"displaylogo": False, "responsive": True, "displayModeBar": "hover"})
            parts.append(f'<div class="mp-chart">{div}</div>')
        body.append("<section>" + "".join(parts) + "</section>")
    foot = f"<footer>{html.escape(footer)}</footer>" if footer else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
            f"<body><main><h1>{html.escape(title)}</h1><p class=\"sub\">{html.escape(subtitle)}</p>"
            + "".join(body) + foot + "</main></body></html>\n")


def check_report_path(out: str | os.PathLike, inputs: dict[str, object], flag: str = "--report") -> Path:
    """``out`` as a path a report may be written to: not a folder, not one of the command's inputs
    (``{option: path}``, ``None`` skipped).

    Raises:
        MeshplanError: naming the flag, the path and the problem.
    """
    p = Path(out)
    if p.is_dir():
        raise MeshplanError(f"{flag} {p}: is a folder; give a file name such as {p / 'report.html'}")
    refuse_overwrite(p, inputs, flag)
    return p
