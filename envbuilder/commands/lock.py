"""`envbuilder lock NAME [--platform ARCH]...`: resolve a recipe for each target platform into a lockfile."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from envbuilder import lockfile
from envbuilder import plan as planner
from envbuilder.build import lockers
from envbuilder.core import settings
from envbuilder.core.errors import UsageError
from envbuilder.core.kinds import kind_info
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.system import fsutil, host
from envbuilder.system.console import Out


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    catalog = Catalog.from_env(env)
    recipe = loader.load(args.recipe, catalog)
    facts = host.facts_for(args.facts)
    arches = args.platform or lockers.default_arches(recipe, facts)
    conda = kind_info(recipe.env.kind).conda
    if (args.format == "pylock" and conda) or (args.format == "conda-lock" and not conda):
        held = "conda packages" if conda else "wheels only"
        raise UsageError(
            f"--format {args.format} does not fit {recipe.name}, a {recipe.env.kind} recipe ({held})",
            hint=f"--format {'conda-lock' if conda else 'pylock'}, or lock it without --format",
        )
    quiet = bool(args.json or args.quiet)
    log = (lambda _: None) if quiet else (lambda text: out.line(f"  {text}"))
    if not quiet:
        out.heading(f"Locking {recipe.name} for {', '.join(lockfile.arch_name(a) for a in arches)}")
    from envbuilder.resolver import indexread  # noqa: PLC0415 - urllib and threads only when an index is read

    index = indexread.read_torch(
        planner.torch_request(recipe), env, refresh=args.refresh, offline=args.offline
    )
    lock, warnings = lockers.make(recipe, facts, env, arches, python=args.python, log=log, index=index)
    path = (
        Path(args.output).expanduser() if args.output else lockfile.user_path(settings.home(env), recipe.name)
    )
    standard = path.parent if args.output else path.parent / recipe.name  # ours holds every recipe's lock
    conda_lock = (
        lockfile.condalock.render(lock) if args.format == "conda-lock" else ""
    )  # refused before writing
    pylocks: list[Path] = []
    with fsutil.disk_errors((path.parent, "write the lockfile elsewhere with -o FILE")):
        lockers.write(lock, path)
        if args.format == "pylock":
            pylocks = lockers.write_pylocks(lock, standard)
        elif conda_lock:
            pylocks = [lockers.write_text(standard / lockfile.condalock.FILE_NAME, conda_lock)]
    if not quiet:
        for p in lock.platforms:
            top = ", ".join(f"{k.name} {k.version}" for k in p.packages[:4])
            more = f" and {len(p.packages) - 4} more" if len(p.packages) > 4 else ""
            out.result.line(f"{p.arch} ({p.tag}): {len(p.packages)} packages: {top}{more}")
        out.result.line(f"wrote {path}")
        for written in pylocks:
            how = "conda-lock install" if conda else "PEP 751: uv pip install -r"
            out.result.line(f"wrote {written} ({how} {written.name})")
        out.line(f"create uses it from now on: envbuilder create {recipe.name} [--locked]")
    for w in warnings:
        if not args.json:
            out.warn(w)
    return {
        **lock.summary().to_json(),
        "path": str(path),
        "standard_files": [str(p) for p in pylocks],
        "warnings": warnings,
    }
