"""`envbuilder doctor [ENV...]`: gather what the checks need, run them, print the findings (stdout), and exit 14
when one needs action."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

from envbuilder.core import settings
from envbuilder.core.errors import DoctorFindings
from envbuilder.core.facts import HostFacts
from envbuilder.doctor import collect, findings, index_checks
from envbuilder.doctor.report import Context, Report, examine
from envbuilder.recipe.catalog import Catalog
from envbuilder.resolver.matrix import load_matrix
from envbuilder.system import host, state, tables
from envbuilder.system.console import Out, plain

_LABELS = {
    findings.ACTION: "[bold red]ACTION[/bold red]",
    findings.WARNING: "[yellow]warning[/yellow]",
    findings.INFO: "[green]ok[/green]",
}


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    home = settings.home(env)
    facts = host.facts_for(args.facts)
    if args.facts:
        facts_from = f"{args.facts} (another node: this shell is not checked)"
    else:
        facts_from = f"this node ({facts.hostname or 'probe'})"
    names = list(args.env) or state.names(home)
    records, extra = collect.read_records(home, names, explicit=bool(args.env))
    catalog = Catalog.from_env(env)
    root = settings.backup_root(env)[0]
    inputs = [collect.gather(record, catalog, env, root, home) for record in records]
    matrix = load_matrix()
    torch_urls = index_checks.torch_upstreams(inputs, matrix)
    indexes = collect.read_indexes(
        torch_urls,
        index_checks.lock_upstreams(inputs),
        env,
        home,
        offline=args.offline,  # ENVBUILDER_OFFLINE=1 is read (and named) by the index reader
        refresh=args.refresh,
    )
    ctx = Context(
        facts=facts,
        env=env,
        today=datetime.date.today(),
        matrix=matrix,
        indexes=indexes,
        upstreams=tuple(torch_urls),
        check_shell=not args.facts,
    )
    report = examine(inputs, ctx, collect.listdir, facts_from, extra)
    data = report.to_json()
    if not args.json:
        render(report, _stdout())
    if report.needs_action:
        n = report.counts[findings.ACTION]
        exc = DoctorFindings(
            f"{n} finding{'s' if n != 1 else ''} need{'' if n != 1 else 's'} action",
            hint="apply each ACTION's fix, then run envbuilder doctor again",
        )
        exc.data = data
        raise exc
    return data


def _stdout() -> Console:
    # The report is the command's result, so it goes to stdout (progress and errors stay on stderr). Not a
    # terminal: rich wraps at $COLUMNS, else 80.
    return Console(file=sys.stdout, highlight=False, no_color="NO_COLOR" in os.environ)


def facts_line(facts: HostFacts) -> str:
    gpus = facts.gpus
    shown = "none" if gpus == () else ("unknown" if gpus is None else f"{len(gpus)}× {gpus[0].name}")
    return (
        f"{facts.arch or '?'}, glibc {facts.glibc or '?'}, driver {facts.driver_version or '?'}"
        f" (CUDA {facts.max_cuda or '?'}), GPUs {shown}"
    )


_COLUMNS = (tables.Column(""), tables.Column("subject"), tables.Column("finding", text=True))


def render(report: Report, console: Console) -> None:
    envs = ", ".join(report.envs) if report.envs else "none recorded"
    rows = []
    for f in report.findings:
        # Messages name paths and values: shown literally (console.plain), never read as markup.
        text = plain(f.message)
        if f.fix:
            text = Text.assemble(text, "\n", plain("fix:", "cyan"), " ", plain(f.fix))
        rows.append([Text.from_markup(_LABELS[f.severity]), plain(f.subject), text])
    counts = report.counts
    warnings = counts[findings.WARNING]
    with console.capture() as captured:
        console.print(plain("envbuilder doctor", "bold"))
        console.print(plain(f"  facts: {report.facts_from}"))
        console.print(plain(f"  node:  {facts_line(report.facts)}"))
        console.print(plain(f"  envs:  {envs}; table as of {report.matrix_as_of}"))
        for line in tables.render(console, _COLUMNS, rows):
            console.print(line, soft_wrap=True)
        console.print(
            plain(
                f"{counts[findings.ACTION]} need action, {warnings} warning{'s' if warnings != 1 else ''}, "
                f"{counts[findings.INFO]} ok"
            )
        )
    # rich pads every cell to its column's width: drop the trailing blanks that would leave.
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
