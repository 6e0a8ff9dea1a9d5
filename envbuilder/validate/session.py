"""A validation run as the verbs that run one show it (``validate``, ``create`` right after a build, ``backup
restore --validate``): run the checks with a spinner, store the report in the env's record, render it for people,
and turn a failed report into the error the CLI exits with."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Optional

from envbuilder.core.errors import ValidationFailed
from envbuilder.core.facts import HostFacts
from envbuilder.recipe import loader
from envbuilder.system import fsutil, modules, proc, state
from envbuilder.system.console import Cell, Out, plain
from envbuilder.system.tables import Column
from envbuilder.validate import report
from envbuilder.validate import runner as validator

#: The way out when a validation's run directory (inside the env) cannot be written.
RUNS_HINT = "the checks write their run directory inside the env (envbuilder/validation): it must be writable"

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
    """Run, store in the record (unless ``home`` is None: the caller stores it), render (unless quiet)."""
    status_ctx = out.console.status("validating", spinner="dots") if not quiet else None
    live = report.Status(
        status=(lambda text: status_ctx.update(plain(text))) if status_ctx else (lambda text: None),
        note=out.line if not quiet else (lambda text: None),
    )
    # SIGTERM (a batch job's time limit, scancel, kill) unwinds like Ctrl-C: the launcher and every rank it
    # started are ended, a submitted job is cancelled, and the CLI exits 130.
    runs = (Path(opts.runs) if opts.runs else Path(record.prefix), RUNS_HINT)
    with status_ctx or contextlib.nullcontext(), proc.sigterm_as_interrupt(), fsutil.disk_errors(runs):
        result = validator.run(record, recipe, facts, env, modules.detect(env), opts=opts, live=live)
    if home is not None:
        validator.store(home, record, result)
    if not quiet:
        render(result, out)
    return result


def finish(result: report.Report) -> dict[str, Any]:
    data = result.to_json()
    if not result.ok:
        exc = ValidationFailed(
            f"validation of {result.env} failed: {', '.join(result.failed) or 'no check passed'}",
            hint=_hint(result),
        )
        exc.data = data
        raise exc
    return data


def _hint(result: report.Report) -> Optional[str]:
    for row in result.rows:
        if row.status == "fail" and row.hint:
            return row.hint
    return None


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
    for row in result.rows:
        ranks = _ranks(row.ranks, result.world)
        status = plain(row.status.upper(), _STYLE[row.status])
        detail = row.reason or row.detail or ""
        if row.status in ("fail", "warn"):
            detail = (row.cause or "") + (f"\nhint: {row.hint}" if row.hint else "")
        check = report.check_label(row.check, result.device)
        rows.append([check, ranks, status, report.figure_text(row), detail])
    out.result.table(_REPORT_COLUMNS, rows)
    if not result.ok and result.stderr_tail:
        out.line("launcher output (last lines):")
        for line in result.stderr_tail.splitlines()[-8:]:
            out.line(f"  {line}")


def _ranks(ranks: tuple[int, ...], world: int) -> str:
    if not ranks:
        return "-"
    if len(ranks) == world and world > 1:
        return f"all {world}"
    return ",".join(map(str, ranks))
