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


def junit_xml(r: CheckResult) -> str:
    """JUnit XML (one test suite, one case per check) for CI test reporters, built with ``xml.etree`` (escaping
    is the library's)."""
    cases = [("step_time", r.passed, verdict_line(r))]
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
            ET.SubElement(case, "failure", message=_xml_text(msg), type="StepTimeDrift").text = _xml_text(msg)
        if r.warnings:
            ET.SubElement(case, "system-out").text = _xml_text("\n".join("warning: " + w for w in r.warnings))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


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
