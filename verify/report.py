"""``meshplan check``'s reports: the verdict line, JUnit XML for CI test reporters, a Markdown summary."""
from __future__ import annotations

from meshplan.verify.check import CheckResult


def _esc(s: str) -> str:
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;"))


def verdict_line(r: CheckResult) -> str:
    word = "within" if r.passed else "outside"
    line = (f"step time {1e3 * r.measured_s:.1f} ms measured vs {1e3 * r.predicted_s:.1f} ms predicted: "
            f"{100 * r.error:+.1f}%, {word} the {100 * r.tolerance:.0f}% tolerance")
    if r.moved_phase:
        line += f"; the phase that differs most: {r.moved_phase}"
    return line


def junit_xml(r: CheckResult) -> str:
    """JUnit XML (one test suite, one case per check) for CI test reporters."""
    cases = [("step_time", r.passed, verdict_line(r))]
    fails = sum(1 for _, ok, _ in cases if not ok)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites tests="{len(cases)}" failures="{fails}">',
           f'  <testsuite name="meshplan check" tests="{len(cases)}" failures="{fails}" errors="0" '
           f'time="{sum(r.step_s):.3f}">',
           f'    <properties><property name="plan" value="{_esc(r.plan_path)}"/>'
           f'<property name="run" value="{_esc(r.run_path)}"/></properties>']
    for name, ok, msg in cases:
        out.append(f'    <testcase classname="meshplan.check" name="{name}" time="{r.measured_s:.6f}">')
        if not ok:
            out.append(f'      <failure message="{_esc(msg)}" type="StepTimeDrift">{_esc(msg)}</failure>')
        if r.warnings:
            out.append(f"      <system-out>{_esc(chr(10).join('warning: ' + w for w in r.warnings))}</system-out>")
        out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(out)


def markdown(r: CheckResult) -> str:
    """Markdown summary (GitHub Actions ``$GITHUB_STEP_SUMMARY``)."""
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
    return "\n".join(lines) + "\n"
