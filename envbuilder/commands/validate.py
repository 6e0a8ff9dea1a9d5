"""`envbuilder validate ENV`: run the bundled checks on the right nodes and print one report."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from envbuilder import __version__
from envbuilder.core import settings
from envbuilder.core.errors import PublishError, StateError, UsageError
from envbuilder.core.facts import HostFacts
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.system import host, state, strictmodes
from envbuilder.system.console import Out
from envbuilder.validate import junit, report, session
from envbuilder.validate import runner as validator

if TYPE_CHECKING:
    from envbuilder.recipe import registry
    from envbuilder.scale import image


def options(args: argparse.Namespace) -> validator.Options:
    return validator.Options(
        checks=tuple(args.checks.split(",")) if getattr(args, "checks", None) else None,
        launcher=getattr(args, "launcher", None),
        nodes=getattr(args, "nodes", None),
        nproc_per_node=getattr(args, "ranks_per_node", None),
        cpu=bool(getattr(args, "cpu", False)),
        submit=bool(getattr(args, "submit", False)),
        account=getattr(args, "account", None),
        partition=getattr(args, "partition", None),
        timeout=getattr(args, "timeout", None),
        wait=getattr(args, "wait_job", None),
    )


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    home = settings.home(env)
    record = state.load(home, args.env)
    used = _image(record, args, env, out)
    # Only a missing prefix stops the run here; a full health walk would stat every installed file first.
    if used is None and not Path(record.prefix).is_dir():
        raise StateError(
            f"{record.name} is gone from {record.prefix}", hint=f"envbuilder create {record.recipe}"
        )
    if used is None:  # the checks run the env's python, from its bin
        strictmodes.env_scripts(Path(record.prefix), ["bin"])
    catalog = Catalog.from_env(env)
    version = str(record.plan.get("recipe_version") or "")
    ref = f"{record.recipe}@{version}" if version else record.recipe
    target = _report_target(record.name, ref, catalog, args.registry) if args.publish_report else None
    recipe = loader.load(ref, catalog)
    facts = host.facts_for(args.facts)
    ran, opts = record, options(args)
    if used:
        # The mount is read-only: the run's files go beside it, and the record is stored below as the env's.
        from envbuilder.scale import image  # noqa: PLC0415 - images and publishing: ~60 ms of imports off every run

        ran, opts = image.mounted_record(record, used), replace(opts, runs=str(image.runs_dir(used)))
    result = session.execute(
        ran, recipe, facts, env, opts, out=out, quiet=args.json, home=None if used else home
    )
    if used:
        site = session.site_store(env)
        result = session.keep_history(
            home, record, recipe=recipe, facts=facts, result=result, out=out, site=site
        )
        validator.store(home, record, result)
    if args.junit:
        Path(args.junit).write_text(junit.junit(result), encoding="utf-8")
    data = session.finish(result)  # a failed validation raises here: only passing reports are published
    if target is not None:
        from envbuilder.recipe import publish  # noqa: PLC0415 - see image above

        reg, name = target
        stamp = stamp_of(result, facts)
        publish.attach_validation(reg, name, version, stamp)
        data["published_report"] = {"registry": str(reg.root), "recipe": f"{name}@{version}", **stamp}
        if not args.json:
            out.result.line(f"attached this passing report to {name}@{version} in {reg.root}")
    return data


def _image(
    record: state.EnvRecord, args: argparse.Namespace, env: dict[str, str], out: Out
) -> Optional[image.InUse]:
    """With --image: the env's image, mounted (or unpacked) on this node."""
    if not getattr(args, "image", False):
        return None
    if getattr(args, "submit", False):
        raise UsageError(
            "validate --image mounts the image on this node; a submitted job runs on others",
            hint="run validate --image inside the job (or the allocation) instead of --submit",
        )
    from envbuilder.scale import image  # noqa: PLC0415 - see handle

    used = image.use(record, env)
    if used.cleaned:
        out.line(f"unmounted a dead mount of {record.name}'s image before mounting it again")
    return used


def _report_target(
    env_name: str, ref: str, catalog: Catalog, registry_dir: Optional[str]
) -> tuple[registry.Registry, str]:
    """The registry holding the published version this env was built from."""
    from envbuilder.recipe import registry  # noqa: PLC0415 - see handle

    name, _, version = ref.partition("@")
    if not version:
        raise PublishError(
            f"{env_name} was built from {name}, which is not a published recipe: there is no version to stamp",
            hint=f"build it from the registry (envbuilder create {name}@VERSION), then validate it",
        )
    if registry_dir:
        return registry.Registry(Path(registry_dir).expanduser()), name
    entry = catalog.lookup(ref)
    if entry.layer.registry is None:
        raise PublishError(f"{ref} is not in a registry on the recipe path", hint="pass --registry DIR")
    return entry.layer.registry, name


def stamp_of(result: report.Report, facts: HostFacts) -> dict[str, Any]:
    """The tested-on stamp: where, when, how, and the key figures of a passing report."""
    figures = {}
    for row in result.rows:
        for fig_name, fig in row.figures.items():
            figures[f"{row.check}.{fig_name}"] = f"{fig['value']} {fig.get('unit', '')}".rstrip()
    gpus = facts.gpus or ()
    return {
        "status": "pass",
        "date": result.started,
        "partition": result.partition,
        "host": facts.hostname,
        "gpus": f"{len(gpus)}x {gpus[0].name}" if gpus else "none",
        "launcher": result.launcher,
        "device": result.device,
        "ranks": result.world,
        "nodes": result.nodes,
        "checks": {row.check: row.status for row in result.rows},
        "figures": figures,
        "envbuilder": __version__,
    }
