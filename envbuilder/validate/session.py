"""A validation run as the verbs that run one show it (``validate``, ``create`` right after a build, ``backup
restore --validate``): run the checks with a spinner, store the report in the env's record, render it for people,
and turn a failed report into the error the CLI exits with."""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import StateError, ValidationFailed
from envbuilder.core.facts import HostFacts
from envbuilder.plan import allocation
from envbuilder.recipe import loader
from envbuilder.system import fsutil, modules, proc, state
from envbuilder.system.console import Cell, Out, plain
from envbuilder.system.tables import Column
from envbuilder.validate import history, historymodel, report
from envbuilder.validate import runner as validator

#: The way out when a validation's run directory (inside the env) cannot be written.
RUNS_HINT = "the checks write their run directory inside the env (envbuilder/validation): it must be writable"

#: The way on from a run failed by the recipe's drift_threshold.
DRIFT_HINT = (
    "a figure fell well behind its median over this env's last runs: see what changed beside it above "
    "(envbuilder report shows the history); the recipe's [validation] drift_threshold made it a failure"
)

_STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red", "skip": "yellow"}


def execute(
    record: state.EnvRecord,
    recipe: loader.Recipe,
    facts: HostFacts,
    env: dict[str, str],
    opts: validator.Options,
    *,
    out: Out,
    quiet: bool,
    home: Optional[Path],
) -> report.Report:
    """Run, compare with the env's history and add the run to it, store in the record (unless ``home`` is None:
    the caller does both, :func:`keep_history` and ``runner.store``), render (unless quiet)."""
    status_ctx = out.console.status("validating", spinner="dots") if not quiet else None
    live = report.Status(
        status=(lambda text: status_ctx.update(plain(text))) if status_ctx else (lambda text: None),
        note=out.line if not quiet else (lambda text: None),
    )
    # SIGTERM (a batch job's time limit, scancel, kill) unwinds like Ctrl-C: the launcher and every rank it
    # started are ended, a submitted job is cancelled, and the CLI exits 130.
    runs = (Path(opts.runs) if opts.runs else Path(record.prefix), RUNS_HINT)
    guards = (proc.sigterm_as_interrupt(), fsutil.disk_errors(runs), short_here(record.name))
    with status_ctx or contextlib.nullcontext(), guards[0], guards[1], guards[2]:
        result = validator.run(record, recipe, facts, env, modules.detect(env), opts=opts, live=live)
        proc.raise_dropped_interrupt()  # a Ctrl-C Python dropped: no verdict, no history, exit 130
    if home is not None:
        result = keep_history(
            home, record, recipe=recipe, facts=facts, result=result, out=out, site=site_store(env)
        )
        validator.store(home, record, result)
    if not quiet:
        render(result, out)
    return result


@contextlib.contextmanager
def short_here(name: str) -> Iterator[None]:
    """A job that lacks what the launch needs (:mod:`plan.allocation`) cannot run the checks here: as on a login
    node, ``create`` runs the smoke check instead, and ``validate`` says what the job lacks and how to ask."""
    try:
        yield
    except allocation.AllocationShort as short:
        raise validator.NotHere(f"not validating {name} here: {short.message}", hint=short.hint) from None


def keep_history(
    home: Path,
    record: state.EnvRecord,
    *,
    recipe: loader.Recipe,
    facts: HostFacts,
    result: report.Report,
    out: Out,
    site: Optional[Path] = None,
) -> report.Report:
    """Compare the run's figures with the env's history (the drift alarms, on stderr and in the report), then add
    the run to it, and to the ``site`` store where the env comes from a published recipe. A history that cannot
    be read or written is a warning: the checks' verdict stands."""
    current = historymodel.record_of(
        result,
        recipe=record.recipe,
        recipe_version=str(record.plan.get("recipe_version") or ""),
        facts=historymodel.facts_of(facts, result),
        at=history.now_text(),
    )
    try:
        past = history.runs(home, record.name)
    except (OSError, StateError) as exc:
        out.warn(f"validation history not read: {exc}")
        past = []
    threshold = recipe.validation.drift_threshold
    alarms = historymodel.compare(current, past, None if threshold is None else float(threshold))
    for alarm in alarms:
        out.warn(f"drift: {alarm.text}" + (" (past the recipe's drift_threshold)" if alarm.fails else ""))
    result = replace(result, drift=tuple(a.to_json() for a in alarms))
    current["status"] = "pass" if result.ok else "fail"
    try:
        history.append(home, current)
    except (OSError, StateError) as exc:
        out.warn(f"validation history not written: {exc}")
    if site is not None and current["recipe_version"]:
        try:
            history.append_shared(site, current, user=pwd.getpwuid(os.geteuid()).pw_name)
        except (OSError, StateError, KeyError) as exc:
            out.warn(f"the site's validation history (history_dir) not written: {exc}")
    return result


def site_store(env: Mapping[str, str]) -> Optional[Path]:
    """The site's shared validation history (the ``history_dir`` setting), where one is named."""
    named = env.get("ENVBUILDER_HISTORY_DIR")
    return Path(named).expanduser() if named else None


def finish(result: report.Report) -> dict[str, Any]:
    data = result.to_json()
    if not result.ok:
        what = result.failed + [
            f"{name} drifted past the recipe's drift_threshold" for name in result.drift_failed
        ]
        exc = ValidationFailed(
            f"validation of {result.env} failed: {', '.join(what) or 'no check passed'}",
            hint=_hint(result),
        )
        exc.data = data
        raise exc
    return data


def _hint(result: report.Report) -> Optional[str]:
    for row in result.rows:
        if row.status == "fail" and row.hint:
            return row.hint
    return DRIFT_HINT if result.drift_failed else None


_REPORT_COLUMNS = (
    Column("check"),
    Column("ranks"),
    Column("status"),
    Column("figures", text=True),
    Column("cause / hint", text=True),
)


def render(result: report.Report, out: Out) -> None:
    """The report on stdout; the launcher's last lines, where it failed, on stderr."""
    where = "here" if result.where == "here" else f"job {result.where}"
    # Across nodes, the world's shape and where each rank ran (the hosts the ranks reported).
    shape = f" ({report.layout_text(result.hosts)})" if len(result.layout) > 1 else ""
    out.result.heading(
        f"Validation of {result.env}: {result.world} rank(s) on {result.nodes} node(s){shape} through "
        f"{result.launcher}, {result.device}, {where}, {result.seconds:.1f} s"
    )
    rows: list[list[Cell]] = []
    marks = {str(alarm.get("figure")): drift_mark(alarm) for alarm in result.drift}
    for row in result.rows:
        ranks = _ranks(row.ranks, result.world)
        status = plain(row.status.upper(), _STYLE[row.status])
        detail = row.reason or row.detail or ""
        if row.status in ("fail", "warn"):
            detail = (row.cause or "") + (f"\nhint: {row.hint}" if row.hint else "")
        check = report.check_label(row.check, result.device)
        rows.append([check, ranks, status, report.figure_text(row, marks), detail])
    out.result.table(_REPORT_COLUMNS, rows)
    if not result.ok and result.stderr_tail:
        out.line("launcher output (last lines):")
        for line in result.stderr_tail.splitlines()[-8:]:
            out.line(f"  {line}")


def drift_mark(alarm: Mapping[str, Any]) -> str:
    """A drifted figure's mark in the table, so that the table alone tells it: ``(+62% vs 10-run median)``, its
    change from its median over the runs it was compared with, and whether it passed the recipe's threshold."""
    value, median = alarm.get("value"), alarm.get("median")
    if isinstance(value, (int, float)) and isinstance(median, (int, float)) and median:
        change = f"{(value - median) / median * 100:+.0f}%"
    else:
        change = "drifted"
    past = ", past drift_threshold" if alarm.get("fails") else ""
    return f"({change} vs {alarm.get('runs', '?')}-run median{past})"


def _ranks(ranks: tuple[int, ...], world: int) -> str:
    if not ranks:
        return "-"
    if len(ranks) == world and world > 1:
        return f"all {world}"
    return ",".join(map(str, ranks))
