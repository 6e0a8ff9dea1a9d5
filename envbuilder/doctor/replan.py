"""Does the env still fit this node: its recipe planned again for the node's facts, and the interpreter it runs
on. Pure: the env's python is run by :mod:`envbuilder.doctor.collect`, which hands over a :class:`PythonState`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Optional

from envbuilder import plan as planner
from envbuilder.core.errors import EnvbuilderError, RecipeNotFound, ResolverError, ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.doctor.findings import ACTION, INFO, WARNING, Finding
from envbuilder.recipe.loader import Recipe
from envbuilder.resolver.indexfacts import IndexFacts
from envbuilder.resolver.matrix import Matrix
from envbuilder.resolver.wheels import Resolution, TorchRequest, resolve
from envbuilder.system.state import EnvRecord

# ---------------------------------------------------------------------------------------------------------------
# The env re-planned against this node's facts


def facts_for_env(facts: HostFacts, record: EnvRecord) -> HostFacts:
    """The node's facts with the env's own Python: the wheel must fit the interpreter the env has."""
    python = record.tools.get("python") if record.tools else None
    return replace(facts, python=python) if python else facts


def replan_findings(
    record: EnvRecord,
    recipe: Optional[Recipe],
    recipe_error: Optional[EnvbuilderError],
    facts: HostFacts,
    env: Mapping[str, str],
    *,
    index: Optional[IndexFacts] = None,
    matrix: Optional[Matrix] = None,
) -> list[Finding]:
    """Plan the env's recipe again for ``facts`` and compare the torch build with the recorded one."""
    if recipe is None:
        return [_unloadable(record, recipe_error)]
    name = record.name
    recorded = (record.plan or {}).get("torch") or None
    built = _build_text(recorded)
    opts = planner.Options(prefix=record.prefix)
    try:
        new = planner.build(recipe, facts_for_env(facts, record), env, opts, matrix=matrix, index=index)
    except ResolverErrors as exc:
        return [_gate_finding(name, built, e) for e in exc.errors]
    except ResolverError as exc:
        return [_gate_finding(name, built, exc)]
    except EnvbuilderError as exc:
        return [
            Finding(ACTION, name, "replan", f"its recipe no longer plans here: {exc.message}", exc.hint or "")
        ]
    if recorded is None or new.resolution is None:
        return []
    return _compared(record, recorded, new.resolution, facts, matrix)


def _unloadable(record: EnvRecord, recipe_error: Optional[EnvbuilderError]) -> Finding:
    why = recipe_error.message if recipe_error else f"recipe {record.recipe!r} could not be loaded"
    gone = isinstance(recipe_error, RecipeNotFound)
    return Finding(
        WARNING,
        record.name,
        "replan",
        (f"its recipe {record.recipe!r} is gone: " if gone else "its recipe no longer loads: ")
        + f"{why}; the env still runs, but cannot be re-planned or rebuilt from it",
        f"envbuilder backup {record.name} keeps this env; `envbuilder recipes list` shows the recipes there are",
    )


def _compared(
    record: EnvRecord,
    recorded: Mapping[str, Any],
    res: Resolution,
    facts: HostFacts,
    matrix: Optional[Matrix],
) -> list[Finding]:
    """The torch build the env has beside the one its recipe plans now: broken here, the same, or another."""
    name = record.name
    built = _build_text(recorded)
    broken = installed_findings(record, facts_for_env(facts, record), matrix)
    if broken:
        rebuild = f"rebuild it for this node: envbuilder create {name} --force (it would install torch {res.torch} {res.variant})"
        return [replace(f, fix=rebuild) for f in broken]
    if (res.torch, res.variant) == (recorded.get("torch"), recorded.get("variant")):
        return [Finding(INFO, name, "replan", f"{built} still resolves the same for this node")]
    inferred = " (newer than the shipped table: its GPU facts are inferred)" if res.inferred else ""
    return [
        Finding(
            WARNING,
            name,
            "replan",
            f"a rebuild would now install torch {res.torch} {res.variant}{inferred}, not the {built} it has",
            f"envbuilder create {name} --force moves it; to keep {built}, pin torch.version and "
            "torch.variant in the recipe",
        )
    ]


#: The gates that say a built wheel cannot run on a node (the others concern what an index offers).
RUNTIME_GATES = ("driver", "gpu-arch", "glibc", "python", "platform")


def installed_findings(record: EnvRecord, facts: HostFacts, matrix: Optional[Matrix] = None) -> list[Finding]:
    """Whether the torch build the env HAS runs on ``facts`` (an ``auto`` recipe may plan another variant now,
    which says nothing about the one installed): its release and variant put through the runtime gates."""
    recorded = (record.plan or {}).get("torch") or {}
    if not recorded.get("torch") or not recorded.get("variant"):
        return []
    request = TorchRequest(
        version=str(recorded["torch"]),
        variant=str(recorded["variant"]),
        channel=str(recorded.get("channel") or "stable"),
        packages=("torch",),
        torchvision=None,
        torchaudio=None,
    )
    try:
        resolve(request, facts, matrix)
    except ResolverErrors as exc:
        errors: list[ResolverError] = exc.errors
    except ResolverError as exc:
        errors = [exc]
    else:
        return []
    built = _build_text(recorded)
    return [
        Finding(
            ACTION,
            record.name,
            "installed",
            f"the installed {built} cannot run here ({e.gate}): {e.message}",
            "",
            gate=e.gate,
        )
        for e in errors
        if e.gate in RUNTIME_GATES
    ]


def _build_text(recorded: Optional[Mapping[str, Any]]) -> str:
    if not recorded:
        return "its build"
    return f"torch {recorded.get('torch')} {recorded.get('variant')}"


def _gate_finding(name: str, built: str, err: ResolverError) -> Finding:
    return Finding(
        ACTION,
        name,
        "replan",
        f"{built} does not fit this node ({err.gate}): {err.message}",
        err.hint or f"rebuild it for this node: envbuilder create {name} --force",
        gate=err.gate,
    )


# ---------------------------------------------------------------------------------------------------------------
# The env's python


@dataclass(frozen=True)
class PythonState:
    #: The interpreter the env was built from (record.tools["python_path"]), "" when not recorded.
    base: str
    base_exists: bool
    #: The env's own python (PREFIX/bin/python; the site python for user-prefix envs).
    python: str
    #: None: not run (the env is gone); else whether it started.
    runs: Optional[bool] = None
    #: Its X.Y.Z when it ran, else the tail of what it said.
    detail: str = ""


def python_findings(record: EnvRecord, py: PythonState) -> list[Finding]:
    """The interpreter under the env: gone (a retired module's Python, an OS upgrade), not starting, or another
    minor version than the packages were installed for."""
    name = record.name
    rebuild = f"rebuild it with a Python this node has: envbuilder create {name} --force"
    if py.base and not py.base_exists:
        if ((record.plan or {}).get("python") or {}).get("origin") == "managed":
            # The uv-managed CPython under the envbuilder home was removed: either verb installs it again.
            rebuild = (
                f"envbuilder restore {name} --force (or create {name} --force) "
                "installs the managed CPython again"
            )
        return [Finding(ACTION, name, "python", f"the Python it was built from is gone: {py.base}", rebuild)]
    if py.runs is False:
        return [Finding(ACTION, name, "python", f"its python does not start: {py.detail}", rebuild)]
    recorded = (record.tools or {}).get("python", "")
    if py.runs and recorded and _minor(py.detail) != _minor(recorded):
        return [
            Finding(
                ACTION,
                name,
                "python",
                f"its python is now {py.detail}, but it was built with {recorded}: the packages it has are "
                "for another Python",
                rebuild,
            )
        ]
    return []


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
