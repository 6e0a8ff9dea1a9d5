"""`envbuilder impact --facts FILE`: what a planned change of a node (a new driver, OS image or modules) breaks
or changes among a registry's recipes (every published version; the shipped recipes without ``--registry``) and
the env records users shared with the site (``--records DIR``), before the change is made. Exit 16 when anything
breaks. The comparison is ``plan.impact``'s; here the facts, recipes, records and indexes are read."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from envbuilder import plan as planner
from envbuilder.core.errors import EnvbuilderError, ImpactBreaks, UsageError
from envbuilder.core.facts import HostFacts
from envbuilder.plan import impact
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, Layer, builtin_dir, registry_layer
from envbuilder.render import impact_page
from envbuilder.resolver.matrix import Matrix, load_matrix
from envbuilder.system import fsutil, host, state, tables
from envbuilder.system.console import Out, plain

_STYLES = {
    impact.BREAKS: "bold red",
    impact.BROKEN: "yellow",
    impact.CHANGES: "cyan",
    impact.FIXED: "green",
    impact.UNAFFECTED: "green",
}
_COLUMNS = (
    tables.Column(""),
    tables.Column("recipe or env"),
    tables.Column("why, or old -> new", text=True),
    tables.Column("from", optional=True),
)


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    if args.json and args.format != "text":
        raise UsageError(f"--json or --format {args.format}, not both")
    if args.output and args.format == "text":
        raise UsageError(
            "-o writes a page: give --format html or md", hint="envbuilder impact ... --format html -o FILE"
        )
    env = dict(os.environ)
    after = host.load_facts_file(args.facts)
    before = host.facts_for(args.before)
    before_from = args.before or f"this node ({before.hostname or 'probe'})"
    matrix = load_matrix()
    notes: list[str] = []
    verdicts = _recipes(args, env, (before, after), matrix, notes)
    if args.records:
        verdicts += _records(Path(args.records), (before, after), matrix)
    report = impact.Impact(
        before_from, args.facts, tuple(impact.sorted_verdicts(verdicts)), tuple(dict.fromkeys(notes))
    )
    data = report.to_json()
    if args.format != "text":
        _page(args.format, args.output, report, (facts_line(before), facts_line(after)), out)
    elif not args.json:
        render(report, before, after, _stdout())
    if report.breaks:
        n = report.counts[impact.BREAKS]
        exc = ImpactBreaks(
            f"the change breaks {n} recipe{'s' if n != 1 else ''} or env{'s' if n != 1 else ''}",
            hint="each BREAKS row says why; plan again with `envbuilder plan NAME --facts` once fixed",
        )
        exc.data = data
        raise exc
    return data


def _page(fmt: str, output: Optional[str], report: impact.Impact, facts: tuple[str, str], out: Out) -> None:
    """The table as an HTML page or Markdown, to stdout or to the file ``output``."""
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    render_page = impact_page.render_md if fmt == "md" else impact_page.render_html
    path = fsutil.write_output(output, render_page(report, facts, generated))
    if path is not None:
        out.line(f"wrote the impact on {len(report.verdicts)} recipe(s) and env(s) to {path}")


def _catalog(registry: Optional[str], env: Mapping[str, str]) -> tuple[Catalog, str]:
    """The recipes to re-plan: the named registry's, else the shipped ones; and how to name their source."""
    if not registry:
        return Catalog([Layer("builtin", builtin_dir())]), "shipped"
    if "://" in registry and not registry.startswith("file://"):
        raise UsageError(
            f"--registry {registry}: a registry is a directory (on a shared file system), not a URL",
            hint="name the directory `envbuilder publish --registry` wrote, or a file:// URL of it",
        )
    root = Path(registry[len("file://") :] if registry.startswith("file://") else registry)
    return Catalog([registry_layer(root, env)]), str(root)


def _refs(catalog: Catalog) -> list[str]:
    """Every recipe of the catalog: each published version of a registry's, the one file of others."""
    refs = []
    for name in catalog.names():
        entry = catalog.get(name)
        registry = entry.layer.registry if entry is not None else None
        if registry is None:
            refs.append(name)
        else:
            refs += [f"{name}@{pub.version}" for pub in registry.versions(name)]
    return refs


def _recipes(
    args: argparse.Namespace,
    env: Mapping[str, str],
    sides: tuple[HostFacts, HostFacts],
    matrix: Matrix,
    notes: list[str],
) -> list[impact.Verdict]:
    """Each recipe planned for the node before and after (``sides``)."""
    from envbuilder.resolver import indexread  # noqa: PLC0415 - urllib and threads only when an index is read

    catalog, source = _catalog(args.registry, env)
    verdicts = []
    for ref in _refs(catalog):
        try:
            recipe = loader.load(ref, catalog)
            index = indexread.read_torch(
                planner.torch_request(recipe), env, refresh=args.refresh, offline=args.offline
            )
        except EnvbuilderError as exc:
            fail = impact.Outcome(None, (impact.Reason("recipe", exc.message),))
            verdicts.append(impact.verdict("recipe", ref, fail, fail, source))
            continue
        if index is not None and index.fallback:
            notes.append(f"torch facts from the shipped table: {index.fallback}")
        was, now = (impact.plan_outcome(recipe, f, env, index=index, matrix=matrix) for f in sides)
        verdicts.append(impact.verdict("recipe", ref, was, now, source))
    return verdicts


def _records(directory: Path, sides: tuple[HostFacts, HostFacts], matrix: Matrix) -> list[impact.Verdict]:
    verdicts = []
    for path, record, why in state.shared(directory):
        if record is None:
            fail = impact.Outcome(None, (impact.Reason("record", why),))
            verdicts.append(impact.verdict("env", path.stem, fail, fail, str(path)))
            continue
        python = record.tools.get("python") if isinstance(record.tools, dict) else None
        was, now = (impact.record_outcome(record.plan, python, f, matrix) for f in sides)
        verdicts.append(impact.verdict("env", path.stem, was, now, str(path)))
    return verdicts


def _stdout() -> Console:
    # The report is the command's result: stdout (errors stay on stderr); not a terminal, rich takes $COLUMNS or 80.
    return Console(file=sys.stdout, highlight=False, no_color="NO_COLOR" in os.environ)


def facts_line(facts: HostFacts) -> str:
    gpus = facts.gpus
    shown = "no GPUs" if gpus == () else ("GPUs unknown" if gpus is None else f"{len(gpus)}× {gpus[0].name}")
    modules = "" if facts.modules is None else f", {len(facts.modules)} modules"
    return (
        f"driver {facts.driver_version or '?'} (CUDA {facts.max_cuda or '?'}), glibc {facts.glibc or '?'}, "
        f"{shown}{modules}"
    )


def render(report: impact.Impact, before: HostFacts, after: HostFacts, console: Console) -> None:
    rows = [
        [
            plain(v.status, _STYLES[v.status]),
            plain(v.subject if v.kind == "recipe" else f"env {v.subject}"),
            plain(v.why),
            plain(v.source),
        ]
        for v in report.verdicts
    ]
    counts = report.counts
    with console.capture() as captured:
        console.print(plain("envbuilder impact", "bold"))
        for label, source, facts in (
            ("before", report.before_from, before),
            ("after", report.after_from, after),
        ):
            console.print(plain(f"  {label + ':':8}{source}"))
            console.print(plain(f"          {facts_line(facts)}"))
        for note in report.notes:
            console.print(plain(f"  note: {note}"))
        for line in tables.render(console, _COLUMNS, rows):
            console.print(line, soft_wrap=True)
        console.print(plain(", ".join(f"{counts[s]} {s.lower()}" for s in impact.STATUSES)))
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
