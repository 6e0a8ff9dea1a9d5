"""`envbuilder plan NAME`: every step create would take, without doing any of it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from envbuilder import plan as planner
from envbuilder.build import images
from envbuilder.core import launchers, settings
from envbuilder.core.errors import EnvbuilderError
from envbuilder.core.kinds import kind_info
from envbuilder.core.space import Need, gb
from envbuilder.plan import preflight
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, find_lock
from envbuilder.resolver import mirror
from envbuilder.resolver.matrix import table_age
from envbuilder.system import host
from envbuilder.system.console import Out


def make_plan(
    name: str,
    facts_file: Optional[str] = None,
    opts: Optional[planner.Options] = None,
    *,
    env: Optional[dict[str, str]] = None,
    lock_file: Optional[str] = None,
    use_lock: bool = True,
    refresh: bool = False,
    no_network: bool = False,
) -> planner.Plan:
    env = dict(os.environ if env is None else env)
    catalog = Catalog.from_env(env)
    recipe = loader.load(name, catalog)
    facts = host.facts_for(facts_file)
    if kind_info(recipe.env.kind).container:
        return images.container_plan(recipe, facts, env, opts, offline=no_network)
    lock = find_lock(recipe, catalog, env, lock_file) if use_lock else None
    from envbuilder.resolver import indexread  # noqa: PLC0415 - urllib and threads only when an index is read

    index = indexread.read_torch(planner.torch_request(recipe), env, refresh=refresh, offline=no_network)
    return planner.build(recipe, facts, env, opts, lock=lock, index=index, table_age=table_age())


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    opts = planner.Options(
        prefix=args.prefix,
        launcher=args.launcher,
        nodes=args.nodes,
        nproc_per_node=args.ranks_per_node,
        account=args.account,
        locked=args.locked,
        partition=args.partition,
    )
    try:
        result = make_plan(
            args.recipe,
            args.facts,
            opts,
            lock_file=args.lock,
            use_lock=not args.no_lock,
            refresh=args.refresh,
            no_network=args.offline,
        )
    except EnvbuilderError as exc:
        exc.data = {"recipe": args.recipe}
        raise
    needs = preflight.for_plan(result, str(settings.uv_cache(os.environ)[0]))
    if not args.json:
        render(result, out, os.environ)
        _render_estimate(needs, out)
    return {**result.to_json(), "estimate": [n.to_json() for n in needs]}


def _render_estimate(needs: Sequence[Need], out: Out) -> None:
    """What create will write where, as pre-flight estimates it (create checks it against the file systems)."""
    if not needs:
        return
    out.result.line()
    out.result.heading("Space (pre-flight estimate; create checks it)")
    for n in needs:
        maybe = " (may be there already)" if n.soft else ""
        out.result.field(n.what, f"{gb(n.bytes)}, {n.files:,} files under {n.path}{maybe}")
    for source in dict.fromkeys(n.source for n in needs):
        out.result.line(f"  from: {source}")


def render(p: planner.Plan, out: Out, env: Mapping[str, str]) -> None:
    """The plan for people, on stdout (its warnings on stderr); ``env`` is the one it was made in (its index
    mirror rules)."""
    _render_target(p, out, env)
    out.result.line()
    out.result.heading("Steps")
    for i, step in enumerate(p.steps, 1):
        out.result.line(f"  {i:2d}. {step}")
    out.result.line()
    if p.launch_command or not p.container:
        _render_validation(p, out)
    if p.resolution and p.resolution.facts_source:
        _render_list("Where the torch facts come from", p.resolution.facts_source, out)
    if p.notes:
        _render_list("Notes", p.notes, out)
    for w in p.warnings:
        out.warn(w)


def _render_target(p: planner.Plan, out: Out, env: Mapping[str, str]) -> None:
    """The heading and what is built where: recipe files, target, env, torch, lock."""
    title = f"Plan for {p.recipe}"
    if p.site:
        title += f" (site {p.site}, {p.status})"
    out.result.heading(title)
    out.result.field("recipe files", " <- ".join(p.chain))
    t = p.target
    gpus = "none" if t.gpus == () else ("unknown" if t.gpus is None else f"{len(t.gpus)}× {t.gpus[0].name}")
    host = {f.name for f in p.target_facts if f.from_host}
    mark = {name: " (from this host)" if name in host else "" for name in ("glibc", "python")}
    out.result.field(
        "target",
        f"{t.arch or '?'}, glibc {t.glibc or '?'}{mark['glibc']}, Python {t.python or '?'}{mark['python']}, "
        f"driver {t.driver_version or '?'}, GPUs {gpus}",
    )
    for fact in p.target_facts:
        out.result.field(f"compute {fact.name}", f"{fact.value or 'unknown'}, {fact.detail}")
    out.result.field("env", f"{p.kind} at {p.prefix}")
    if p.python.get("source"):
        out.result.field("python", f"{p.python.get('version') or '?'} ({p.python['source']})")
    if p.python.get("where"):
        out.result.field("python from", p.python["where"])
    if p.resolution:
        r = p.resolution
        label = f" (+{r.local} builds only)" if r.local else ""
        inferred = ", inferred facts" if r.inferred else ""
        index = mirror.shown(r.index_url, mirror.from_env(env))
        out.result.field("torch", f"{r.torch} {r.variant} ({r.channel}{inferred}) from {index}{label}")
    if p.container:
        _render_container(p.container, out)
    if p.lock:
        status = "applies" if p.lock.applies else "ignored (stale)"
        out.result.field("lock", f"{p.lock.summary.path} ({p.lock.summary.origin}), {p.lock.arch}: {status}")


def _render_container(box: planner.ContainerPlan, out: Out) -> None:
    """The image, where it comes from, what it holds, and why it fits the target."""
    ref, facts = box.pick.ref, box.pick.facts
    where = f"the local file {ref.path}" if ref.local else f"registry {ref.host}"
    where += f", fetched from the site mirror {box.mirror}" if box.mirror else ""
    out.result.field("image", f"{ref.text} ({where}), run by {box.runtime}, kept as {box.file}")
    cuda = "none (CPU only)" if facts.cuda == "" else (facts.cuda or "unknown")
    archs = ", ".join(facts.archs) if facts.archs is not None else "unknown"
    out.result.field(
        "image holds",
        f"torch {facts.torch or 'unknown'}, CUDA {cuda}, Python {facts.python or 'unknown'}; for {archs}",
    )
    by_origin: dict[str, list[str]] = {}
    for name, origin in facts.origins.items():
        by_origin.setdefault(origin, []).append(name)
    for origin, names in by_origin.items():
        out.result.field(f"  {', '.join(names)} from", origin)
    for why in box.pick.fits:
        out.result.field("fits", why)
    binds = ",".join(box.binds) or "none"
    out.result.field("runs with", f"binds {binds}; GPU {'on' if box.gpu else 'off'}; MPI from the {box.mpi}")
    if box.overlay is not None:
        layer = box.overlay
        out.result.field(
            "packages on top",
            f"{', '.join(layer.packages)} from {layer.index}, in the overlay venv {layer.path}",
        )


def _render_validation(p: planner.Plan, out: Out) -> None:
    out.result.heading("Validation")
    out.result.field("launcher", p.launcher)
    out.result.field("command", launchers.display(p.launch_command))
    if p.interactive_command:
        out.result.field("interactive allocation", launchers.display(p.interactive_command))
    if p.batch_script:
        out.result.line("  batch script:")
        for line in p.batch_script.rstrip().splitlines():
            out.result.line(f"    {line}")


def _render_list(heading: str, items: Iterable[str], out: Out) -> None:
    out.result.line()
    out.result.heading(heading)
    for item in items:
        out.result.line(f"  - {item}")
