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


def advice_markdown(a) -> list[str]:
    """The advice section of the summary: the verdict line and, when a faster layout is predicted, its changes."""
    lines = ["### meshplan advise", "", advice_line(a), "",
             f"The layout that ran, re-priced: {1e3 * a.ran_predicted_s:.1f} ms vs {1e3 * a.measured_s:.1f} ms "
             f"measured ({100 * a.price_error:+.1f}%)."]
    if not a.still_best:
        lines += ["", "| change | step after (ms) | gain (ms) |", "|---|---:|---:|"]
        lines += [f"| {c.label()} | {1e3 * c.step_s:.1f} | {1e3 * c.gain_s:+.1f} |" for c in a.changes]
        lines += ["", "Shares: each change applied one at a time in a fixed order (sequential attribution)."]
    return lines
