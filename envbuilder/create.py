"""``create``: apply a Plan. Build beside the prefix, rename into place when complete, record the env.

Order: lock the env → recover what an interrupted run left → load the modules (delta recorded) → create the env
in ``.NAME.partial-PID`` beside the prefix → install the resolver's pins, then the recipe's packages → check the
installed torch build against the plan (torchbuild) → write the activate extension → inventory → rename into
place (``--force``: the old env is moved aside first and removed only after the new one is in place) → write the
record. Any failure or interrupt removes the partial directory;
the lock is released by its context manager, and a SIGKILLed run's lock is stale and broken by the next run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder import __version__, activation, build, conda, proc, rattler_engine, state, torchbuild
from envbuilder.errors import BackendError, CommandFailed, EnvbuilderError, StateError, UsageError
from envbuilder.loader import Recipe
from envbuilder.modules import EnvDelta, ModuleSystem
from envbuilder.plan import Plan
from envbuilder.steps import CLONE, CONSTRAINTS, LOCK_REQUIREMENTS, InstallStep

PARTIAL = ".partial-"
OLD = ".old-"


@dataclass(frozen=True)
class CreateOptions:
    force: bool = False
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
    status: str  # created | replaced | exists
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
    home = state.home(env)
    name = plan.recipe

    def waiting(owner: state.Owner) -> None:
        report.wait(f"another envbuilder (pid {owner.pid} on {owner.host}) is working on {name}; waiting")

    with state.locked(home, name, timeout=opts.lock_timeout, on_wait=waiting):
        notes = recover(final)
        for n in notes:
            report.note(n)
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
        had = final.exists()
        log = open_log(home, name)
        try:
            record = _build(plan, recipe, env, modules, opts, report, final, home, log, notes, facts or {})
        finally:
            log.close()
        status = "replaced" if had else "created"
        return CreateResult(status, record, str(log.path), notes)


def _existing(home: Path, name: str, final: Path) -> Optional[state.EnvRecord]:
    try:
        record = state.load(home, name)
    except StateError:
        return None
    if Path(record.prefix) == final and final.exists():
        return record
    return None


def open_log(home: Path, name: str) -> build.BuildLog:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return build.BuildLog(home / "logs" / f"{name}-{stamp}-{os.getpid()}.log")


def _build(
    plan: Plan,
    recipe: Recipe,
    env: Mapping[str, str],
    modules: ModuleSystem,
    opts: CreateOptions,
    report: Reporter,
    final: Path,
    home: Path,
    log: build.BuildLog,
    notes: list[str],
    facts: Mapping[str, Any],
) -> state.EnvRecord:
    base_env = proc.scrubbed_env(env)
    log.write(f"envbuilder {__version__} create {plan.recipe} -> {final}")
    choice = build.choose_installer(plan.installer, str(final), opts.installer_source)
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
        python = build.find_python(plan.python["command"] or "python3", build_env)
    parent: dict[str, Any] = {}
    cloning = any(step.argv[0] == CLONE for step in plan.install_steps)
    if plan.system_site_packages or plan.kind == "user-prefix" or cloning:
        # Only these envs see the base python's packages: is it a venv itself (whose packages a venv on top
        # would not see)?
        parent = build.python_info(python, build_env, log)
    log.write(f"python: {python}")

    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f".{final.name}{PARTIAL}{os.getpid()}"
    # The installer's own settings, laid over whatever environment the modules give each step.
    tool_env: dict[str, str] = {}
    uv_bin = build.uv_binary() if plan.installer == "uv" else None
    if uv_bin:
        uv = build.uv_settings(final, env)
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

    with build.removing_on_failure(partial):
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
            argv = build.step_argv(step, python, uv_bin, plan.prefix, str(partial))
            step_env = build_env
            if step.modules:
                extra = modules.apply(plan.module_use, [*plan.modules, *step.modules], base_env)
                step_env = {**extra.apply(base_env), **tool_env}
            step_env, own = build.step_env(step, step_env)
            if step.engine:
                argv, engine = conda.engine_argv(argv, step.engine, step_env, plan.target.arch or "", final)
                step_env = conda.engine_env(engine, step_env)
                log.write(f"conda engine: {engine}")
            report.step(_describe(step) + (f" with {engine}" if step.engine else ""))
            try:
                build.run_logged(argv, step_env, log, own)
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
        packages = build.inventory(partial)
        if plan.kind == "conda" or cloning:
            changed = conda.move_in(partial, final, engine or "clone")
            log.write(f"relocated {len(changed)} file(s) from {partial} to {final}")
        elif plan.installer != "uv" and plan.kind != "user-prefix":
            changed = build.relocate_scripts(partial, final)
            log.write(f"relocated {len(changed)} file(s) from {partial} to {final}")
        record = state.EnvRecord(
            name=plan.recipe,
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
        state.write_atomic(partial / "envbuilder" / "record.json", dump_record(record))
        # Children ran under a umask without world write; this catches what a tool chmods itself (uv's .lock).
        for rel in build.drop_world_write(partial):
            log.write(f"removed world write permission from {rel}")
        report.step(f"moving the env into place at {final}")
        swap(partial, final)
    state.save(home, record)
    log.write(f"done: {final}")
    # torch comes from the resolver, or (overlays) from the site python underneath: check it either way.
    if opts.smoke_check and (plan.resolution is not None or plan.system_site_packages or cloning):
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


def _after_create(plan: Plan, partial: Path, parent: Mapping[str, Any], log: build.BuildLog) -> None:
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
            pth = build.parent_site_pth(sites[0], parent)
            if pth is not None:
                log.write(f"parent python is a venv ({parent['prefix']}): {pth.name} adds its site-packages")


def python_version(partial: Path, parent: Mapping[str, Any]) -> str:
    if parent.get("version"):
        return str(parent["version"])
    for line in build.read_text(partial / "pyvenv.cfg").splitlines():
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
    log: build.BuildLog,
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
            tools["uv"] = build.run_logged([uv_bin, "--version"], env, log).stdout.split()[1]
    return tools


def smoke(
    record: state.EnvRecord,
    final: Path,
    site_python: Optional[str],
    act: activation.Activation,
    delta: EnvDelta,
    base_env: Mapping[str, str],
    log: build.BuildLog,
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
    argv = [python, str(build.PAYLOADS / "validate.py"), "--checks", "import,gpu,arch"]
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
