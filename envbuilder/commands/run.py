"""`envbuilder run ENV -- PROGRAM ...` and `envbuilder sbatch ENV -- PROGRAM ...`: the user's own program with the
launch rules the validation proved."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from envbuilder.core import settings
from envbuilder.core.errors import StateError, UsageError
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.scale import image, staging
from envbuilder.system import host, modules, proc, state, strictmodes
from envbuilder.system.console import Out
from envbuilder.validate import program


class ProgramStatus(int):
    """A command whose exit status is its program's: the CLI returns it as it is, with no envelope."""


def _request(args: argparse.Namespace) -> program.Request:
    return program.Request(
        program=tuple(args.program),
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        partition=args.partition,
        account=args.account,
        launcher=args.launcher,
    )


def _prepare(args: argparse.Namespace, out: Out, *, batch: bool) -> tuple[Any, ...]:
    """The env, the record the program runs from (at a mount or staged copy) and the env's own, its recipe and
    the launch."""
    env = dict(os.environ)
    record = own = state.load(settings.home(env), args.env)
    stage: list[str] = []
    if args.stage and getattr(args, "image", False):
        raise UsageError("--stage and --image are two ways to use the image: pick one")
    if args.stage and batch:
        staged, stage = staging.in_job_script(record)
        record = staging.staged_record(record, staged)
    elif args.stage:
        if args.dry_run:
            staged = staging.planned(record, env)
        else:
            staged = staging.stage(record, env)
            out.line(f"staged {record.name} on {staged.nodes} node(s) at {staged.path}")
        record = staging.staged_record(record, staged)
    elif getattr(args, "image", False):
        # From the node-local copy: the env directory itself may even have been purged.
        used = image.use(record, env)
        if used.cleaned:
            out.line(f"unmounted a dead mount of {record.name}'s image before mounting it again")
        record = image.mounted_record(record, used)
    elif state.health(record).status == "gone":
        raise StateError(
            f"{record.name} is gone from {record.prefix}", hint=f"envbuilder create {record.recipe}"
        )
    else:
        # The program runs the env's python, from its bin: no one else may be able to put theirs there.
        strictmodes.env_scripts(Path(record.prefix), ["bin"])
    version = str(record.plan.get("recipe_version") or "")
    recipe = loader.load(f"{record.recipe}@{version}" if version else record.recipe, Catalog.from_env(env))
    prepared = program.prepare(record, recipe, host.probe(env), env, _request(args), batch=batch, stage=stage,
                               module_init=modules.detect(env).init_dir)  # fmt: skip
    for text in prepared.warnings:
        out.warn(text)
    return env, record, own, recipe, prepared


def handle_run(args: argparse.Namespace, out: Out) -> ProgramStatus:
    env, record, _own, recipe, prepared = _prepare(args, out, batch=False)
    if args.dry_run:
        print(proc.quote(program.command_here(prepared)))
        return ProgramStatus(0)
    with proc.sigterm_as_interrupt():
        return ProgramStatus(program.run_here(record, recipe, prepared, env, modules.detect(env)))


def handle_sbatch(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    # The job script goes into the env's own directory, where its ranks find what it names; its output into
    # the directory sbatch runs from (or --output).
    env, _record, record, _recipe, prepared = _prepare(args, out, batch=True)
    adapter, script = program.job_script(record, prepared)
    if args.dry_run:
        stamp = "STAMP"  # the real run's time and pid
        output = program.job_output(adapter, record.name, args.output, Path.cwd(), stamp)
        if not args.json:
            print(script, end="")
        return {"env": record.name, "script": script, "output": output, "submitted": False}
    job = program.submit(record, prepared, env, args.output)
    if not args.json:
        print(job.job)
        out.line(f"submitted job {job.job}: {job.script} (output: {job.output})")
    return {
        "env": record.name,
        "job": job.job,
        "script_path": job.script,
        "output": job.output,
        "submitted": True,
    }
