"""A validation report as JUnit XML (``validate --junit FILE``), for CI systems and site dashboards: one test case
per check, its ranks' failures and warnings as the case's failure and output, drift as cases of their own."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from envbuilder.validate.report import Report


def junit(report: Report) -> str:
    """JUnit XML for site CI dashboards: one testcase per check."""
    suite = ET.Element(
        "testsuite",
        name=f"envbuilder.validate.{report.env}",
        tests=str(len(report.rows)),
        failures=str(sum(r.status == "fail" for r in report.rows)),
        skipped=str(sum(r.status == "skip" for r in report.rows)),
        errors="0",
        time=f"{report.seconds:.2f}",
        timestamp=report.started,
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("launcher", report.launcher),
        ("device", report.device),
        ("world", str(report.world)),
        ("partition", report.partition or ""),
    ):
        ET.SubElement(props, "property", name=key, value=value)
    for row in report.rows:
        case = ET.SubElement(
            suite, "testcase", classname=f"envbuilder.{report.env}", name=row.check, time="0"
        )
        if row.status == "fail":
            failure = ET.SubElement(case, "failure", message=row.cause or "failed", type="ValidationFailed")
            failure.text = "\n".join(filter(None, [row.cause, f"hint: {row.hint}" if row.hint else None]))
        elif row.status == "skip":
            ET.SubElement(case, "skipped", message=row.reason or "skipped")
        # JUnit has no warning: a WARN passes, with its cause beside the figures.
        lines = [f"{k} = {v['value']} {v.get('unit', '')}".rstrip() for k, v in row.figures.items()]
        if row.status == "warn":
            lines.append(f"warning: {row.cause}")
        if row.detail:
            lines.append(row.detail)
        if lines:
            ET.SubElement(case, "system-out").text = "\n".join(lines)
    if report.drift:
        _drift_case(suite, report)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _drift_case(suite: ET.Element, report: Report) -> None:
    """The drift alarms as one more testcase: failed where the recipe's threshold failed the run."""
    suite.set("tests", str(len(report.rows) + 1))
    case = ET.SubElement(suite, "testcase", classname=f"envbuilder.{report.env}", name="drift", time="0")
    texts = [str(d.get("text")) for d in report.drift]
    if report.drift_failed:
        suite.set("failures", str(int(suite.get("failures") or 0) + 1))
        failed = "; ".join(str(d.get("text")) for d in report.drift if d.get("fails"))
        ET.SubElement(case, "failure", message=failed, type="ValidationFailed")
    ET.SubElement(case, "system-out").text = "\n".join(texts)
