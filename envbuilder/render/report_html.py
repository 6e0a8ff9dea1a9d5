"""The history report as one self-contained HTML page: its style inline, its plots inline SVG
(:mod:`.svgplot`), no script, no font, no link to anything outside the file, so that it opens from a mail or a
ticket on a machine without a network. Per env: its newest run and facts, the fact changes, each check's status
per partition over time, every figure over time with the changes marked, the NCCL sweep and the figures per rank
where a run holds them. Every text taken from a record is escaped. Pure: records in, text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from envbuilder.render import reportdata as data
from envbuilder.render import sitedata
from envbuilder.render.svgplot import LOG2, TIME, Axis, esc, line_chart, status_grid

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #24292f; background: #ffffff; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { font-size: 14px; margin-top: 18px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
.status-pass { color: #1a7f37; font-weight: bold; } .status-fail { color: #d1242f; font-weight: bold; }
.status-other { color: #6e7781; font-weight: bold; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
svg.plot { border: 1px solid #eaeef2; background: #ffffff; }
.note { color: #57606a; font-size: 12px; }
"""


def render(
    envs: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
    generated: str,
    drift: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
) -> str:
    """The page for ``envs``: (name, that env's history records) pairs, in the order given; ``drift``: per env,
    its newest runs' drift alarms (``historymodel.Drift.to_json``)."""
    names = ", ".join(name for name, _ in envs)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>envbuilder report: {esc(names)}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>envbuilder validation history</h1>",
        f'<p class="note">Generated {esc(generated)} from the history store; {len(envs)} env(s).</p>',
    ]
    for n, (name, runs) in enumerate(envs):
        parts += _env(name, data.timed(runs), (drift or {}).get(name, ()), f"env{n}")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_site(
    envs: Sequence[sitedata.SiteEnv], generated: str, store: str, skipped: Sequence[tuple[str, str]]
) -> str:
    """The site's page: per recipe of the site's store, where it passes, its envs, drift, fact changes, checks
    and figures over time across every user's envs; then what could not be read (``skipped``: path, why)."""
    recipes = sitedata.by_recipe(envs)
    users = {one.user for one in envs}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>envbuilder site report: {esc(store)}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>envbuilder site validation history</h1>",
        f'<p class="note">Generated {esc(generated)} from the site\'s history store {esc(store)}: '
        f"{len(recipes)} recipe(s), {len(envs)} env(s) of {len(users)} user(s).</p>",
    ]
    for n, (recipe, group) in enumerate(recipes):
        parts += _site_recipe(recipe, group, f"recipe{n}")
    if skipped:
        parts.append(f"<h2>Not read ({len(skipped)})</h2><ul>")
        parts += [f"<li>{esc(path)}: {esc(why)}</li>" for path, why in skipped]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], status_at: int = -1) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{_status(v) if i == status_at else esc(v)}</td>" for i, v in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _site_recipe(recipe: str, envs: Sequence[sitedata.SiteEnv], ids: str) -> list[str]:
    runs = sitedata.combined(envs)
    users = sorted({one.user for one in envs})
    parts = [f'<section class="recipe"><h2>recipe {esc(recipe)}</h2>']
    if not runs:
        return [*parts, '<p class="note">No validation recorded for this recipe.</p></section>']
    parts.append(
        f"<p>{len(envs)} env(s) of {len(users)} user(s), {len(runs)} run(s) from "
        f"{esc(data.stamp(runs[0][0]))} to {esc(data.stamp(runs[-1][0]))}.</p>"
    )
    parts.append("<h3>Where it passes</h3>")
    parts.append(_table(sitedata.WHERE_HEADER, sitedata.where_rows(envs)))
    parts.append("<h3>Envs (newest run per partition)</h3>")
    parts.append(_table(sitedata.ENV_HEADER, sitedata.env_rows(envs), status_at=4))
    changes = sitedata.changes(envs)
    linked = [(f"{who} on {part}", text, found) for who, part, text, found in sitedata.drift_links(envs)]
    parts += _drift_and_changes(ids, changes, linked)
    plotted = sitedata.per_env(envs)
    parts.append("<h3>Checks per partition and env over time</h3>")
    parts.append(status_grid(f"{recipe}: checks over time (oldest left)", data.status_rows(plotted)))
    parts += _figures(f"recipe {recipe}", plotted, changes)
    parts.append("</section>")
    return parts


def _drift_and_changes(
    prefix: str, changes: Sequence[data.Change], linked: Sequence[tuple[str, str, Sequence[int]]]
) -> list[str]:
    """The drift alarms (where, the alarm in words, the indexes of the fact changes it names), each linked to
    those changes in the list of fact changes below it (whose items have ids ``PREFIX-change-N``)."""
    parts = []
    if linked:
        parts.append("<h3>Drift in the newest runs</h3><ul>")
        for where, text, found in linked:
            links = ", ".join(
                f'<a href="#{prefix}-change-{i}">{esc(data.stamp(changes[i].time))}</a>' for i in found
            )
            named = f"fact change: {links}" if links else "no fact change recorded"
            parts.append(f'<li class="drift">{esc(where)}: {esc(text)} ({named})</li>')
        parts.append("</ul>")
    if changes:
        parts.append("<h3>Fact changes</h3><ul>")
        parts += [
            f'<li id="{prefix}-change-{i}">{esc(data.stamp(c.time))}: {esc(c.label)}</li>'
            for i, c in enumerate(changes)
        ]
        parts.append("</ul>")
    return parts


def _status(value: str) -> str:
    css = {"pass": "status-pass", "fail": "status-fail"}.get(value, "status-other")
    return f'<span class="{css}">{esc(value or "?")}</span>'


def _env(
    name: str, runs: Sequence[tuple[float, Mapping[str, Any]]], drift: Sequence[Mapping[str, Any]], ids: str
) -> list[str]:
    parts = [f'<section class="env"><h2>{esc(name)}</h2>']
    if not runs:
        return [*parts, '<p class="note">No validation recorded for this env.</p></section>']
    when, newest = runs[-1]
    parts.append(
        f"<p>{len(runs)} run(s) from {esc(data.stamp(runs[0][0]))} to {esc(data.stamp(when))}; newest: "
        f"{_status(data.text(newest.get('status')))} on {esc(data.partition(newest))}.</p>"
    )
    parts.append(
        "<table>"
        + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in data.latest_facts(newest))
        + "</table>"
    )
    changes = data.fact_changes(runs)
    linked = [
        (f"on {data.text(alarm.get('partition')) or data.partition({})}", data.text(alarm.get("text")), found)
        for alarm, found in data.drift_links(drift, runs, changes)
    ]
    parts += _drift_and_changes(ids, changes, linked)
    parts.append("<h3>Checks per partition over time</h3>")
    parts.append(status_grid(f"{name}: checks over time (oldest left)", data.status_rows(runs)))
    parts += _figures(name, runs, changes)
    parts.append("</section>")
    return parts


def _figures(
    name: str, runs: Sequence[tuple[float, Mapping[str, Any]]], changes: Sequence[data.Change]
) -> list[str]:
    """Every figure over time with the fact changes marked; then, from each partition's newest run that holds
    them, the NCCL sweep and the figures per rank."""
    parts = ["<h3>Figures over time</h3>"]
    figures = data.figure_series(runs)
    units = data.figure_units(runs)
    marks = data.markers(changes)
    parts += _row(
        [
            line_chart(
                f"{name}: {figure}",
                series,
                x=Axis("run time (UTC)", TIME),
                y=Axis(f"{figure} ({units[figure]})" if figure in units else figure),
                markers=marks,
                width=600,
            )
            for figure, series in figures.items()
        ]
        or ['<p class="note">No run recorded a figure.</p>']
    )
    newest = [
        line_chart(
            f"{name}: NCCL bus bandwidth by message size",
            sweep,
            x=Axis("message size (bytes)", LOG2),
            y=Axis("bus bandwidth (GB/s)"),
            width=600,
        )
        for sweep in [data.sweep_series(runs)]
        if sweep
    ]
    newest += [
        line_chart(
            f"{name}: {figure} per rank",
            series,
            x=Axis("rank"),
            y=Axis(data.rank_label(figure, units)),
            width=600,
        )
        for figure, series in data.rank_series(runs).items()
    ]
    if newest:
        parts += ["<h3>NCCL bus bandwidth by message size, figures per rank (newest run per partition)</h3>"]
        parts += _row(newest)
    return parts


def _row(plots: Sequence[str]) -> list[str]:
    return ['<div class="plots">', *plots, "</div>"]
