"""`envbuilder alloc ENV`: the allocation an env's launch needs, as the lines that ask the site's scheduler for
it (its own interactive command, the scheduler's interactive allocation, a shell on a node, a batch submission);
run inside a job, what the job lacks of it."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any, Optional

from envbuilder.core import schedulers, settings
from envbuilder.core.errors import CommandFailed, EnvNotFound, RecipeNotFound, UsageError
from envbuilder.plan import allocation, suite
from envbuilder.plan.target import target_facts
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.system import host, proc, state
from envbuilder.system.console import Out
from envbuilder.validate import runner

#: How long the scheduler may take to say how long a job has left.
QUERY_S = 10.0


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    record, recipe = _source(args.env, env)
    warnings: list[str] = []
    shape = _shape(args, record, recipe, warnings)
    advice = allocation.advise(recipe, shape, _script(args.script), time=args.time)
    if advice is None:
        raise UsageError(
            f"{recipe.name} names no scheduler (scheduler.type), so there is no allocation to ask for",
            hint=f"run it where you are: envbuilder run {args.env} -- PROGRAM",
        )
    if recipe.scheduler.account_required and not args.account:
        warnings.append("this site needs an allocation account for every job: pass --account")
    here = runner.locate(env)
    left = _time_left(here, env)
    missing = allocation.compare(advice, here, left) if here.in_job else []
    for text in (*warnings, *advice.notes):
        out.warn(text)
    name = args.env if record else None
    data = _data(name, recipe.name, shape.launcher.name, advice, here=here, missing=missing, left=left)
    if not args.json:
        _show(data, advice, here, missing, out)
    return data


def _shape(
    args: argparse.Namespace, record: Optional[state.EnvRecord], recipe: loader.Recipe, warnings: list[str]
) -> suite.Shape:
    """The launch's shape, as a job script would start it: the command line's, else the last passing
    validation's launcher, nodes and ranks per node, else the recipe's; the env's partition."""
    proved = _proved(record)
    partition = args.partition or (_recorded(record, "partition") if record else None)
    target = target_facts(recipe, host.facts_for(args.facts), warnings, [], partition=partition)
    request = suite.LaunchRequest(
        args.launcher or proved.get("launcher"),
        args.nodes or proved.get("nodes"),
        args.ranks_per_node or proved.get("ranks_per_node"),
        args.account,
        partition,
    )
    return suite.shape_for(recipe, target, request, suite.device_for(target, cpu=args.cpu), warnings)


def _time_left(here: schedulers.Where, env: dict[str, str]) -> Optional[int]:
    """How long the job ``here`` has left, where its scheduler answers at once; None otherwise."""
    adapter = schedulers.get(here.scheduler)
    argv = adapter.time_left_query(here.job) if adapter and here.job else None
    if argv is None:
        return None
    try:
        res = proc.run(argv, env=proc.scrubbed_env(env), timeout=QUERY_S, check=False)
    except (OSError, CommandFailed):  # no client here, or a controller that does not answer: unknown
        return None
    return adapter.time_left(res.stdout) if adapter and res.returncode == 0 else None


def _source(name: str, env: dict[str, str]) -> tuple[Optional[state.EnvRecord], loader.Recipe]:
    """The recorded env ``name`` and the recipe it was built from; else the recipe ``name`` itself."""
    catalog = Catalog.from_env(env)
    try:
        record = state.load(settings.home(env), name)
    except EnvNotFound as missing:
        try:
            return None, loader.load(name, catalog)
        except RecipeNotFound:  # neither: the env's message names the envs there are
            raise missing from None
    version = str(record.plan.get("recipe_version") or "")
    return record, loader.load(f"{record.recipe}@{version}" if version else record.recipe, catalog)


def _recorded(record: state.EnvRecord, key: str) -> Optional[str]:
    value = record.plan.get(key)
    return value if isinstance(value, str) else None


def _proved(record: Optional[state.EnvRecord]) -> dict[str, Any]:
    """The launch the env's last passing validation used (launcher, nodes, ranks per node); empty if none."""
    report = (record.validation if record else None) or {}
    if not report.get("ok") or not report.get("nodes") or not report.get("world"):
        return {}
    nodes, world = int(report["nodes"]), int(report["world"])
    return {"launcher": report.get("launcher"), "nodes": nodes, "ranks_per_node": max(1, world // nodes)}


def _script(given: Optional[str]) -> str:
    """The batch line's script, a word no command reads as an option."""
    script = given or allocation.SCRIPT
    if script.startswith("-") or not script.strip():
        raise UsageError(
            f"--script {given!r} is not a script's path", hint=f"for a file of that name: ./{given}"
        )
    return script


def _data(
    env_name: Optional[str],
    recipe: str,
    launcher: str,
    advice: allocation.Advice,
    *,
    here: schedulers.Where,
    missing: list[allocation.Missing],
    left: Optional[int],
) -> dict[str, Any]:
    job = advice.job
    inside = None
    if here.in_job:
        held = {
            "nodes": here.nodes,
            "cpus_per_node": here.cpus_per_node,
            "gpus": here.gpus,
            "visible_gpus": here.visible_gpus,
            "tasks": here.tasks,
            "seconds_left": left,
        }
        inside = {"job": here.job, "held": held, "missing": [m.to_json() for m in missing]}
    return {
        "env": env_name,
        "recipe": recipe,
        "scheduler": advice.scheduler,
        "launcher": launcher,
        "need": {
            **advice.need.to_json(),
            "partition": job.partition,
            "account": job.account,
            "time": job.walltime,
        },
        "lines": {label: list(argv) for label, argv in advice.lines()},
        "notes": list(advice.notes),
        "inside": inside,
    }


_LABELS = {
    "site": "the site's interactive command",
    "interactive": "an interactive allocation",
    "shell": "a shell on a node (a step: it holds only what it asks for)",
    "batch": "a batch job",
}


def _show(
    data: dict[str, Any],
    advice: allocation.Advice,
    here: schedulers.Where,
    missing: list[allocation.Missing],
    out: Out,
) -> None:
    need = data["need"]
    out.line(
        f"{data['env'] or data['recipe']} through {data['launcher']}: {need['nodes']} node(s), "
        f"{need['ranks_per_node']} rank(s) x {need['cores_per_rank']} core(s) and {need['gpus_per_node']} GPU(s) "
        f"per node, {need['time']}" + (f" on {need['partition']}" if need["partition"] else "")
    )
    for label, argv in advice.lines():
        print(f"# {_LABELS[label]}")
        print(shlex.join(argv))
    if not here.in_job:
        return
    if not missing:
        out.line(f"job {here.job} holds what the launch needs")
    for item in missing:
        verdict = "missing" if item.refuse else "short"
        out.warn(f"job {here.job}: {verdict}: {item.text}: ask with {' '.join(item.ask)}")
