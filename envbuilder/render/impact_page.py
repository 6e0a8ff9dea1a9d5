"""`envbuilder impact`'s table as a page people look at: one self-contained HTML file in the history report's style
(:mod:`.report_html`: its style inline, no script, no link outside the file) or Markdown for a ticket. The node's
facts before and after the change, the notes, the counts per verdict, then one row per recipe and shared record
(worst first): BREAKS, BROKEN, CHANGES, FIXED, UNAFFECTED, with why (the reasons, or the torch build old -> new)
and where it came from. Every text is escaped. Pure: the impact (``plan.impact``) and the facts in words in, text
out."""

from __future__ import annotations

from collections.abc import Sequence

from envbuilder.plan import impact
from envbuilder.render.report_html import STYLE
from envbuilder.render.report_md import cell, table
from envbuilder.render.svgplot import esc

#: The verdicts' classes on the page: red for what breaks, grey for what was broken already, blue for a change.
_CSS = {
    impact.BREAKS: "status-fail",
    impact.BROKEN: "status-other",
    impact.CHANGES: "status-change",
    impact.FIXED: "status-pass",
    impact.UNAFFECTED: "status-pass",
}
_EXTRA_STYLE = ".status-change { color: #0969da; font-weight: bold; }\n"
_HEADER = ("verdict", "recipe or env", "why, or old -> new", "from")


def _subject(verdict: impact.Verdict) -> str:
    return verdict.subject if verdict.kind == "recipe" else f"env {verdict.subject}"


def _summary(report: impact.Impact) -> str:
    counts = report.counts
    return ", ".join(f"{counts[s]} {s.lower()}" for s in impact.STATUSES)


def render_html(report: impact.Impact, facts: Sequence[str], generated: str) -> str:
    """The page; ``facts``: the node's facts before and after the change, in words (one line each)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>envbuilder impact: {esc(report.after_from)}</title>",
        f"<style>{STYLE}{_EXTRA_STYLE}</style></head><body>",
        "<h1>envbuilder impact of a planned node change</h1>",
        f'<p class="note">Generated {esc(generated)}.</p>',
        "<table>",
    ]
    for label, source, line in zip(("before", "after"), (report.before_from, report.after_from), facts):
        parts.append(f"<tr><th>{label}</th><td>{esc(source)}<br>{esc(line)}</td></tr>")
    parts.append("</table>")
    parts += [f'<p class="note">note: {esc(note)}</p>' for note in report.notes]
    parts.append(f"<h2>{len(report.verdicts)} recipe(s) and env(s): {esc(_summary(report))}</h2>")
    parts.append("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in _HEADER) + "</tr>")
    for verdict in report.verdicts:
        parts.append(
            f'<tr class="verdict"><td><span class="{_CSS[verdict.status]}">{esc(verdict.status)}</span></td>'
            f"<td>{esc(_subject(verdict))}</td><td>{esc(verdict.why)}</td><td>{esc(verdict.source)}</td></tr>"
        )
    parts += ["</table>", "</body></html>"]
    return "\n".join(parts) + "\n"


def render_md(report: impact.Impact, facts: Sequence[str], generated: str) -> str:
    lines = ["# envbuilder impact of a planned node change", "", f"Generated {cell(generated)}.", ""]
    lines += table(
        ("node", "facts from", "facts"),
        list(zip(("before", "after"), (report.before_from, report.after_from), facts)),
    )
    lines += [f"note: {cell(note)}" for note in report.notes]
    lines += ["", f"## {len(report.verdicts)} recipe(s) and env(s): {_summary(report)}", ""]
    lines += table(
        _HEADER,
        [(v.status, _subject(v), v.why, v.source) for v in report.verdicts],
    )
    return "\n".join(lines) + "\n"
