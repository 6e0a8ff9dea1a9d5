"""`envbuilder plan NAME`: every step create would take, without doing any of it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Optional

from envbuilder import host, launchers, loader, locking
from envbuilder import plan as planner
from envbuilder.catalog import Catalog
from envbuilder.console import Out
from envbuilder.errors import EnvbuilderError


def facts_for(facts_file: Optional[str]) -> host.HostFacts:
    return host.load_facts_file(facts_file) if facts_file else host.probe()


def make_plan(
    name: str,
    facts_file: Optional[str] = None,
    opts: Optional[planner.Options] = None,
    env: Optional[dict[str, str]] = None,
    lock_file: Optional[str] = None,
    use_lock: bool = True,
) -> planner.Plan:
    env = dict(os.environ if env is None else env)
    catalog = Catalog.from_env(env)
    recipe = loader.load(name, catalog)
    facts = facts_for(facts_file)
    lock = locking.find(recipe, catalog, env, lock_file) if use_lock else None
    return planner.build(recipe, facts, env, opts, lock=lock)


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    opts = planner.Options(
        prefix=args.prefix,
        launcher=args.launcher,
        nodes=args.nodes,
        nproc_per_node=args.nproc_per_node,
        account=args.account,
        package_dir=str(Path(__file__).resolve().parent.parent),
        locked=args.locked,
    )
    try:
        result = make_plan(args.recipe, args.facts, opts, lock_file=args.lock, use_lock=not args.no_lock)
    except EnvbuilderError as exc:
        exc.data = {"recipe": args.recipe}  # type: ignore[attr-defined]
        raise
    if not args.json:
        render(result, out)
    return result.to_json()


def render(p: planner.Plan, out: Out) -> None:
    title = f"Plan for {p.recipe}"
    if p.site:
        title += f" (site {p.site}, {p.status})"
    out.heading(title)
    out.field("recipe files", " <- ".join(p.chain))
    t = p.target
    gpus = "none" if t.gpus == () else ("unknown" if t.gpus is None else f"{len(t.gpus)}× {t.gpus[0].name}")
    out.field(
        "target",
        f"{t.arch or '?'}, glibc {t.glibc or '?'}, Python {t.python or '?'}, driver "
        f"{t.driver_version or '?'}, GPUs {gpus}",
    )
    out.field("env", f"{p.kind} at {p.prefix}")
    if p.resolution:
        r = p.resolution
        out.field("torch", f"{r.torch} {r.variant} ({r.channel}) from {r.index_url}")
    if p.lock:
        status = "applies" if p.lock["status"] == "applies" else "ignored (stale)"
        out.field("lock", f"{p.lock['path']} ({p.lock['origin']}), {p.lock['arch']}: {status}")
    out.line()
    out.heading("Steps")
    for i, step in enumerate(p.steps, 1):
        out.line(f"  {i:2d}. {step}")
    out.line()
    out.heading("Validation")
    out.field("launcher", p.launcher)
    out.field("command", launchers.display(p.launch_command))
    if p.interactive_command:
        out.field("interactive allocation", launchers.display(p.interactive_command))
    if p.batch_script:
        out.line("  batch script:")
        for line in p.batch_script.rstrip().splitlines():
            out.line(f"    {line}")
    if p.notes:
        out.line()
        out.heading("Notes")
        for note in p.notes:
            out.line(f"  - {note}")
    if p.warnings:
        out.line()
        for w in p.warnings:
            out.warn(w)
