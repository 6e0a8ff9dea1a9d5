"""`envbuilder report [ENV...] [--all]`: the validation history of envs as one self-contained HTML page (plots
inline as SVG) or as Markdown tables for a ticket, to stdout or to a file (-o)."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path
from typing import Any

from envbuilder.core import settings
from envbuilder.core.errors import StateError, UsageError
from envbuilder.render import report_html, report_md
from envbuilder.system import fsutil
from envbuilder.system.console import Out
from envbuilder.validate import history


def handle(args: argparse.Namespace, out: Out) -> None:
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
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    render = report_md.render if args.format == "md" else report_html.render
    text = render(envs, generated)
    if args.output is None:
        sys.stdout.write(text)
        return
    path = Path(args.output)
    if path.is_dir():
        raise UsageError(f"-o {path} is a directory", hint="name the report's file: -o report.html")
    with fsutil.disk_errors((path.absolute().parent, "write it elsewhere with -o FILE")):
        fsutil.write_atomic(path, text.encode())
    out.line(f"wrote the report on {len(envs)} env(s) to {path}")


def _runs(home: Path, name: str, out: Out) -> list[dict[str, Any]]:
    skipped: list[str] = []
    runs = history.runs(home, name, skipped)
    for path in skipped:
        out.warn(f"left out {path}: not a history record")
    return runs
