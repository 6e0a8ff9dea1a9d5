"""Pure renderers for scheduler text: the interactive allocation argv and the validation batch script (around
the directives of a :mod:`schedulers` adapter). A plan shows both (through :mod:`.suite`), so they live in ``plan``
rather than ``render``, which sits above it.

Scheduler dialects come from the recipe (Vista rejects --gres/--gpus-per-task/--mem; Cirrus needs --gres and
--qos; Polaris is PBS with -l filesystems=). Every recipe value that lands in a script is shell-quoted, and none
may hold a line break or a NUL: a directive line (``#SBATCH --partition=...``) cannot be quoted, so a line break
there would start a line of shell code, and sbatch and qsub split it at whitespace, so a partition, account,
walltime or job name holds none and never starts with '-' (each has its pattern in :mod:`recipe.values`). The
loader refuses such values at plan time and the command line at parse time; the renderers here refuse them again
for values that come from elsewhere (a state record, the job's environment), and a forbidden flag anywhere in a
directive or a command envbuilder builds for the scheduler.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Optional

from envbuilder.core import launchers, schedulers, values
from envbuilder.core.errors import RecipeError
from envbuilder.core.modulelines import module_lines
from envbuilder.core.schedulers import JobShape
from envbuilder.core.structs import dataclass
from envbuilder.core.values import require_carriable

if TYPE_CHECKING:  # only a type here: the activation is planned (planning imports batch through suite)
    from envbuilder.plan.activation import Activation


def minutes(time: str) -> int:
    """A walltime in Slurm's forms in whole minutes, rounded up."""
    return -(-(values.time_seconds(time) or 0) // 60)


@dataclass(frozen=True)
class Threads:
    """OMP threads per rank in a job script: the CPU depth per rank where the launcher binds one, else the CPUs
    the job holds on the node (the scheduler's variable; ``cores`` or ``nproc`` where it is unset) divided
    among the node's ranks."""

    ranks_per_node: int
    depth: Optional[int] = None
    cores: Optional[int] = None

    def lines(self, cpus_var: str) -> list[str]:
        if self.depth:
            return [f"export OMP_NUM_THREADS={int(self.depth)}"]
        fallback = str(int(self.cores)) if self.cores else "$(nproc)"
        ranks = max(1, int(self.ranks_per_node))
        return [
            f"cpus=${{{cpus_var}:-{fallback}}}",
            f"export OMP_NUM_THREADS=$(( cpus > {ranks} ? cpus / {ranks} : 1 ))",
        ]


#: The placeholders of an interactive template (scheduler.interactive), as the recipe's errors list them.
PLACEHOLDERS = ("partition", "nodes", "tasks", "cpus", "time", "minutes", "gpus", "account")


def interactive_argv(template: Sequence[str], job: JobShape) -> list[str]:
    """Fill the site's interactive template ({partition} {nodes} {tasks} {cpus} {time} {minutes} {gpus}
    {account}; {cpus} is the CPUs per task the launch uses, which a step asks for or gets one). A word whose
    placeholder has no value (no --account given, whole nodes that need no CPU count) is left out, and with it
    the option before it where the value is a word of its own: never ``-A ''`` or ``--cpus-per-task=``."""
    values = {
        "partition": job.partition or "",
        "nodes": str(job.nodes),
        "tasks": str(job.nodes * job.tasks_per_node),
        "cpus": str(job.cpus_per_task) if job.cpus_per_task else "",
        "time": job.walltime,
        "minutes": str(minutes(job.time)),
        "gpus": str(job.gpus_per_node),
        "account": job.account or "",
    }
    out: list[str] = []
    for part in template:
        try:
            filled = part.format(**values)
            empty = any(
                name is not None and not values[name] for _, name, _, _ in string.Formatter().parse(part)
            )
        except (KeyError, IndexError, ValueError):
            raise RecipeError(
                f"unknown placeholder in {part!r}",
                key="scheduler.interactive",
                hint="placeholders: " + " ".join(f"{{{name}}}" for name in PLACEHOLDERS),
            ) from None
        if empty:
            if filled == "" and out and out[-1].startswith("-"):
                out.pop()
            continue
        out.append(filled)
    return out


def options(words: Sequence[str], aliases: Mapping[str, str]) -> list[tuple[str, str]]:
    """The options among ``words``, as (spelled, name): ``--error=F`` is --error, ``-eF`` is -e; ``name`` is the
    long spelling of a short option where ``aliases`` (the scheduler's) has one, so -e and --error are one."""
    found = []
    for word in words:
        if word.startswith("--") and len(word) > 2:
            spelled = word.split("=", 1)[0]
        elif word.startswith("-") and len(word) > 1 and word[1] != "-":
            spelled = word[:2]
        else:
            continue
        found.append((spelled, aliases.get(spelled, spelled)))
    return found


def check_dialect(
    directives: Sequence[str],
    forbidden: Sequence[str],
    allowed: Sequence[str],
    recipe_file: str,
    aliases: Optional[Mapping[str, str]] = None,
) -> None:
    """Every directive must pass the site's dialect: no forbidden option anywhere in it (sbatch and qsub split a
    directive line at whitespace, so a value that held one would pass it), and only allowed ones where a list
    exists."""
    aliases = aliases or {}
    banned = {aliases.get(f, f) for f in forbidden}
    permitted = {aliases.get(f, f) for f in allowed}
    for directive in directives:
        for i, (spelled, name) in enumerate(options(directive.split(), aliases)):
            shown = spelled if spelled == name else f"{spelled} ({name})"
            inside = f"it is inside the directive {directive!r}: a value there holds an option"
            if name in banned:
                raise RecipeError(
                    f"the batch script would pass {shown}, which this site rejects",
                    file=recipe_file,
                    key="scheduler.forbidden_flags",
                    hint=inside if i else "change scheduler.gpu_request or scheduler.required_flags",
                )
            if permitted and name not in permitted:
                raise RecipeError(
                    f"the batch script would pass {shown}, which is not in this site's allowed flags",
                    file=recipe_file,
                    key="scheduler.allowed_flags",
                    hint=inside if i else f"allowed: {', '.join(allowed)}",
                )


def check_command(
    argv: Sequence[str],
    forbidden: Sequence[str],
    what: str,
    recipe_file: str,
    aliases: Optional[Mapping[str, str]] = None,
) -> None:
    """No forbidden option in ``argv``, a command envbuilder builds for the scheduler (``what`` says which: the
    interactive allocation, the srun step, the submit command)."""
    aliases = aliases or {}
    banned = {aliases.get(f, f) for f in forbidden}
    for spelled, name in options(argv, aliases):
        if name in banned:
            shown = spelled if spelled == name else f"{spelled} ({name})"
            raise RecipeError(
                f"the {what} would pass {shown}, which this site rejects",
                file=recipe_file,
                key="scheduler.forbidden_flags",
                hint="this site's scheduler refuses it: take it out of forbidden_flags only if the site allows it",
            )


def module_init_lines(init_dir: Optional[str]) -> list[str]:
    """The module system's bash init, sourced where the job's shell has no ``module``: a job script is a bash
    that reads no profile, and gets ``module`` only as a function exported by a bash login shell (a user whose
    shell is tcsh, zsh or fish exports none, nor does ``--export=NONE``). As the activate scripts do; ``set -u``
    is off around it (init scripts read unset variables)."""
    if not init_dir:
        return []
    init = shlex.quote(f"{init_dir}/bash")
    return [f"if ! type module >/dev/null 2>&1 && [ -f {init} ]; then set +u; . {init}; set -u; fi"]


@dataclass(frozen=True)
class JobEnv:
    """The env as a job enters it, as ``envbuilder run`` does (runner.environment): its bin first on PATH, so a
    program started as ``python`` is the env's and not the module's, and VIRTUAL_ENV (PYTHONUSERBASE for an env
    over the site's python); and its OpenMP threads, where the job sets them."""

    prefix: str
    own_python: bool = True
    threads: Optional[Threads] = None
    #: False for a container env: its programs run inside its image (the launch says how), nothing on the host.
    enter: bool = True

    def lines(self) -> list[str]:
        require_carriable(self.prefix, "env prefix")
        if not self.enter:
            return []
        var = "VIRTUAL_ENV" if self.own_python else "PYTHONUSERBASE"
        bin_dir = shlex.quote(f"{self.prefix}/bin")
        return [f"export {var}={shlex.quote(self.prefix)}", f'export PATH={bin_dir}"${{PATH:+:$PATH}}"']


def conda_lines(activate: Activation) -> list[str]:
    """``conda activate`` of the recipe's conda env, after the modules that define ``conda``; the job stops with
    a message where there is no ``conda`` or it fails. conda's shell functions read unset variables, so ``set
    -u`` is off around them."""
    if not activate.conda_env:
        return []
    env = shlex.quote(activate.conda_env)
    missing = shlex.quote(
        f"envbuilder: no conda command once the modules are loaded: cannot conda activate {activate.conda_env}"
    )
    failed = shlex.quote(f"envbuilder: conda activate {activate.conda_env} failed")
    return [
        f"type conda >/dev/null 2>&1 || {{ echo {missing} >&2; exit 1; }}",
        "set +u",
        f"conda activate {env} || {{ echo {failed} >&2; exit 1; }}",
        "set -u",
    ]


def path_lines(activate: Activation) -> list[str]:
    """The lines that put ``activate``'s directories first and last in list variables (each value quoted; no
    empty entry where the variable was empty or unset)."""
    lines = []
    for key, entries in activate.prepend.items():
        joined = ":".join(shlex.quote(e) for e in entries)
        lines.append(f'export {key}={joined}"${{{key}:+:${key}}}"')
    for key, entries in activate.append.items():
        joined = ":".join(shlex.quote(e) for e in entries)
        lines.append(f'export {key}="${{{key}:+${key}:}}"{joined}')
    return lines


@dataclass(frozen=True)
class Rendezvous:
    """Where a multi-node job's ranks meet: its first host, at the recipe's ``port`` or (None) the job's own."""

    port: Optional[int] = None


def script(
    *,
    scheduler: str,
    directives: Sequence[str],
    activate: Activation,
    launch: Sequence[launchers.Arg],
    rendezvous: Optional[Rendezvous] = None,
    workdir: str,
    stage: Sequence[str] = (),
    env: Optional[JobEnv] = None,
) -> str:
    """The job script: directives, then the modules ``activate`` loads (after the module system's init where the
    job's shell has no ``module``), its conda env, and the variables it sets and unsets (it refused what a script
    cannot carry when it was made), then the env entered (``env``: its bin on PATH, its threads), then the launch
    in ``workdir`` (a multi-node one meeting at its ``rendezvous``), after ``stage`` (the command that stages the
    env's image on the job's nodes), where one is given."""
    for directive in directives:
        require_carriable(directive, "scheduler (a batch directive)")
    require_carriable(workdir, "validation work directory")
    for arg in launch:
        if isinstance(arg, str):
            require_carriable(arg, "launch command")
    for arg in stage:
        require_carriable(arg, "staging command")
    adapter = schedulers.SCHEDULERS[scheduler]
    lines = ["#!/bin/bash", *(f"{adapter.directive} {d}" for d in directives), "", "set -euo pipefail"]
    lines += adapter.setup
    if activate.module_use or activate.modules or activate.conda_env:
        lines += module_init_lines(activate.module_init)
    lines += module_lines(activate.module_use, activate.modules)
    lines += conda_lines(activate)
    for var in activate.unset:
        lines.append(f"unset {var}")
    for key, value in activate.env.items():
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += path_lines(activate)
    if env is not None:
        lines += env.lines()
        if env.threads is not None and "OMP_NUM_THREADS" not in activate.env:
            lines += env.threads.lines(adapter.cpus_var)
    if rendezvous is not None:
        lines += [adapter.first_host, "export MASTER_ADDR", *adapter.port_lines(rendezvous.port)]
    lines.append(f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)}")
    if stage:
        lines.append(launchers.render(stage))
    lines.append(launchers.render(launch))
    return "\n".join(lines) + "\n"
