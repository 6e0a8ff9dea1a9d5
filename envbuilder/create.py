"""``create``: apply a Plan. Build beside the prefix, rename into place when complete, record the env.

Order: lock the env → recover what an interrupted run left → load the modules (delta recorded) → create the env
in ``.NAME.partial-PID`` beside the prefix → install the resolver's pins, then the recipe's packages → check the
installed torch build against the plan (torchbuild) → write the activate extension → inventory → write the record
inside the env, and a *pending* marker beside it → rename into place (``--force``: the old env is moved aside first
and removed only after the new one is in place) → write the record → (a move: remove the name's env at its old
prefix) → remove the marker. Any failure or interrupt removes the partial directory; the lock is released by its
context manager, and a SIGKILLed run's lock is stale and broken by the next run. A run killed after the rename
leaves a complete env with its marker: the next run for that name and prefix (create or restore) recognises it
and finishes the record (``heal``), so a batch job that hit its time limit there succeeds when resubmitted.

One env per name, one name per env: an env recorded under another name is never replaced, and a name that has an
env elsewhere is moved only with ``--force`` (``claim``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder import __version__, activation, fsutil, proc, settings, state
from envbuilder.backends import common, conda, rattler_engine, torchbuild
from envbuilder.errors import BackendError, CommandFailed, EnvbuilderError, StateError, UsageError
from envbuilder.modules import EnvDelta, ModuleSystem
from envbuilder.plan import Plan
from envbuilder.plan.steps import CLONE, CONSTRAINTS, LOCK_REQUIREMENTS, InstallStep
from envbuilder.recipe.loader import Recipe

PARTIAL = ".partial-"
OLD = ".old-"
REMOVING = ".removing-"
#: Written inside the env before its rename, removed once its record is written: "this env is complete, and its
#: record may not be written yet".
PENDING = "envbuilder/pending.json"
#: Test hook, read in one place (``_pause``): ``after-rename`` stops create and restore for an hour right after
#: the env is renamed into place and before its record is written, so tests can kill them in that window.
PAUSE_VAR = "ENVBUILDER_TEST_PAUSE"


@dataclass(frozen=True)
class CreateOptions:
    force: bool = False
    #: Record the env under this name instead of the recipe's (a second env from one recipe).
    name: Optional[str] = None
    smoke_check: bool = True
    lock_timeout: float = 0.0
    #: Installer named on the command line (recorded as the reason for the choice).
    installer_source: str = "recipe"


@dataclass
class Reporter:
    """How create talks while it works (the CLI passes rich-backed callables; tests may pass nothing)."""

    step: Callable[[str], None] = lambda text: None
    note: Callable[[str], None] = lambda text: None
    wait: Callable[[str], None] = lambda text: None


@dataclass
class CreateResult:
    status: str  # created | replaced | moved (--force to another prefix) | exists
    record: state.EnvRecord
    log: Optional[str]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "log": self.log, "notes": self.notes, "env": self.record.to_json()}


def recipe_digest(recipe: Recipe) -> str:
    return hashlib.sha256(json.dumps(recipe.data, sort_keys=True, default=str).encode()).hexdigest()


def _siblings(final: Path, marker: str) -> list[Path]:
    if not final.parent.is_dir():
        return []
    return sorted(final.parent.glob(f".{final.name}{marker}*"))


def recover(final: Path) -> list[str]:
    """Undo what an interrupted create left (call with the env's lock held): partial builds are removed; an
    old env moved aside by ``--force`` comes back if the new one never arrived, and is removed if it did."""
    notes = []
    for partial in _siblings(final, PARTIAL):
        shutil.rmtree(partial, ignore_errors=True)
        notes.append(f"removed {partial.name}, left by an interrupted create")
    for doomed in _siblings(final, REMOVING):
        shutil.rmtree(doomed, ignore_errors=True)
        notes.append(f"removed {doomed.name}, which an interrupted envbuilder was deleting")
    for old in _siblings(final, OLD):
        if not final.exists():
            old.rename(final)
            notes.append(f"restored the previous env from {old.name} (an interrupted --force left it aside)")
        else:
            shutil.rmtree(old, ignore_errors=True)
            notes.append(f"removed {old.name}, the env a finished --force replaced")
    return notes


def _is_env(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file() or (path / "envbuilder" / "record.json").is_file()


# ---------------------------------------------------------------------------------------------------------------
# The window between the rename and the record


@dataclass(frozen=True)
class Pending:
    """What an envbuilder that renames an env into place still has to do once it is there: write ``record`` and,
    for a move, remove the name's env at ``replaces``. Written inside the env before the rename."""

    command: str  # create | restore
    status: str  # the result's status: created | replaced | moved | restored
    record: state.EnvRecord
    replaces: Optional[str] = None
    backup: Optional[str] = None  # restore: the backup's id

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "command": self.command,
            "status": self.status,
            "replaces": self.replaces,
            "backup": self.backup,
            "record": self.record.to_json(),
        }


def write_pending(partial: Path, pending: Pending) -> None:
    fsutil.write_atomic(partial / PENDING, (json.dumps(pending.to_json(), indent=1) + "\n").encode())


def _read_pending(final: Path) -> Optional[Pending]:
    path = final / PENDING
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fields = {k: v for k, v in data["record"].items() if k in state.EnvRecord.__dataclass_fields__}
        fields["packages"] = tuple(fields.get("packages", ()))
        record = state.EnvRecord(**fields)
        return Pending(
            str(data["command"]),
            str(data["status"]),
            record,
            data.get("replaces"),
            data.get("backup"),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(
            f"{path} is unreadable ({exc}): an interrupted envbuilder left {final} without a record",
            hint=f"remove {final} (or pass --force to build it again)",
        ) from None


def _pause(env: Mapping[str, str], point: str) -> None:
    """The test hook (PAUSE_VAR): the only place it is read."""
    if env.get(PAUSE_VAR) == point:
        print(f"{PAUSE_VAR}: paused {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(3600)


def finish(home: Path, env: Mapping[str, str], final: Path, pending: Pending) -> list[str]:
    """After the rename (lock held): write the record, remove a moved env's old copy, then the marker."""
    _pause(env, "after-rename")
    return _complete(home, final, pending)


def _complete(home: Path, final: Path, pending: Pending) -> list[str]:
    state.save(home, pending.record)
    notes = []
    if pending.replaces:
        notes += _remove_moved(home, pending.record.name, Path(pending.replaces), final)
    with contextlib.suppress(FileNotFoundError):
        (final / PENDING).unlink()
    with contextlib.suppress(OSError):  # made for the marker alone (an archive of an env without one)
        (final / PENDING).parent.rmdir()
    return notes


def heal(home: Path, name: str, final: Path) -> tuple[Optional[Pending], list[str]]:
    """Finish what a run killed between the rename and the record left at ``final`` (call with the lock of
    ``name`` held): the env is complete, so its record is written now. The Pending it finished, if any."""
    pending = _read_pending(final)
    if pending is None:
        return None, []
    rec = pending.record
    if rec.name != name:
        raise StateError(
            f"{final} is the env {rec.name!r}, which an interrupted envbuilder put in place without recording it",
            hint=f"run the command that built {rec.name} again: it finishes the record",
        )
    if Path(rec.prefix) != final:
        raise StateError(
            f"{final} holds an env built for {rec.prefix} (moved since?) that an interrupted envbuilder never "
            "recorded",
            hint=f"move it back to {rec.prefix}, or remove it",
        )
    notes = [
        f"finished the record of {name} at {final}: an interrupted {pending.command} had put it in place"
    ]
    return pending, notes + _complete(home, final, pending)


# ---------------------------------------------------------------------------------------------------------------
# One env per name


def claim(home: Path, name: str, final: Path, force: bool) -> Optional[Path]:
    """Check that ``name`` may have its env at ``final`` (lock of ``name`` held): never where another name's env
    is recorded, and not beside the name's own env elsewhere unless ``force`` (a move). The prefix whose env a
    move removes once the new one is in place and recorded, if any."""
    for other in state.names(home):
        if other == name:
            continue
        try:
            rec = state.load(home, other)
        except StateError:
            continue
        if Path(rec.prefix) == final:
            gone = "" if final.exists() else " (gone now)"
            raise StateError(
                f"{final} is where the env {other!r} is recorded{gone}; {name} cannot take its place",
                hint=f"choose another --prefix, or `envbuilder remove {other}` first",
            )
    try:
        mine = state.load(home, name)
    except StateError:
        return None
    old = Path(mine.prefix)
    if old == final or not old.exists():
        return None
    if not force:
        raise StateError(
            f"{name} already has an env at {old}; another at {final} would leave that one without a record",
            hint=f"--name OTHER makes a second env from the recipe; --force moves {name} to {final} (the env at "
            f"{old} is removed once the new one is in place); or `envbuilder remove {name}` first",
        )
    return old


def _remove_moved(home: Path, name: str, old: Path, new: Path) -> list[str]:
    """Remove the env a move left at ``old``, unless it is no longer that env."""
    if old == new or not old.exists():
        return []
    if not _is_env(old):
        return [f"left {old} alone: it is no longer an environment"]
    for other in state.names(home):
        with contextlib.suppress(StateError):
            if other != name and Path(state.load(home, other).prefix) == old:
                return [f"left {old} alone: it is the env {other} now"]
    # Out of the way in one rename, then deleted: never half an env under its own name.
    doomed = old.parent / f".{old.name}{REMOVING}{os.getpid()}"
    old.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    return [f"moved {name} from {old} to {new}; removed the env at {old}"]


def create(
    plan: Plan,
    recipe: Recipe,
    env: Mapping[str, str],
    modules: ModuleSystem,
    opts: Optional[CreateOptions] = None,
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

    def waiting(owner: fsutil.Owner) -> None:
        report.wait(f"another envbuilder (pid {owner.pid} on {owner.host}) is working on {name}; waiting")

    with state.locked(home, name, timeout=opts.lock_timeout, on_wait=waiting):
        notes = recover(final)
        healed, more = heal(home, name, final)
        notes += more
        for n in notes:
            report.note(n)
        if healed is not None and healed.command == "create":
            # The run that built it was killed after its rename: this rerun is that run, finished.
            return _healed(healed, plan, env, modules, opts, report, home, notes, facts or {})
        moving = claim(home, name, final, opts.force)
        existing = _existing(home, name, final)
        if existing is not None and not opts.force:
            return CreateResult(
                "exists", existing, None, [*notes, f"{final} exists; left alone (--force rebuilds)"]
            )
        if final.exists() and not _is_env(final):
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
            record = _build(plan, recipe, env, modules, opts, report, where, log, notes, facts or {})
        finally:
            log.close()
        return CreateResult(status, record, str(log.path), notes)


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
    cloning = any(step.argv[0] == CLONE for step in plan.install_steps)
    return plan.resolution is not None or plan.system_site_packages or cloning


def _healed(
    pending: Pending,
    plan: Plan,
    env: Mapping[str, str],
    modules: ModuleSystem,
    opts: CreateOptions,
    report: Reporter,
    home: Path,
    notes: list[str],
    facts: Mapping[str, Any],
) -> CreateResult:
    """The result of a create finished by heal(): the smoke check it never reached runs now."""
    record = pending.record
    if not (opts.smoke_check and record.validation is None and _wants_smoke(plan)):
        return CreateResult(pending.status, record, None, notes)
    log = open_log(home, record.name)
    try:
        report.step("checking that torch imports")
        record = smoke_recorded(record, modules, env, home, log, len(facts.get("gpus") or []))
    finally:
        log.close()
    return CreateResult(pending.status, record, str(log.path), notes)


def smoke_recorded(
    record: state.EnvRecord,
    modules: ModuleSystem,
    env: Mapping[str, str],
    home: Path,
    log: common.BuildLog,
    gpus: int,
) -> state.EnvRecord:
    """smoke() for a recorded env, with the modules and activate values its plan recorded."""
    plan = record.plan or {}
    base_env = proc.scrubbed_env(env)
    delta = modules.apply(
        plan.get("module_use", []), [*plan.get("modules", []), *plan.get("build_modules", [])], base_env
    )
    act = activation.from_plan(
        plan.get("activate") or {}, str(Path(modules.init).parent) if modules.init else None, record.recipe
    )
    site_python = record.tools.get("python_path") if plan.get("kind") == "user-prefix" else None
    return smoke(record, Path(record.prefix), site_python, act, delta, base_env, log, home, gpus)


def _existing(home: Path, name: str, final: Path) -> Optional[state.EnvRecord]:
    try:
        record = state.load(home, name)
    except StateError:
        return None
    if Path(record.prefix) == final and final.exists():
        return record
    return None


def open_log(home: Path, name: str) -> common.BuildLog:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return common.BuildLog(home / "logs" / f"{name}-{stamp}-{os.getpid()}.log")


def _build(
    plan: Plan,
    recipe: Recipe,
    env: Mapping[str, str],
    modules: ModuleSystem,
    opts: CreateOptions,
    report: Reporter,
    where: _Where,
    log: common.BuildLog,
    notes: list[str],
    facts: Mapping[str, Any],
) -> state.EnvRecord:
    final, home = where.final, where.home
    base_env = proc.scrubbed_env(env)
    log.write(f"envbuilder {__version__} create {plan.recipe} -> {final}")
    choice = common.choose_installer(plan.installer, str(final), opts.installer_source)
    if choice.name != plan.installer:
        raise BackendError(
            f"the plan uses {plan.installer}, which cannot run here ({choice.reason})",
            hint=f"pass --installer {choice.name}",
        )
    log.write(f"installer: {choice.reason}")

    report.step(
        f"loading modules ({modules.kind})" if plan.modules or plan.module_use else "no modules to load"
    )
    delta = modules.apply(plan.module_use, [*plan.modules, *plan.build_modules], base_env)
    build_env = delta.apply(base_env)
    log.write(f"module delta: {len(delta.set)} set, {len(delta.unset)} unset")
    if plan.kind == "conda":
        # The env brings its own python (the recipe's python=X.Y); the site's is not used.
        python = str(final / "bin" / "python")
    else:
        python = common.find_python(plan.python["command"] or "python3", build_env)
    parent: dict[str, Any] = {}
    cloning = any(step.argv[0] == CLONE for step in plan.install_steps)
    if plan.system_site_packages or plan.kind == "user-prefix" or cloning:
        # Only these envs see the base python's packages: is it a venv itself (whose packages a venv on top
        # would not see)?
        parent = common.python_info(python, build_env, log)
    log.write(f"python: {python}")

    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f".{final.name}{PARTIAL}{os.getpid()}"
    # The installer's own settings, laid over whatever environment the modules give each step.
    tool_env: dict[str, str] = {}
    uv_bin = common.uv_binary() if plan.installer == "uv" else None
    if uv_bin:
        uv = common.uv_settings(final, env)
        tool_env.update(uv.env())
        for reason in uv.reasons:
            log.write(reason)
        notes.extend(uv.reasons)
    if plan.installer in {"pip", "virtualenv"}:
        # The recipe, not a stray pip.conf, decides where packages come from.
        tool_env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if plan.kind == "user-prefix":
        tool_env["PYTHONUSERBASE"] = str(partial)
    if plan.kind == "conda":
        tool_env[rattler_engine.CACHE_VAR] = conda_cache(env)
    build_env.update(tool_env)
    engine = ""

    with common.removing_on_failure(partial):
        if plan.kind == "user-prefix":
            partial.mkdir(mode=0o755)
            _after_create(plan, partial, parent, log)
        for step in plan.install_steps:
            if step.argv[0] == CLONE:
                report.step(f"cloning the site env {parent['prefix']}")
                kept = conda.clone(Path(parent["prefix"]), partial, final)
                log.write(f"cloned {parent['prefix']}: {len(kept.rewritten)} file(s) repointed")
                if kept.left:
                    note = f"{len(kept.left)} file(s) of the clone still name the site env (binaries); they read it"
                    log.write(note + ": " + ", ".join(kept.left[:20]))
                    notes.append(note)
                _after_create(plan, partial, {}, log)
                continue
            argv = common.step_argv(step, python, uv_bin, plan.prefix, str(partial))
            step_env = build_env
            if step.modules:
                extra = modules.apply(plan.module_use, [*plan.modules, *step.modules], base_env)
                step_env = {**extra.apply(base_env), **tool_env}
            step_env, own = common.step_env(step, step_env)
            if step.engine:
                argv, engine = conda.engine_argv(argv, step.engine, step_env, plan.target.arch or "", final)
                step_env = conda.engine_env(engine, step_env)
                log.write(f"conda engine: {engine}")
            report.step(_describe(step) + (f" with {engine}" if step.engine else ""))
            try:
                common.run_logged(argv, step_env, log, own)
            except CommandFailed as exc:
                if not step.engine:
                    raise
                detail = exc.stderr_tail.rstrip() or f"(no message; {proc.describe_status(exc.returncode)})"
                raise BackendError(
                    f"{engine} could not create the conda env:\n{detail}",
                    hint="check conda.channels and conda.packages (envbuilder plan NAME shows the command)",
                ) from None
            if step.creates_env:
                if plan.lock_conda:
                    conda.check_locked(partial, plan.lock_conda, engine)
                    log.write(f"conda packages match the lock ({len(plan.lock_conda)})")
                _after_create(plan, partial, parent, log)
        # --- torch build guard (issue 16): the planned torch build, or nothing is put in place
        if plan.resolution is not None:
            report.step("checking the installed torch build against the plan")
            torchbuild.guard(
                plan.resolution,
                plan.target,
                plan.install_steps,
                partial,
                recipe=plan.recipe,
                python=python if plan.kind == "user-prefix" else None,
                env=build_env,
                log=log.write,
            )
        # --- end of the torch build guard
        act = activation.from_plan(
            plan.activate, str(Path(modules.init).parent) if modules.init else None, plan.recipe
        )
        report.step("writing the activate extension")
        if plan.kind == "user-prefix":
            activation.install_user_prefix(partial, str(final), act)
        elif plan.kind == "conda" or (cloning and (partial / "conda-meta").is_dir()):
            activation.install_conda(partial, str(final), act)
        else:
            activation.install(partial, act)
        report.step("recording installed packages")
        packages = common.inventory(partial)
        if plan.kind == "conda" or cloning:
            changed = conda.move_in(partial, final, engine or "clone")
            log.write(f"relocated {len(changed)} file(s) from {partial} to {final}")
        elif plan.installer != "uv" and plan.kind != "user-prefix":
            changed = common.relocate_scripts(partial, final)
            log.write(f"relocated {len(changed)} file(s) from {partial} to {final}")
        record = state.EnvRecord(
            name=where.name,
            recipe=plan.recipe,
            recipe_digest=recipe_digest(recipe),
            prefix=str(final),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            plan=plan.to_json(),
            facts=dict(facts),
            packages=tuple(packages),
            tools=tools_used(choice.name, python_version(partial, parent), python, uv_bin, log, build_env),
            modules={
                "system": modules.kind,
                "delta_set": dict(sorted(delta.set.items())),
                "delta_unset": list(delta.unset),
            },
        )
        fsutil.write_atomic(partial / "envbuilder" / "record.json", dump_record(record))
        done = Pending("create", where.status, record, str(where.moving) if where.moving else None)
        write_pending(partial, done)
        # Children ran under a umask without world write; this catches what a tool chmods itself (uv's .lock).
        for rel in common.drop_world_write(partial):
            log.write(f"removed world write permission from {rel}")
        report.step(f"moving the env into place at {final}")
        swap(partial, final)
    for note in finish(home, env, final, done):
        log.write(note)
        notes.append(note)
        report.note(note)
    log.write(f"done: {final}")
    if opts.smoke_check and _wants_smoke(plan):
        report.step("checking that torch imports")
        site_python = python if plan.kind == "user-prefix" else None
        gpus = len(facts.get("gpus") or [])
        record = smoke(record, final, site_python, act, delta, base_env, log, home, gpus)
    return record


def conda_cache(env: Mapping[str, str]) -> str:
    """Where conda packages are cached: beside the envs on $SCRATCH (hardlinks, no $HOME quota), else ~/.cache."""
    if env.get(rattler_engine.CACHE_VAR):
        return env[rattler_engine.CACHE_VAR]
    if env.get("SCRATCH"):
        return str(Path(env["SCRATCH"]) / "envbuilder" / "conda-pkgs")
    return str(Path(env.get("HOME") or Path.home()) / ".cache" / "envbuilder" / "conda-pkgs")


def _describe(step: InstallStep) -> str:
    return "creating the env" if step.creates_env else f"installing {step.label or 'packages'}"


def _after_create(plan: Plan, partial: Path, parent: Mapping[str, Any], log: common.BuildLog) -> None:
    (partial / "envbuilder").mkdir(exist_ok=True)
    if plan.lock_requirements:
        (partial / LOCK_REQUIREMENTS).write_text(plan.lock_requirements, encoding="utf-8")
        (partial / CONSTRAINTS).write_text(plan.lock_pins, encoding="utf-8")
    elif plan.resolution is not None:
        pins = "".join(f"{r}\n" for r in plan.resolution.requirements)
        (partial / CONSTRAINTS).write_text(pins, encoding="utf-8")
    if parent and plan.system_site_packages:
        sites = sorted(partial.glob("lib/python*/site-packages"))
        if sites:
            pth = common.parent_site_pth(sites[0], parent)
            if pth is not None:
                log.write(f"parent python is a venv ({parent['prefix']}): {pth.name} adds its site-packages")


def python_version(partial: Path, parent: Mapping[str, Any]) -> str:
    if parent.get("version"):
        return str(parent["version"])
    for line in common.read_text(partial / "pyvenv.cfg").splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            return value.strip()
    return "?"


def swap(partial: Path, final: Path) -> None:
    """Put ``partial`` at ``final``. An existing env is moved aside first and removed once the new one is in
    place; a crash between the two renames is repaired by recover() on the next run."""
    if final.exists():
        old = final.parent / f".{final.name}{OLD}{os.getpid()}"
        final.rename(old)
        partial.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(final)


def dump_record(record: state.EnvRecord) -> bytes:
    return (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()


def tools_used(
    installer: str,
    python_version: str,
    python: str,
    uv_bin: Optional[str],
    log: common.BuildLog,
    env: Mapping[str, str],
) -> dict[str, str]:
    tools = {
        "envbuilder": __version__,
        "installer": installer,
        "python": python_version,
        "python_path": python,
    }
    tools["host_python"] = platform.python_version()
    if uv_bin:
        with contextlib.suppress(EnvbuilderError, IndexError):
            tools["uv"] = common.run_logged([uv_bin, "--version"], env, log).stdout.split()[1]
    return tools


def smoke(
    record: state.EnvRecord,
    final: Path,
    site_python: Optional[str],
    act: activation.Activation,
    delta: EnvDelta,
    base_env: Mapping[str, str],
    log: common.BuildLog,
    home: Path,
    gpus: int,
) -> state.EnvRecord:
    """A quick check in the new env (import torch, GPUs visible, arch list) before the full validation."""
    run_env = {**delta.apply(base_env), **dict(act.env)}
    for var in act.unset:
        run_env.pop(var, None)
    python = str(final / "bin" / "python")
    if site_python:  # user-prefix: the site python, with the env as its user base
        python = site_python
        run_env["PYTHONUSERBASE"] = str(final)
    argv = [python, str(common.PAYLOADS / "validate.py"), "--checks", "import,gpu,arch"]
    if gpus:  # the probe saw GPUs on this host: torch must see as many
        argv += ["--expect-gpus", str(gpus)]
    else:
        argv += ["--device", "cpu"]
    res = proc.run(argv, env=run_env, check=False, timeout=600)
    log.command(argv, {}, res)
    try:
        result = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"checks": {"import": {"status": "fail", "error": res.stderr.strip()[-500:]}}}
    result["kind"] = "smoke"
    result["exit"] = res.returncode
    updated = state.EnvRecord(**{**record.__dict__, "validation": result})
    state.save(home, updated)
    return updated


def activate_line(prefix: str) -> str:
    """The quoted path a user sources to activate the env."""
    return shlex.quote(str(Path(prefix) / "bin" / "activate"))
