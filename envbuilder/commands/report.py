"""`envbuilder report [ENV...] [--all]`: the validation history of envs as one self-contained HTML page (plots
inline as SVG) or as Markdown tables for a ticket, to stdout or to a file (-o). `report --site [--recipe NAME]`:
the site's store (``history_dir``: every user's envs of published recipes), per recipe, as far as its owners'
permissions let this user read it (what was not read is named, on stderr and on the page)."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any, Optional

from envbuilder.core import settings
from envbuilder.core.errors import StateError, UsageError
from envbuilder.render import report_html, report_md, sitedata
from envbuilder.system import fsutil
from envbuilder.system.console import Out
from envbuilder.validate import history, historymodel, session


def handle(args: argparse.Namespace, out: Out) -> None:
    if args.site:
        _site(args, out)
        return
    if args.recipe:
        raise UsageError("--recipe goes with --site", hint="envbuilder report --site --recipe NAME")
    home = settings.home(os.environ)
    if args.all and args.env:
        raise UsageError("name envs or give --all, not both")
    names = history.envs(home) if args.all else list(dict.fromkeys(args.env))
    for name in names:
        if not history.is_env_name(name):
            raise UsageError(
                f"{name!r} is not an env name", hint="env names hold letters, digits and . _ + -"
            )
    if not names:
        if args.all:
            raise StateError(
                f"no validation history in {history.store(home)}",
                hint="each `envbuilder validate ENV` adds a run to it",
            )
        raise UsageError("name the envs to report on, or give --all", hint="envbuilder report ENV [ENV...]")
    envs = [(name, _runs(home, name, out)) for name in names]
    missing = [name for name, runs in envs if not runs]
    if missing and not args.all:
        raise StateError(
            f"no validation history for {', '.join(missing)} in {history.store(home)}",
            hint=f"run `envbuilder validate {missing[0]}` first",
        )
    drift = {name: [d.to_json() for d in historymodel.latest_drift(runs)] for name, runs in envs}
    render = report_md.render if args.format == "md" else report_html.render
    _write(args.output, render(envs, _now(), drift), out, f"the report on {len(envs)} env(s)")


def _site(args: argparse.Namespace, out: Out) -> None:
    if args.env or args.all:
        raise UsageError("--site reports on the site's store: name no env and give no --all")
    root = session.site_store(os.environ)
    if root is None:
        raise UsageError(
            "no site store to report on: history_dir is not set",
            hint="set history_dir in the site config (or ENVBUILDER_HISTORY_DIR) to the site's history store",
        )
    found, skipped = history.site_envs(root, args.recipe)
    for path, why in skipped:
        out.warn(f"left out {path}: {why}")
    if not found:
        what = f"recipe {args.recipe}" if args.recipe else "any recipe"
        raise StateError(
            f"no validation history of {what} in the site's store {root}",
            hint="validations of envs built from published recipes add their runs to it",
        )
    envs = [
        sitedata.SiteEnv(
            user,
            recipe,
            env,
            tuple(runs),
            tuple(d.to_json() for d in historymodel.latest_drift(runs)),
        )
        for user, recipe, env, runs in found
    ]
    render = report_md.render_site if args.format == "md" else report_html.render_site
    recipes = len({one.recipe for one in envs})
    _write(
        args.output,
        render(envs, _now(), str(root), skipped),
        out,
        f"the site report on {recipes} recipe(s), {len(envs)} env(s)",
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _write(output: Optional[str], text: str, out: Out, what: str) -> None:
    path = fsutil.write_output(output, text)
    if path is not None:
        out.line(f"wrote {what} to {path}")


def _runs(home: Path, name: str, out: Out) -> list[dict[str, Any]]:
    skipped: list[str] = []
    runs = history.runs(home, name, skipped)
    for path in skipped:
        out.warn(f"left out {path}: not a history record")
    return runs
