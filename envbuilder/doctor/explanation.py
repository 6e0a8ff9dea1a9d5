"""What a failed job's output means (pure): the signatures found (:mod:`.signatures`), each tied to the env the job
ran where one is known, and an honest "nothing known" where none matched.

The tie to the env reads only what the caller hands in (:class:`EnvFacts`: the env's record and its torch's
compiled arch list): the job's GPU architecture against the wheel's, a missing module against the env's
packages, a missing CUDA library against the env's CUDA variant and modules, a driver against the CUDA the env's
torch was built for."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from envbuilder.core.structs import dataclass
from envbuilder.doctor.signatures import Match

VERSION = 1


@dataclass(frozen=True)
class EnvFacts:
    """What the caller knows of the env the job ran: its name and why it is thought to be that env, and what its
    record and files say."""

    name: str
    #: How the env was named: "--env", "the job script's ENVBUILDER_ENV", "the job script's activate line"...
    named_by: str
    torch: str = ""  # "2.13.0"
    variant: str = ""  # "cu126", "cpu"
    cuda: str = ""  # "12.6"
    #: The compiled arch list of the env's torch (``sm_80``...); None where it could not be read.
    arch_flags: Optional[tuple[str, ...]] = None
    #: Why the arch list is unknown, where it is.
    arch_unknown: str = ""
    packages: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    recipe: str = ""


@dataclass(frozen=True)
class Explanation:
    source: str  # "LOG" or "job 123 (Slurm): out=..., err=..."
    matches: tuple[Match, ...]
    env: Optional[EnvFacts] = None
    #: Facts of the job the scheduler told (state, exit code, nodes), in words.
    job: tuple[tuple[str, str], ...] = ()
    #: Lines read, and whether only the output's end was read.
    lines: int = 0
    cut: bool = False
    #: The scheduler's queries that did not answer before the one that did (sacct where there is no accounting).
    unanswered: tuple[str, ...] = ()
    #: The files read, shown whole on lines of their own (a path is not cut to the console's width).
    files: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return bool(self.matches)

    def notes(self, m: Match) -> list[str]:
        """What the env adds to one match (empty where no env is known or it has nothing to say)."""
        return env_notes(m, self.env) if self.env else []

    def next_step(self) -> str:
        doctor = f"envbuilder doctor {self.env.name}" if self.env else "envbuilder doctor ENV"
        if not self.matches:
            return f"no known signature in this output; run `{doctor}` to check the env itself"
        if any(m.signature.doctor for m in self.matches):
            return f"the env may be at fault: run `{doctor}`"
        return ""

    def to_json(self) -> dict[str, Any]:
        env = self.env
        return {
            "version": VERSION,
            "source": self.source,
            "job": dict(self.job),
            "unanswered": list(self.unanswered),
            "lines_read": self.lines,
            "only_the_end_read": self.cut,
            "env": None
            if env is None
            else {
                "name": env.name,
                "named_by": env.named_by,
                "torch": env.torch,
                "variant": env.variant,
                "arch_flags": list(env.arch_flags) if env.arch_flags is not None else None,
                "arch_unknown": env.arch_unknown,
            },
            "known": self.known,
            "matches": [
                {
                    "id": m.signature.id,
                    "summary": m.signature.summary,
                    "means": m.text("means"),
                    "fix": m.text("fix"),
                    "source": m.signature.source,
                    "file": m.signature.file,
                    "lines": [{"line": n, "text": t} for n, t in m.lines],
                    "count": m.count,
                    "facts": dict(m.facts),
                    "env_notes": self.notes(m),
                }
                for m in self.matches
            ],
            "next": self.next_step(),
        }


def env_notes(m: Match, env: EnvFacts) -> list[str]:
    """The env's side of a match, from the facts it pulled (:data:`~.signatures.KNOWN_FACTS`)."""
    fact = m.fact
    notes: list[str] = []
    if "gpu_sm" in fact:
        notes += _arch_note(_sm(fact["gpu_sm"]), env, fact.get("wheel_sms", ""))
    if "module" in fact:
        notes.append(_module_note(fact["module"], env))
    if "library" in fact:
        notes.append(_library_note(fact["library"], env))
    if "driver_cuda" in fact and env.cuda:
        notes.append(
            f"{env.name}'s torch {env.torch} is built for CUDA {env.cuda} ({env.variant}); the node's driver "
            f"supports CUDA {_cuda_version(fact['driver_cuda'])}: rebuild {env.name} for that node (`envbuilder plan {env.recipe or 'RECIPE'}"
            " --facts NODE.json`, the node's facts from `envbuilder probe --json`, picks a variant it can run)"
        )
    return notes


def _cuda_version(text: str) -> str:
    """CUDA's version number as the driver API gives it (11040) in words (11.4)."""
    if not text.isdigit() or len(text) < 4:
        return text
    number = int(text)
    return f"{number // 1000}.{number % 1000 // 10}"


def _sm(text: str) -> str:
    """``sm_70`` from ``sm_70``, ``7.0`` or ``70``."""
    m = re.fullmatch(r"(?:sm_)?(\d+)\.?(\d)?", text.strip())
    if not m:
        return text
    return f"sm_{m.group(1)}{m.group(2) or ''}"


def _arch_note(sm: str, env: EnvFacts, wheel_sms: str) -> list[str]:
    head = f"{env.name}'s torch {env.torch} ({env.variant or '?'})"
    if env.arch_flags is None:
        listed = f"; the job's own message lists {wheel_sms}" if wheel_sms else ""
        return [
            f"{head}: its arch list could not be read ({env.arch_unknown or 'unknown'}){listed}; the job ran on {sm}"
        ]
    flags = " ".join(env.arch_flags) or "(none)"
    has = sm in env.arch_flags
    verdict = (
        f"{sm} is in that list, so this env's torch has code for the job's GPU: the job did not run this env's "
        "torch (check the job's activate line and PYTHONPATH), or an extension of its own lacks it"
        if has
        else f"{sm} is not in that list"
    )
    fix = (
        ""
        if has
        else f"; build an env for that node's GPU: `envbuilder plan {env.recipe or 'RECIPE'} --facts NODE.json` "
        f"(`envbuilder probe --json` on the node) picks a variant compiled for it, and `envbuilder doctor "
        f"{env.name} --facts NODE.json` says what this env lacks there"
    )
    return [f"{head} has {flags}; the job ran on {sm}: {verdict}{fix}"]


def _module_note(module: str, env: EnvFacts) -> str:
    top = module.split(".", maxsplit=1)[0]
    wanted = {_norm(top)}
    if _norm(top) in {_norm(p) for p in env.packages} or wanted & _aliases(env.packages):
        return (
            f"{top} is installed in {env.name}: the job's python was not {env.name}'s (a `module purge` after "
            f"activating, another python first on PATH): activate {env.name} after the module loads, or run "
            f"the program with `envbuilder run {env.name} ...`"
        )
    return (
        f"{top} is not among {env.name}'s packages: add it to the recipe ({env.recipe or 'RECIPE'}) and create the "
        "env again, or check the name"
    )


def _aliases(packages: Sequence[str]) -> set[str]:
    """Import names that differ from the distribution's (the common ones)."""
    known = {"pyyaml": "yaml", "pillow": "pil", "scikit-learn": "sklearn", "mpi4py": "mpi4py"}
    return {_norm(known[p]) for p in (_norm(p) for p in packages) if p in known}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _library_note(library: str, env: EnvFacts) -> str:
    loads = f" and loads the modules {', '.join(env.modules)}" if env.modules else ""
    if env.variant and env.variant.startswith("cu"):
        return (
            f"{env.name}'s torch is built for CUDA {env.cuda or env.variant}{loads}; {library} comes with its "
            f"nvidia-* wheels: the job did not use {env.name}'s activation (or a module's LD_LIBRARY_PATH put "
            f"another CUDA first): run it with `envbuilder run {env.name} ...` and check `envbuilder doctor "
            f"{env.name}`"
        )
    return (
        f"{env.name}'s torch is a {env.variant or 'non-CUDA'} build{loads}: {library} is not part of it; "
        "the program wants a CUDA build (a CUDA variant of the recipe) or a module that provides the library"
    )


_VARIABLE = re.compile(r"\bENVBUILDER_ENV=[\"']?([A-Za-z0-9][A-Za-z0-9_.-]*)")
_VERB = re.compile(r"\benvbuilder +(?:activate|run) +([^\n;&|]*)")
_ACTIVATE = re.compile(r"^\s*(?:source|\.) +[\"']?([^\"'\s]+)/bin/activate(?:\.[a-z]+)?[\"']?\s*$", re.M)


def env_in_script(
    script: str, variables: Mapping[str, str], prefixes: Mapping[str, str]
) -> Optional[tuple[str, str]]:
    """The env a job ran and how that is known: ENVBUILDER_ENV among its variables or in its script, an
    ``envbuilder activate|run ... NAME`` line naming a recorded env, or a ``source PREFIX/bin/activate`` of a
    recorded env's prefix (``prefixes``: each recorded env's prefix and name)."""
    if variables.get("ENVBUILDER_ENV"):
        return variables["ENVBUILDER_ENV"], "the job's ENVBUILDER_ENV variable"
    m = _VARIABLE.search(script)
    if m:
        return m.group(1), "the job script's ENVBUILDER_ENV"
    names = set(prefixes.values())
    for m in _VERB.finditer(script):
        # The first word that is a recorded env's name: options and their values come before it.
        word = next((w for w in (w.strip("\"'()") for w in m.group(1).split()) if w in names), None)
        if word:
            return word, "the job script's envbuilder line"
    for m in _ACTIVATE.finditer(script):
        name = prefixes.get(m.group(1).rstrip("/"))
        if name:
            return name, "the job script's activate line"
    return None
