"""One env's checks and the whole report: the env's safety (health, purge, backups), then every other check in
the order that lets one finding stand in for another (a pruned nightly is not reported twice). Pure: what it
needs is gathered into :class:`EnvInputs` and :class:`Context` first."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Callable, Optional

from envbuilder import lockfile
from envbuilder.core import kinds
from envbuilder.core.errors import EnvbuilderError
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.doctor.container import ImageState, container_findings
from envbuilder.doctor.findings import ACTION, INFO, SEVERITIES, WARNING, Finding, ordered
from envbuilder.doctor.index_checks import (
    NIGHTLY_OLD_DAYS,
    lock_findings,
    nightly_findings,
    table_findings,
    table_row_findings,
)
from envbuilder.doctor.libraries import (
    activation_env,
    activation_module_findings,
    library_findings,
    library_loads,
    node_library_findings,
    wheel_versions,
)
from envbuilder.doctor.replan import PythonState, python_findings, replan_findings
from envbuilder.recipe.loader import Recipe
from envbuilder.resolver.indexfacts import IndexFacts
from envbuilder.resolver.matrix import Matrix
from envbuilder.system.purge import PurgeStatus
from envbuilder.system.state import EnvRecord, Health

#: Days before the purge at which an env without a backup needs action (half the purge period where that is
#: shorter: a fresh env on a 10-day purge is not yet urgent).
PURGE_SOON_DAYS = 14


# ---------------------------------------------------------------------------------------------------------------
# Health and the purge


def safety_findings(
    record: EnvRecord, health: Health, purge: Optional[PurgeStatus], backups: Sequence[str]
) -> list[Finding]:
    """Is the env whole, how soon does the scratch purge reach it, and is there a backup to come back from."""
    name = record.name
    newest = backups[-1] if backups else None
    if health.status == "gone":
        fix = (
            f"envbuilder restore {name} (from {newest})"
            if newest
            else f"envbuilder create {name} (there is no backup)"
        )
        return [Finding(ACTION, name, "health", f"the env is gone: {health.detail}", fix)]
    findings = []
    if health.status == "damaged":
        fix = (
            f"envbuilder restore {name} --force (from {newest})"
            if newest
            else f"envbuilder create {name} --force (there is no backup)"
        )
        findings.append(Finding(ACTION, name, "health", f"the env is damaged: {health.detail}", fix))
    if purge is None or purge.days_left is None:
        return findings
    left = purge.days_left
    when = "is due now" if left < 1 else f"reaches it in {left:.0f} days"
    what = f"{purge.filesystem} purges files unread for {purge.purge_days} days: the purge {when}"
    if purge.oldest:
        what += f" (oldest read: {purge.oldest})"
    if newest:
        findings.append(
            Finding(
                INFO, name, "purge", f"{what}; backed up as {newest}", f"envbuilder restore {name} after it"
            )
        )
    elif left < min(PURGE_SOON_DAYS, purge.purge_days / 2):
        fix = f"envbuilder backup {name}"
        if purge.touch_allowed:
            fix += f" (the site also allows envbuilder touch {name})"
        findings.append(Finding(ACTION, name, "purge", f"{what}, and there is no backup", fix))
    else:
        findings.append(
            Finding(WARNING, name, "purge", f"{what}; there is no backup", f"envbuilder backup {name}")
        )
    return findings


# ---------------------------------------------------------------------------------------------------------------
# One env, the whole report


@dataclass(frozen=True)
class EnvInputs:
    """What the checks need about one env, gathered by :func:`gather`."""

    record: EnvRecord
    recipe: Optional[Recipe]
    recipe_error: Optional[EnvbuilderError]
    python: PythonState
    health: Health
    purge: Optional[PurgeStatus]
    backups: tuple[str, ...]
    lib_dirs: tuple[str, ...]
    lock: Optional[lockfile.Lock] = None
    lock_error: Optional[EnvbuilderError] = None
    #: Whether its squashfs image still holds the env: (none | ok | stale | missing, detail).
    image: tuple[str, str] = ("none", "")
    #: A container env's image file and runtime (None for other kinds, or where its image is gone).
    container: Optional[ImageState] = None


def image_findings(name: str, image: tuple[str, str]) -> list[Finding]:
    status, detail = image
    if status in ("stale", "missing"):
        return [
            Finding(
                WARNING,
                name,
                "image",
                f"its image is {status}: {detail}; --image refuses it",
                f"envbuilder pack {name}",
            )
        ]
    return [Finding(INFO, name, "image", f"its image is up to date: {detail}")] if status == "ok" else []


@dataclass(frozen=True)
class Context:
    """The node side: its facts, the shell's environment, what the index said, and today."""

    facts: HostFacts
    env: Mapping[str, str]
    today: datetime.date
    matrix: Matrix
    #: project -> the pages read for it ("torch" always; others for locks).
    indexes: Mapping[str, IndexFacts] = field(default_factory=dict)
    upstreams: tuple[str, ...] = ()
    #: Check this shell's loader settings (not with --facts: they belong to another node).
    check_shell: bool = True


def check_env(inp: EnvInputs, ctx: Context, listdir: Callable[[str], Sequence[str]]) -> list[Finding]:
    record = inp.record
    torch_index = ctx.indexes.get("torch")
    findings = safety_findings(record, inp.health, inp.purge, inp.backups)
    findings += image_findings(record.name, inp.image)
    findings += replan_findings(
        record, inp.recipe, inp.recipe_error, ctx.facts, ctx.env, index=torch_index, matrix=ctx.matrix
    )
    if inp.container is not None:
        findings += container_findings(record.name, inp.container)
    elif inp.health.status != "gone" and not kinds.kind_info(record.kind).container:
        findings += python_findings(record, inp.python)
        if ctx.check_shell:
            shell = activation_env(record, ctx.env)
            loads = library_loads(shell, inp.lib_dirs, listdir)
            findings += library_findings(record.name, loads, shell, wheel_versions(record.packages))
            findings += activation_module_findings(record)
    if not any(f.gate == "nightly-pruned" for f in findings):
        retention = int(ctx.matrix.nightly.get("retention_days") or NIGHTLY_OLD_DAYS)
        findings += nightly_findings(record, torch_index, ctx.today, bool(inp.backups), retention)
    if inp.lock_error is not None:
        findings.append(
            Finding(
                WARNING,
                record.name,
                "lock",
                f"its lock is unreadable: {inp.lock_error.message}",
                inp.lock_error.hint or "",
            )
        )
    elif inp.lock is not None:
        arch = ((record.plan or {}).get("target") or {}).get("arch") or ctx.facts.arch
        findings += lock_findings(record.name, inp.lock, arch, ctx.indexes)
    return findings


@dataclass(frozen=True)
class Report:
    facts: HostFacts
    facts_from: str
    envs: tuple[str, ...]
    findings: tuple[Finding, ...]
    matrix_as_of: str
    check_shell: bool

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}

    @property
    def needs_action(self) -> bool:
        return any(f.severity == ACTION for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "facts_from": self.facts_from,
            "facts": self.facts.to_json(),
            "envs": list(self.envs),
            "table_as_of": self.matrix_as_of,
            "shell_checked": self.check_shell,
            "counts": self.counts,
            "findings": [f.to_json() for f in self.findings],
        }


def examine(
    inputs: Sequence[EnvInputs],
    ctx: Context,
    listdir: Callable[[str], Sequence[str]],
    facts_from: str,
    extra: Sequence[Finding] = (),
) -> Report:
    """Every check, for the node and each env."""
    findings: list[Finding] = list(extra)
    if ctx.check_shell:
        findings += node_library_findings(ctx.env)
    findings += table_findings(ctx.matrix, ctx.today, ctx.indexes.get("torch"), ctx.upstreams)
    findings += table_row_findings(ctx.matrix, ctx.today)
    for inp in inputs:
        findings += check_env(inp, ctx, listdir)
    return Report(
        facts=ctx.facts,
        facts_from=facts_from,
        envs=tuple(i.record.name for i in inputs),
        findings=tuple(ordered(findings)),
        matrix_as_of=ctx.matrix.as_of,
        check_shell=ctx.check_shell,
    )
