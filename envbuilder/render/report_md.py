"""The history report as Markdown tables, for a ticket: per env its newest facts, the fact changes, each check's
record per partition (newest status, passes out of runs) and each figure's newest value beside its median and
range. Record text is escaped for Markdown and for the HTML a ticket system renders inside it. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from envbuilder.render import reportdata as data
from envbuilder.render import sitedata


def cell(value: object) -> str:
    """A table cell: HTML-escaped (``&`` and ``<``: no tag, no entity), pipes and backslashes escaped, one line,
    and the characters that start Markdown emphasis, code or links escaped too."""
    out = str(value).replace("&", "&amp;").replace("<", "&lt;").replace("\\", "\\\\").replace("|", "\\|")
    for mark in ("`", "*", "_", "[", "]"):
        out = out.replace(mark, "\\" + mark)
    return " ".join(out.split()) or " "


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def render(
    envs: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
    generated: str,
    drift: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
) -> str:
    lines = [
        "# envbuilder validation history",
        "",
        f"Generated {cell(generated)} from the history store.",
        "",
    ]
    for name, runs in envs:
        lines += _env(name, data.timed(runs), (drift or {}).get(name, ()))
    return "\n".join(lines) + "\n"


def render_site(
    envs: Sequence[sitedata.SiteEnv], generated: str, store: str, skipped: Sequence[tuple[str, str]]
) -> str:
    """The site's report: per recipe, where it passes, its envs, drift, fact changes, checks and figures."""
    recipes = sitedata.by_recipe(envs)
    lines = [
        "# envbuilder site validation history",
        "",
        f"Generated {cell(generated)} from the site's history store {cell(store)}: {len(recipes)} recipe(s), "
        f"{len(envs)} env(s) of {len({one.user for one in envs})} user(s).",
        "",
    ]
    for recipe, group in recipes:
        lines += _site_recipe(recipe, group)
    if skipped:
        lines += [f"## Not read ({len(skipped)})", ""]
        lines += table(("path", "why"), skipped)
    return "\n".join(lines) + "\n"


def _site_recipe(recipe: str, envs: Sequence[sitedata.SiteEnv]) -> list[str]:
    runs = sitedata.combined(envs)
    lines = [f"## recipe {cell(recipe)}", ""]
    if not runs:
        return [*lines, "No validation recorded for this recipe.", ""]
    lines += [
        f"{len(envs)} env(s) of {len({one.user for one in envs})} user(s), {len(runs)} run(s) from "
        f"{data.stamp(runs[0][0])} to {data.stamp(runs[-1][0])}.",
        "",
        "### Where it passes",
        "",
    ]
    lines += table(sitedata.WHERE_HEADER, sitedata.where_rows(envs))
    lines += ["### Envs (newest run per partition)", ""]
    lines += table(sitedata.ENV_HEADER, sitedata.env_rows(envs))
    drift = sitedata.drift_rows(envs)
    if drift:
        lines += ["### Drift in the newest runs", ""]
        lines += table(("env", "partition", "drift", "fact change at"), drift)
    changes = sitedata.changes(envs)
    if changes:
        lines += ["### Fact changes", ""]
        lines += table(("time", "change"), [(data.stamp(c.time), c.label) for c in changes])
    plotted = sitedata.per_env(envs)
    lines += ["### Checks per partition and env", ""]
    lines += table(("check", "newest", "passed", "statuses, oldest first"), _check_rows(plotted))
    lines += ["### Figures per partition and env", ""]
    lines += table(
        ("figure", "unit", "partition, env", "newest", "median", "min", "max", "runs"), _figure_rows(plotted)
    )
    return lines


def _env(
    name: str, runs: Sequence[tuple[float, Mapping[str, Any]]], drift: Sequence[Mapping[str, Any]]
) -> list[str]:
    lines = [f"## {cell(name)}", ""]
    if not runs:
        return [*lines, "No validation recorded for this env.", ""]
    when, newest = runs[-1]
    lines += [
        f"{len(runs)} run(s) from {data.stamp(runs[0][0])} to {data.stamp(when)}; newest: "
        f"**{cell(data.text(newest.get('status')) or '?')}** on {cell(data.partition(newest))}.",
        "",
    ]
    lines += table(("fact", "value"), data.latest_facts(newest))
    changes = data.fact_changes(runs)
    linked = data.drift_links(drift, runs, changes)
    if linked:
        lines += ["### Drift in the newest runs", ""]
        rows = [
            (
                data.text(alarm.get("partition")) or data.partition({}),
                data.text(alarm.get("text")),
                ", ".join(data.stamp(changes[i].time) for i in found) or "none recorded",
            )
            for alarm, found in linked
        ]
        lines += table(("partition", "drift", "fact change at"), rows)
    if changes:
        lines += ["### Fact changes", ""]
        lines += table(("time", "change"), [(data.stamp(c.time), c.label) for c in changes])
    lines += ["### Checks", ""]
    lines += table(("check", "newest", "passed", "statuses, oldest first"), _check_rows(runs))
    lines += ["### Figures", ""]
    lines += table(
        ("figure", "unit", "partition", "newest", "median", "min", "max", "runs"), _figure_rows(runs)
    )
    return lines


def _check_rows(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for label, cells in data.status_rows(runs):
        statuses = [c.status for c in cells]
        passed = sum(s == "pass" for s in statuses)
        rows.append((label, statuses[-1], f"{passed}/{len(statuses)}", " ".join(statuses[-20:])))
    return rows


def _figure_rows(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    units = data.figure_units(runs)
    for figure, series in data.figure_series(runs).items():
        for one in series:
            values = [y for _, y in one.points]
            rows.append(
                (
                    figure,
                    units.get(figure, ""),
                    one.label,
                    f"{values[-1]:.4g}",
                    f"{statistics.median(values):.4g}",
                    f"{min(values):.4g}",
                    f"{max(values):.4g}",
                    len(values),
                )
            )
    return rows
