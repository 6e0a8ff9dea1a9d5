"""``create``: apply a Plan. Build beside the prefix, rename into place when complete, record the env.

Order: take the env's mutex → recover what an interrupted run left → load the modules (delta recorded) → create the
env in ``.NAME.partial-PID`` beside the prefix → install the resolver's pins, then the recipe's packages → check the
installed torch build against the plan (torchbuild) → write the activate extension → inventory → write the record
inside the env, and a *pending* marker beside it → rename into place (``--force``: the old env is moved aside first
and removed only after the new one is in place) → write the record → (a move: remove the name's env at its old
prefix) → remove the marker → start removing the old env (``--force``: in the background when the caller passes
``later``, joined before its command ends) → the smoke check (import torch, write its bytecode), unless the caller
validates next (``validate_after``): the validation's ranks import torch and write the bytecode then, and where it
cannot run here the caller runs the smoke check (``smoke_recorded``). ``transaction`` does the partial, the swap,
the marker and the recovery. Any failure or interrupt removes the partial directory; the mutex is released by its
context manager, and a SIGKILLed run's mutex is stale and broken by the next run. A run killed after the rename
leaves a complete env with its marker: the next run for that name and prefix (create or restore) recognises it and
finishes the record (``heal``), so a batch job that hit its time limit there succeeds when resubmitted.

One env per name, one name per env: an env recorded under another name is never replaced, and a name that has an
env elsewhere is moved only with ``--force`` (``transaction.claim``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from packaging.utils import canonicalize_name

from envbuilder import __version__, lockfile, payloads
from envbuilder.backends import activation, base, container, installers, lookup, managedpython, torchbuild
from envbuilder.backends.buildlog import BuildLog, open_log, world_write_swept
from envbuilder.backends.smoke import activated_env, smoke
from envbuilder.core import kinds, settings
from envbuilder.core.errors import BackendError, LockError, StateError, UsageError
from envbuilder.core.structs import dataclass
from envbuilder.plan import Plan, lockfit
from envbuilder.plan.activation import Activation, build_loads
from envbuilder.plan.steps import CLONE, CONSTRAINTS, LOCK_REQUIREMENTS, InstallStep
from envbuilder.recipe import edits
from envbuilder.recipe.loader import Recipe
from envbuilder.system import fsutil, proc, purge, removal, state, strictmodes, transaction
from envbuilder.system.modules import EnvDelta, ModuleSystem


@dataclass(frozen=True)
class CreateOptions:
    force: bool = False
    #: Record the env under this name instead of the recipe's (a second env from one recipe).
    name: Optional[str] = None
    smoke_check: bool = True
    #: The caller validates the env next (where this host can): its ranks import torch, so the smoke check does
    #: not run here; the result says so (``CreateResult.smoke_deferred``) and the caller runs it where the
    #: validation cannot run after all.
    validate_after: bool = False
    #: Where an env that ``--force`` replaces is removed, after the swap, while the caller goes on (None: before
    #: create returns).
    later: Optional[transaction.Later] = None
    #: Seconds to wait for another envbuilder that holds the env's mutex (the CLI's --wait).
    wait: float = 0.0
    #: Installer named on the command line (recorded as the reason for the choice).
    installer_source: str = "recipe"


@dataclass
class Reporter:
    """How create talks while it works (the CLI passes rich-backed callables; tests may pass nothing)."""

    step: Callable[[str], None] = lambda text: None
    note: Callable[[str], None] = lambda text: None
    wait: Callable[[str], None] = lambda text: None
    #: Bytes the running step has downloaded and unpacked so far.
    moving: Callable[[int], None] = lambda done: None
    #: What the running step's installer announced it downloads (progress.Downloads.summary).
    downloads: Callable[[str], None] = lambda summary: None


@dataclass
class CreateResult:
    status: str  # created | replaced | moved (--force to another prefix) | exists
    record: state.EnvRecord
    log: Optional[str]
    notes: list[str] = field(default_factory=list)
    #: The smoke check was left to the validation that follows (``CreateOptions.validate_after``).
    smoke_deferred: bool = False
    #: An env that exists: its recipe now against the one it was built from.
    recipe_edit: Optional[edits.Edit] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "log": self.log,
            "notes": self.notes,
            "env": self.record.to_json(),
            "recipe_edit": self.recipe_edit.to_json() if self.recipe_edit else None,
        }


def create(
    plan: Plan,
    recipe: Recipe,
    env: Mapping[str, str],
    modules: ModuleSystem,
    opts: Optional[CreateOptions] = None,
    *,
    report: Optional[Reporter] = None,
    facts: Optional[Mapping[str, Any]] = None,
) -> CreateResult:
    opts = opts or CreateOptions()
    report = report or Reporter()
    if plan.prefix_missing:
        raise UsageError(
            f"the env prefix {plan.prefix!r} needs {', '.join('$' + v for v in plan.prefix_missing)}, "
            "which is unset here",
            hint="set it, or pass --prefix DIR",
        )
    # Resolved: uv's relocatable activate finds the env through realpath, so the record must say the same.
    final = Path(plan.prefix).expanduser().resolve()
    home = settings.home(env)
    name = opts.name or plan.recipe
    # Before anything is made, read or removed there (a partial left beside it, the env itself).
    strictmodes.env_prefix(final)

    def waiting(owner: fsutil.Owner) -> None:
        report.wait(f"another envbuilder (pid {owner.pid} on {owner.host}) is working on {name}; waiting")

    with state.mutex(home, name, timeout=opts.wait, on_wait=waiting):
        notes = transaction.recover(final)
        healed, more = transaction.heal(home, name, final)
        notes += more
        for n in notes:
            report.note(n)
        if healed is not None and healed.command == "create":
            # The run that built it was killed after its rename: this rerun is that run, finished.
            return _healed(healed, _Job(plan, recipe, env, modules, opts, report, facts or {}), home, notes)
        moving = transaction.claim(home, name, final, opts.force)
        existing = _existing(home, name, final)
        if existing is not None and not opts.force:
            edit = edits.compare(existing.recipe_digest, existing.recipe_values, recipe)
            left = f"{final} exists; left alone (--force rebuilds)"
            return CreateResult("exists", existing, None, [*notes, left], recipe_edit=edit)
        if final.exists() and not removal.is_env(final):
            raise StateError(
                f"{final} exists and is not an environment; refusing to touch it",
                hint="choose another --prefix",
            )
        if final.exists() and not opts.force:
            raise StateError(
                f"{final} already holds an environment that envbuilder has no record of",
                hint="pass --force to replace it, or choose another --prefix",
            )
        status = "moved" if moving else "replaced" if final.exists() else "created"
        log = open_log(home, name)
        try:
            where = _Where(name, final, home, status, moving)
            job = _Job(plan, recipe, env, modules, opts, report, facts or {})
            record = _build(job, where, log, notes)
        finally:
            log.close()
        deferred = (
            opts.smoke_check and opts.validate_after and (_wants_smoke(plan) or plan.container is not None)
        )
        return CreateResult(status, record, str(log.path), notes, smoke_deferred=deferred)


@dataclass(frozen=True)
class _Where:
    """Where the env goes: under which name, at which prefix, recorded in which home, as what."""

    name: str
    final: Path
    home: Path
    status: str
    moving: Optional[Path]


def _wants_smoke(plan: Plan) -> bool:
    """torch comes from the resolver, or (overlays) from the site python underneath: check it either way."""
    return plan.resolution is not None or plan.system_site_packages or _cloning(plan)


def _healed(pending: transaction.Pending, job: _Job, home: Path, notes: list[str]) -> CreateResult:
    """The result of a create finished by heal(): the smoke check it never reached runs now."""
    record = pending.record
    if not (job.opts.smoke_check and record.validation is None and _wants_smoke(job.plan)):
        return CreateResult(pending.status, record, None, notes)
    if job.opts.validate_after:
        return CreateResult(pending.status, record, None, notes, smoke_deferred=True)
    log = open_log(home, record.name)
    try:
        job.report.step("checking that torch imports")
        gpus = len(job.facts.get("gpus") or [])
        record = smoke_recorded(record, job.modules, job.env, home, log=log, gpus=gpus)
    finally:
        log.close()
    return CreateResult(pending.status, record, str(log.path), notes)


def smoke_recorded(
    record: state.EnvRecord,
    modules: ModuleSystem,
    env: Mapping[str, str],
    home: Path,
    *,
    log: BuildLog,
    gpus: int,
) -> state.EnvRecord:
    """smoke() for a recorded env, with the modules and activate values its plan recorded."""
    plan = record.plan or {}
    base_env = proc.scrubbed_env(env)
    delta = modules.apply(
        plan.get("module_use", []),
        build_loads(plan.get("modules", []), plan.get("build_modules", [])),
        base_env,
    )
    act = activation.from_plan(
        Activation.of_record(record.plan) or Activation(), modules.init_dir, record.recipe
    )
    site_python = None if kinds.kind_info(record.kind).own_python else record.tools.get("python_path")
    run_env = activated_env(base_env, delta, act)
    return smoke(record, Path(record.prefix), run_env, site_python=site_python, log=log, home=home, gpus=gpus)


def _existing(home: Path, name: str, final: Path) -> Optional[state.EnvRecord]:
    try:
        record = state.load(home, name)
    except StateError:
        return None
    if Path(record.prefix) == final and final.exists():
        return record
    return None


@dataclass(frozen=True)
class _Job:
    """What one create builds, and with what: handed to each stage of the build."""

    plan: Plan
    recipe: Recipe
    env: Mapping[str, str]
    modules: ModuleSystem
    opts: CreateOptions
    report: Reporter
    facts: Mapping[str, Any]


def _build(job: _Job, where: _Where, log: BuildLog, notes: list[str]) -> state.EnvRecord:
    """The stages of a build: prepare, install, guard, activate, record beside the prefix; swap in; smoke."""
    final = where.final
    log.write(f"envbuilder {__version__} create {job.plan.recipe} -> {final}")
    backend = _backend(job.plan)
    tx = transaction.Transaction(final, later=job.opts.later)
    build, delta = _prepare(job, backend, tx, log, notes)
    with tx:
        _install(job, backend, build)
        _guard(job, backend, build)
        act = _activate(job, backend, build)
        record = _record(job, backend, build, where, delta)
        done = transaction.Pending(
            "create", where.status, record, str(where.moving) if where.moving else None
        )
        job.report.step(f"moving the env into place at {final}")
        tx.swap(done.to_json())
    for note in tx.finish(job.env, lambda: done.complete(where.home, final)):
        log.write(note)
        notes.append(note)
        job.report.note(note)
    log.write(f"done: {final}")
    return _smoke(job, backend, build, record, act=act, delta=delta, home=where.home)


def _cloning(plan: Plan) -> bool:
    return any(step.argv[0] == CLONE for step in plan.install_steps)


def _backend(plan: Plan) -> base.Backend:
    backend = lookup.backend(plan.kind, "clone" if _cloning(plan) else "venv")
    made = backend(plan.system_site_packages, plan.target.arch or "", plan.lock_conda)
    if isinstance(made, container.ContainerBackend):
        made.box = plan.container
    return made


def _installer(plan: Plan, final: Path, source: str, log: BuildLog) -> installers.Choice:
    if kinds.kind_info(plan.kind).container:  # nothing is installed into an image: no installer need run here
        return installers.Choice(installers.INSTALLERS["pip"], (), "none: a container env installs nothing")
    choice = installers.choose(plan.installer, str(final), source)
    if choice.name != plan.installer:
        raise BackendError(
            f"the plan uses {plan.installer}, which cannot run here ({choice.reason})",
            hint=f"pass --installer {choice.name}",
        )
    log.write(f"installer: {choice.reason}")
    return choice


def _prepare(
    job: _Job, backend: base.Backend, tx: transaction.Transaction, log: BuildLog, notes: list[str]
) -> tuple[base.Build, EnvDelta]:
    """Choose the installer, load the modules, find the python: the Build the backend works in."""
    plan, final, partial = job.plan, tx.final, tx.partial
    choice = _installer(plan, final, job.opts.installer_source, log)
    job.report.step(
        f"loading modules ({job.modules.kind})" if plan.modules or plan.module_use else "no modules to load"
    )
    base_env = proc.scrubbed_env(job.env)
    delta = job.modules.apply(plan.module_use, build_loads(plan.modules, plan.build_modules), base_env)
    build_env = delta.apply(base_env)
    log.write(f"module delta: {len(delta.set)} set, {len(delta.unset)} unset")
    python = managedpython.interpreter(plan.python, job.env, log, job.report.step) or backend.python(
        plan.python["command"] or "python3", build_env, final
    )
    # Envs that see the base python's packages: is it a venv itself (whose packages a venv on top would not see)?
    parent = base.python_info(python, build_env, log) if backend.needs_parent() else {}
    log.write(f"python: {python}")
    # Before the installer's settings: uv's compare the prefix's file system with the cache's.
    fsutil.mkdirs(final.parent)
    strictmodes.env_prefix(final)  # again: what mkdirs found made by someone else in the meantime
    # The installer's and the backend's own settings, laid over whatever environment the modules give each step.
    tool_env, reasons = choice.installer.settings(final, job.env)
    for reason in reasons:
        log.write(reason)
    notes.extend(reasons)
    tool_env.update(backend.own_env(partial, job.env))
    tool_env.update(
        installers.bytecode_env(
            choice.installer,
            plan.kind,
            plan.system_site_packages,
            job.env,
            log.write,
            imports_next=job.opts.validate_after or (job.opts.smoke_check and _wants_smoke(plan)),
        )
    )
    build_env.update(tool_env)
    build = base.Build(
        plan.prefix,
        final,
        partial,
        choice.installer,
        choice.program,
        python,
        base_env,
        build_env,
        tool_env,
        log,
        say=job.report.step,
        moving=job.report.moving,
        downloads=job.report.downloads,
        notes=notes,
        parent=parent,
    )
    return build, delta


def _install(job: _Job, backend: base.Backend, build: base.Build) -> None:
    """Make the env (the plan's first step, where it does), write the pins, run the other steps."""
    steps = job.plan.install_steps
    first = steps[0] if steps and steps[0].creates_env else None
    backend.create(build, first, _step_env(job, build, first))
    _write_pins(job.plan, build.partial)
    for step in steps[1 if first else 0 :]:
        backend.install(build, step, _step_env(job, build, step))
    # An overlay env's installer counts the site python's packages as installed (pip --user skips them).
    if job.plan.locked is not None and kinds.kind_info(job.plan.kind).own_python:
        _check_locked(job.plan.locked, build)


def _check_locked(locked: lockfile.PlatformLock, build: base.Build) -> None:
    """--locked never installs less than the lock: every locked wheel for this target is in the env, at its
    version (an installer that skipped one, by a marker or as already satisfied, exits 0)."""
    installed: dict[str, str] = {}
    for info in build.partial.glob("lib*/python*/site-packages/*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        installed[canonicalize_name(name)] = version
    lacking = lockfit.missing(locked, installed)
    if lacking:
        raise LockError(
            f"the installer left out {len(lacking)} locked package(s): {', '.join(lacking)}; the env was not put "
            "in place",
            hint="the build log says why; pip counts a package the base python already has "
            "(env.system_site_packages) as installed",
        )
    build.log.write(f"installed packages match the lock ({len(locked.wheels)})")


def _step_env(job: _Job, build: base.Build, step: Optional[InstallStep]) -> Mapping[str, str]:
    """The build's environment, or for a step with modules of its own, those loaded (and the tools' settings)."""
    if step is None or not step.modules:
        return build.env
    plan = job.plan
    extra = job.modules.apply(plan.module_use, [*plan.modules, *step.modules], build.base_env)
    return {**extra.apply(build.base_env), **build.tool_env}


def _write_pins(plan: Plan, partial: Path) -> None:
    """Inside the env before anything is installed: torch's pins (or a lock's), which later installs keep, and the
    lock's hashed requirements."""
    (partial / "envbuilder").mkdir(exist_ok=True)
    if plan.lock_requirements:
        (partial / LOCK_REQUIREMENTS).write_text(plan.lock_requirements, encoding="utf-8")
        (partial / CONSTRAINTS).write_text(plan.lock_pins, encoding="utf-8")
    elif plan.resolution is not None:
        pins = "".join(f"{r}\n" for r in plan.resolution.requirements)
        (partial / CONSTRAINTS).write_text(pins, encoding="utf-8")


def _guard(job: _Job, backend: base.Backend, build: base.Build) -> None:
    """The torch build guard (issue 16): the planned torch build, or nothing is put in place."""
    plan = job.plan
    if plan.resolution is None:
        return
    job.report.step("checking the installed torch build against the plan")
    torchbuild.guard(
        plan,
        build.partial,
        python=backend.site_python(build),
        env=build.env,
        log=build.log.write,
        home=settings.home(job.env),
    )


def _activate(job: _Job, backend: base.Backend, build: base.Build) -> Activation:
    act = activation.from_plan(job.plan.activate, job.modules.init_dir, job.plan.recipe)
    # A container env has no activate extension: `envbuilder activate` prints the function that enters it.
    if not kinds.kind_info(job.plan.kind).container:
        job.report.step("writing the activate extension")
    backend.activate(build, act)
    payloads.into_env(Path(build.partial))
    return act


def _record(
    job: _Job, backend: base.Backend, build: base.Build, where: _Where, delta: EnvDelta
) -> state.EnvRecord:
    """What was built, written inside the env (the home's copy follows the swap)."""
    job.report.step("recording installed packages")
    backend.move_in(build)
    # The tools' last writes are done: one walk of the env (find, on another core) runs while the record is put
    # together (its reads of the dist-info files, the installer's version). It clears world write and measures
    # the env, once, so that list, show and doctor never walk it (envfiles).
    plan = job.plan.to_json()
    purged = purge.plan_policy(plan) is not None
    with world_write_swept(build.partial, atimes=purged) as swept:
        record = state.EnvRecord(
            name=where.name,
            recipe=job.plan.recipe,
            recipe_digest=edits.digest(job.recipe),
            recipe_values=edits.values(job.recipe),
            prefix=str(where.final),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            plan=plan,
            facts=dict(job.facts),
            packages=tuple(backend.inventory(build)),
            tools=backend.tools(build),
            modules=base.loaded_modules(job.modules.kind, delta),
        )
    files = swept.walk.files(purged)
    record = replace(record, files=files)
    fsutil.write_atomic(build.partial / "envbuilder" / "record.json", record.dumps())
    for rel in swept.fixed:
        build.log.write(f"removed world write permission from {rel}")
    return record


def _smoke(
    job: _Job,
    backend: base.Backend,
    build: base.Build,
    record: state.EnvRecord,
    *,
    act: Activation,
    delta: EnvDelta,
    home: Path,
) -> state.EnvRecord:
    if not (job.opts.smoke_check and _wants_smoke(job.plan)) or job.opts.validate_after:
        return record
    job.report.step("checking that torch imports")
    return smoke(
        record,
        build.final,
        activated_env(build.base_env, delta, act),
        site_python=backend.site_python(build),
        log=build.log,
        home=home,
        gpus=len(job.facts.get("gpus") or []),
    )
