"""``meshplan check``'s reports: the verdict line, JUnit XML for CI test reporters, a Markdown summary."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from meshplan.verify.check import CheckResult

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(s: str) -> str:
    """XML 1.0 cannot hold most control characters even escaped: they become U+FFFD (a path or warning holding one
    still yields a file every JUnit reader parses)."""
    return _XML_ILLEGAL.sub("\ufffd", str(s))


def verdict_line(r: CheckResult) -> str:
    word = "within" if r.passed else "outside"
    line = (f"step time {1e3 * r.measured_s:.1f} ms measured vs {1e3 * r.predicted_s:.1f} ms predicted: "
            f"{100 * r.error:+.1f}%, {word} the {100 * r.tolerance:.0f}% tolerance")
    if r.moved_phase:
        line += f"; the phase that differs most: {r.moved_phase}"
    return line


def advice_line(a) -> str:
    """One line of ``meshplan advise``'s answer (a ``verify.advise.job.Advice``)."""
    if a.still_best:
        return f"layout {a.ran_layout} is still the best one the search finds on {a.cluster}"
    shares = "; ".join(f"{c.label()} {1e3 * c.gain_s:+.1f} ms" for c in a.changes)
    return (f"a faster layout: {a.best_layout}, {100 * a.gain:.1f}% faster predicted "
            f"({1e3 * a.ran_predicted_s:.1f} -> {1e3 * a.best_predicted_s:.1f} ms; {shares}); plan {a.plan_path}")


def junit_xml(r: CheckResult, advice=None) -> str:
    """JUnit XML (one test suite, one case per check) for CI test reporters, built with ``xml.etree`` (escaping
    is the library's). With ``advice`` (``verify.advise.job.Advice``), a ``layout`` case that fails when a faster
    layout is predicted."""
    cases = [("step_time", r.passed, verdict_line(r))]
    if advice is not None:
        cases.append(("layout", advice.still_best, advice_line(advice)))
    fails = sum(1 for _, ok, _ in cases if not ok)
    root = ET.Element("testsuites", tests=str(len(cases)), failures=str(fails))
    suite = ET.SubElement(root, "testsuite", name="meshplan check", tests=str(len(cases)), failures=str(fails),
                          errors="0", time=f"{sum(r.step_s):.3f}")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="plan", value=_xml_text(r.plan_path))
    ET.SubElement(props, "property", name="run", value=_xml_text(r.run_path))
    for name, ok, msg in cases:
        case = ET.SubElement(suite, "testcase", classname="meshplan.check", name=name, time=f"{r.measured_s:.6f}")
        if not ok:
            kind = "StepTimeDrift" if name == "step_time" else "FasterLayout"
            ET.SubElement(case, "failure", message=_xml_text(msg), type=kind).text = _xml_text(msg)
        if r.warnings:
            ET.SubElement(case, "system-out").text = _xml_text("\n".join("warning: " + w for w in r.warnings))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def markdown(r: CheckResult, advice=None) -> str:
    """Markdown summary (GitHub Actions ``$GITHUB_STEP_SUMMARY``); with ``advice``, its section."""
    icon = "PASS" if r.passed else "FAIL"
    lines = [f"## meshplan check: {icon}", "", f"`{r.plan_path}` vs `{r.run_path}`", "", verdict_line(r), "",
             "| | predicted | measured |", "|---|---:|---:|",
             f"| step time (ms) | {1e3 * r.predicted_s:.1f} | {1e3 * r.measured_s:.1f} |",
             f"| peak memory (MiB) | {r.predicted_peak_bytes / 2**20:.1f} | "
             + (f"{r.measured_peak_bytes / 2**20:.1f} |" if r.measured_peak_bytes is not None else "not recorded |")]
    for ph in r.phases:
        lines.append(f"| {ph['phase']} (ms) | {1e3 * ph['predicted_s']:.1f} | {1e3 * ph['measured_s']:.1f} |")
    lines += ["", f"Measured steps: {r.steps}, spread (p10-p90) {100 * r.spread:.1f}%."]
    if r.breakdown_rank is not None:
        lines.append(f"Breakdown of the critical rank {r.breakdown_rank}.")
    for w in r.warnings:
        lines.append(f"- warning: {w}")
    if advice is not None:
        lines += ["", *advice_markdown(advice)]
    return "\n".join(lines) + "\n"


def check_page(results: list[CheckResult]) -> str:
    """``meshplan check --report``: the verdict, predicted against measured per phase (the last run given), the
    measured steps against the prediction, and, given several runs, step time and phases over them (in the
    order given). Values in, HTML out (``core.htmlpage``)."""
    from meshplan.core.htmlpage import Section, page

    last = results[-1]
    word = "PASS" if all(r.passed for r in results) else "FAIL"  # as the exit code: the worst run decides
    verdicts = tuple((f"run {r.run_path}", f"{'PASS' if r.passed else 'FAIL'}: {verdict_line(r)}") for r in results)
    mem = (f"{last.predicted_peak_bytes / 2**20:,.0f} MiB predicted, "
           + (f"{last.measured_peak_bytes / 2**20:,.0f} MiB measured" if last.measured_peak_bytes is not None
              else "not recorded by the run"))
    steps = f"{last.steps}, spread (p10-p90) {100 * last.spread:.1f}%" + (" (noisy)" if last.noisy else "")
    facts = verdicts + (("plan", last.plan_path), ("peak memory", mem), ("measured steps", steps))
    facts += tuple(("warning", w) for w in last.warnings)
    sections = [Section("Verdict", facts=facts)]
    of_last = f" ({last.run_path}, the last run given)" if len(results) > 1 else ""
    if last.phases:
        sections.append(Section(
            "Predicted against measured, per phase" + of_last,
            note="Seconds per step. The measured split is the critical rank's "
                 + (f"(rank {last.breakdown_rank}); " if last.breakdown_rank is not None else "; ")
                 + (f"the phase that differs most: {last.moved_phase}." if last.moved_phase else ""),
            figure=_phase_figure(last)))
    else:
        sections.append(Section("Predicted against measured, per phase" + of_last,
                                note="No phase split: the run was checked without loading its traces "
                                     "(--no-breakdown), or they hold none."))
    sections.append(Section("Measured steps against the prediction",
                            note=f"Each measured step of {last.run_path}; the band is the "
                                 f"{100 * last.tolerance:.0f}% tolerance around the prediction.",
                            figure=_steps_figure(last)))
    if len(results) > 1:
        sections.append(Section("Over the runs given", note="Median measured step time of each run (in the order "
                                                            "given) against its prediction and tolerance band; "
                                                            "bars: the measured phases.",
                                figure=_runs_figure(results)))
    against = last.run_path if len(results) == 1 else f"{len(results)} runs"
    return page(f"meshplan check: {word}", f"{last.plan_path} against {against}", sections,
                footer="meshplan check --report; figures drawn with Plotly")


def _phase_figure(r: CheckResult):
    import plotly.graph_objects as go

    from meshplan.core.htmlpage import BACKWARD, FORWARD, styled

    names = ["step"] + [ph["phase"] for ph in r.phases]
    pred = [r.predicted_s] + [ph["predicted_s"] for ph in r.phases]
    meas = [r.measured_s] + [ph["measured_s"] for ph in r.phases]
    fig = go.Figure([go.Bar(x=names, y=pred, name="predicted", marker_color=FORWARD,
                            hovertemplate="%{x}: %{y:.4f} s predicted<extra></extra>"),
                     go.Bar(x=names, y=meas, name="measured", marker_color=BACKWARD,
                            text=[f"{100 * (m - p) / p:+.0f}%" if p else "" for p, m in zip(pred, meas)],
                            textposition="outside", hovertemplate="%{x}: %{y:.4f} s measured<extra></extra>")])
    return styled(fig, 360, barmode="group", yaxis_title="seconds per step")


def _steps_figure(r: CheckResult):
    import plotly.graph_objects as go

    from meshplan.core.htmlpage import BACKWARD, styled

    n = len(r.step_s)
    fig = go.Figure([go.Scatter(x=list(range(1, n + 1)), y=r.step_s, mode="markers+lines", name="measured step",
                                marker=dict(color=BACKWARD, size=7), line=dict(color=BACKWARD, width=1),
                                hovertemplate="step %{x}: %{y:.4f} s<extra></extra>")])
    fig.add_hrect(y0=r.predicted_s * (1 - r.tolerance), y1=r.predicted_s * (1 + r.tolerance), fillcolor="#4C72B0",
                  opacity=0.12, line_width=0)
    fig.add_hline(y=r.predicted_s, line=dict(color="#4C72B0", dash="dash"),
                  annotation_text=f"predicted {r.predicted_s:.4f} s", annotation_position="top left")
    return styled(fig, 320, xaxis_title="measured step (median of the slowest rank's)", yaxis_title="seconds")


def _runs_figure(results: list[CheckResult]):
    import plotly.graph_objects as go

    from meshplan.core.htmlpage import PALETTE, styled

    labels = [f"{i + 1}: {r.run_path.rstrip('/').rsplit('/', 1)[-1]}" for i, r in enumerate(results)]
    fig = go.Figure()
    phases = sorted({ph["phase"] for r in results for ph in r.phases})
    for k, name in enumerate(phases):
        fig.add_trace(go.Bar(x=labels, y=[next((ph["measured_s"] for ph in r.phases if ph["phase"] == name), 0.0)
                                          for r in results], name=f"measured {name}",
                             marker_color=PALETTE[k % len(PALETTE)], opacity=0.55))
    pred = [r.predicted_s for r in results]
    fig.add_trace(go.Scatter(x=labels, y=[p * (1 + r.tolerance) for p, r in zip(pred, results)], mode="lines",
                             line=dict(width=0), showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=labels, y=[p * (1 - r.tolerance) for p, r in zip(pred, results)], mode="lines",
                             line=dict(width=0), fill="tonexty", fillcolor="rgba(76,114,176,0.15)",
                             name="tolerance", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=labels, y=pred, mode="lines+markers", name="predicted",
                             line=dict(color="#4C72B0", dash="dash"), hovertemplate="%{y:.4f} s<extra></extra>"))
    fig.add_trace(go.Scatter(x=labels, y=[r.measured_s for r in results], mode="lines+markers",
                             name="measured step", line=dict(color="#CC3311"),
                             marker=dict(size=9, symbol=["circle" if r.passed else "x" for r in results]),
                             hovertemplate="%{y:.4f} s<extra></extra>"))
    return styled(fig, 380, barmode="stack", yaxis_title="seconds per step")


def _ms(s) -> str:
    return "not valid alone" if s is None else f"{1e3 * s:.1f}"


def advice_markdown(a) -> list[str]:
    """The advice section of the summary: the verdict line and, when a faster layout is predicted, its changes."""
    lines = ["### meshplan advise", "", advice_line(a), "",
             f"The layout that ran, re-priced: {1e3 * a.ran_predicted_s:.1f} ms vs {1e3 * a.measured_s:.1f} ms "
             f"measured ({100 * a.price_error:+.1f}%)."]
    if not a.still_best:
        lines += ["", "| change | share of the gain (ms) | step with it alone (ms) |", "|---|---:|---:|"]
        lines += [f"| {c.label()} | {1e3 * c.gain_s:+.1f} | {_ms(c.alone_s)} |" for c in a.changes]
        lines += ["", "Shares: each change's step-time change averaged over every order of applying the changes "
                  "(Shapley); they add up to the gain, and a change that only adds work gets zero or less."]
    return lines
