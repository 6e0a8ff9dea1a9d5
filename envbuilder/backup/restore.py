"""Bring an env back from a backup: verified first, built beside the target, renamed into place.

wheelhouse: the recorded modules are loaded, the env is created with the recorded command (same backend, same
python), the stored wheels are installed offline (``--no-index``: no index is asked, whether it still serves
them or not), the activate extension is written again, and each package's digest is checked against the
backup's before the rename. archive: the archive is extracted beside the target and, at a new prefix, relocated.
An existing env is replaced only with ``force``; the previous one is moved aside and removed after the rename.
As for create, a pending marker inside the env lets a rerun finish the record of a restore killed after its rename,
and a name with an env elsewhere is moved only with ``force`` (``transaction``: claim, the swap, heal).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder import payloads
from envbuilder.backends import activation, base, installers, lookup, managedpython, torchbuild
from envbuilder.backends.buildlog import BuildLog, open_log, world_write_swept
from envbuilder.backends.smoke import activated_env, smoke
from envbuilder.backup import Backup, archive, image, pack_workers, verify, wheelhouse
from envbuilder.core import facts, kinds, settings
from envbuilder.core.errors import BackupError, StateError
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS, InstallStep
from envbuilder.resolver import mirror
from envbuilder.system import (
    envwalk,
    fsutil,
    proc,
    purge,
    relocate,
    removal,
    state,
    strictmodes,
    transaction,
)
from envbuilder.system.modules import EnvDelta, ModuleSystem


@dataclass(frozen=True)
class RestoreOptions:
    prefix: Optional[str] = None
    name: Optional[str] = None
    force: bool = False
    smoke_check: bool = True
    #: Where an env that ``force`` replaces is removed, after the swap, while the smoke check runs (None: before
    #: the swap returns).
    later: Optional[transaction.Later] = None
    #: Seconds to wait for another envbuilder that holds the env's mutex (the CLI's --wait).
    wait: float = 0.0
    #: This node's facts: where they are those the env was created under and its record holds a passing import
    #: check, the import is not repeated (the restored files are hashed against the backup's). None: it runs.
    node: Optional[HostFacts] = None


@dataclass
class RestoreResult:
    status: str  # restored | replaced | moved (force, to another prefix)
    record: state.EnvRecord
    backup: str
    log: str
    notes: list[str] = field(default_factory=list)
    relocation: Optional[dict[str, Any]] = None
    #: Why torch was not imported again (this node is the kind it imported on), or None where it was (or the
    #: caller asked for no check).
    import_proven: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "import_proven": self.import_proven,
            "backup": self.backup,
            "log": self.log,
            "notes": self.notes,
            "relocation": self.relocation,
            "env": self.record.to_json(),
        }


def restore(
    b: Backup,
    env: Mapping[str, str],
    modules: ModuleSystem,
    opts: RestoreOptions,
    step: Callable[[str], None] = lambda text: None,
    *,
    sized: Callable[[int], None] = lambda size: None,
) -> RestoreResult:
    """Restore backup ``b`` (RestoreOptions say where and how); ``step`` starts each progress step, ``sized``
    hands it what the new env measures once it is built."""
    # What is restored is what another user could have put there, unless only this user (or the group the site
    # names for a shared root) can write the backup.
    strictmodes.backup_root(b.root, env, str(b.path.relative_to(b.root)))
    step(f"verifying {b.id}")
    # A wheelhouse's wheels are hashed as they are decompressed (one read, not two), all before any is installed;
    # a container env's image as it is copied, before it is renamed in.
    hashed_later = b.mode in ("wheelhouse", "image")
    problems = verify(b, record_result=not hashed_later, hash_wheels=not hashed_later)
    if problems:
        raise _unverified(b, problems)
    old = state.EnvRecord.from_json(b.data["record"])
    name = opts.name or old.name
    final = Path(opts.prefix or old.prefix).expanduser().resolve()
    home = settings.home(env)
    strictmodes.env_prefix(final)
    proven = _proven_here(old, opts.node)
    with state.mutex(home, name, timeout=opts.wait):
        notes = transaction.recover(final)
        healed, more = transaction.heal(home, name, final)
        notes += more
        relocation = None
        if healed is not None and healed.command == "restore" and healed.backup == b.id:
            # This restore, killed after its rename last time: finished now.
            record, status = healed.record, healed.status
            log = open_log(home, name)
            for note in more:
                log.write(note)
            log.close()
        else:
            imports_next = opts.smoke_check and bool(old.plan.get("torch")) and not proven
            job = _Job(b, old, name, final, env, modules, step, imports_next, sized)
            record, status, log, relocation = _restore(job, home, opts, notes)
    # A container env's image is byte for byte (sha256) the one whose torch create read inside it.
    container = kinds.kind_info(record.kind).container
    if opts.smoke_check and record.plan.get("torch") and not container and not proven:
        record = _import_check(record, final, env, modules, log_path=Path(log.path), step=step)
    elif proven and not container and record.validation is None:
        # The import on record is the backed-up env's, of these same files on this kind of node: it stays.
        record = replace(record, validation={**(old.validation or {}), "carried_from": b.id})
        state.save(home, record)
    return RestoreResult(
        status,
        record,
        b.id,
        str(log.path),
        notes,
        relocation.to_json() if relocation else None,
        import_proven=proven if opts.smoke_check and record.plan.get("torch") and not container else None,
    )


def _proven_here(record: state.EnvRecord, node: Optional[HostFacts]) -> Optional[str]:
    """Why the import check need not run again (None: it must): the restored bytes were hashed against the
    backup's, the env passed an import of torch when it was created or last checked, and ``node`` (this node's
    facts, where the caller probed them) is the same kind of node as the one it was created on."""
    checked = ((record.validation or {}).get("checks") or {}).get("import") or {}
    if node is None or checked.get("status") != "pass":
        return None
    if facts.differences(record.facts, node):
        return None
    return (
        f"torch {checked.get('torch') or ''} imported on {record.facts.get('hostname') or 'the node it was built on'}"
        ", whose facts this node shares (arch, glibc, driver, GPUs), and the restored files hash as backed up: "
        "the import check is not repeated (restore --check-import runs it; envbuilder validate runs every check)"
    )


def _import_check(
    record: state.EnvRecord,
    final: Path,
    env: Mapping[str, str],
    modules: ModuleSystem,
    *,
    log_path: Path,
    step: Callable[[str], None],
) -> state.EnvRecord:
    step("checking that torch imports")
    act = activation.from_plan(Activation.of_record(record.plan) or Activation(), None, record.recipe)
    delta = modules.apply(
        record.plan.get("module_use", []), record.plan.get("modules", []), proc.scrubbed_env(env)
    )
    gpus = len(record.facts.get("gpus") or [])
    relog = BuildLog(log_path)
    try:
        run_env = activated_env(proc.scrubbed_env(env), delta, act)
        return smoke(record, final, run_env, site_python=None, log=relog, home=settings.home(env), gpus=gpus)
    finally:
        relog.close()


@dataclass(frozen=True)
class _Job:
    """What one restore puts back: from which backup, which env (its record), under which name at which prefix;
    with the caller's environment, module system and progress line. Handed to each stage."""

    b: Backup
    old: state.EnvRecord
    name: str
    final: Path
    env: Mapping[str, str]
    modules: ModuleSystem
    step: Callable[[str], None]
    #: The smoke check follows the install (it imports torch): uv writes the bytecode as it installs.
    imports_next: bool = True
    #: What the partial env measures once it is built (progress.Steps.sized).
    sized: Callable[[int], None] = lambda size: None


def _restore(
    job: _Job, home: Path, opts: RestoreOptions, notes: list[str]
) -> tuple[state.EnvRecord, str, BuildLog, Optional[relocate.Relocation]]:
    """Check the target, build beside it, rename into place, record (the env's mutex held)."""
    b, name, final, step = job.b, job.name, job.final, job.step
    moving = transaction.claim(home, name, final, opts.force)
    replacing = final.exists()
    if replacing and not opts.force:
        raise StateError(
            f"{final} exists ({_describe(home, name, final)}); restore never overwrites an env by itself",
            hint="pass --force to replace it, or --prefix DIR to restore beside it",
        )
    if replacing and not removal.is_env(final):
        raise StateError(f"{final} exists and is not an environment; refusing to touch it")
    status = "moved" if moving else "replaced" if replacing else "restored"

    log = open_log(home, name)
    try:
        relocation: Optional[relocate.Relocation] = None
        with transaction.Transaction(final, later=opts.later) as tx:
            if b.mode == "wheelhouse":
                record = _wheelhouse(job, tx.partial, log)
            elif b.mode == "image":
                record = _image(job, tx.partial, log)
            else:
                record, relocation = _archive(job, tx.partial, log)
            pending = transaction.Pending("restore", status, record, str(moving) if moving else None, b.id)
            step(f"moving the env into place at {final}")
            tx.swap(pending.to_json())
        for note in tx.finish(job.env, lambda: pending.complete(home, final)):
            log.write(note)
            notes.append(note)
    finally:
        log.close()
    return pending.record, status, log, relocation


def _unverified(b: Backup, problems: list[str]) -> BackupError:
    return BackupError(
        f"backup {b.id} failed verification, so nothing was restored: {problems[0]}"
        + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
        hint=f"restore an older one: envbuilder backups {b.env}, then --backup ID",
    )


def _describe(home: Path, name: str, final: Path) -> str:
    try:
        rec = state.load(home, name)
    except StateError:
        return "not recorded by envbuilder"
    if Path(rec.prefix) != final:
        return "another env"
    health = state.health(rec)
    return f"{name}, {health.status}: {health.detail}"


def _restored_record(
    old: state.EnvRecord,
    b: Backup,
    name: str,
    where: tuple[Path, Path],
    packages: list[dict[str, Any]],
    *,
    files: Optional[dict[str, Any]] = None,
    **more: Any,
) -> state.EnvRecord:
    """The restored env's record; ``where``: the directory it is built in and its final prefix; ``files``: its
    measure where the caller walked it already."""
    partial, final = where
    return replace(
        old,
        name=name,
        # Measured here, as create does: the restored files' access times are not the old env's.
        files=files if files is not None else envwalk.measure(partial, purged=purge.policy(old) is not None),
        prefix=str(final),
        # The recorded commands name the prefix too: a later backup of this env restores from them.
        plan={
            **old.plan,
            "prefix": str(final),
            "install_commands": [
                base.rebase(c, old.prefix, str(final)) for c in old.plan.get("install_commands", [])
            ],
        },
        packages=tuple(packages),
        validation=None,
        origin={
            "backup": b.id,
            "mode": b.mode,
            "backup_created": b.data.get("created"),
            "restored": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "from_prefix": old.prefix,
        },
        **more,
    )


def _wheelhouse(job: _Job, partial: Path, log: BuildLog) -> state.EnvRecord:
    """Build the env at ``partial`` from its recorded commands and the backed-up wheels; its record."""
    b, old, modules, step = job.b, job.old, job.modules, job.step
    plan = old.plan
    if not kinds.kind_info(old.kind).venv:
        raise BackupError(f"a wheelhouse backup of a {old.kind} env cannot be restored by this release")
    backend = lookup.backend(old.kind)()
    build, delta = _prepare(job, partial, log, backend)
    # The recorded command, for the env's recorded prefix: built here instead.
    recorded = base.rebase(plan["install_commands"][0], old.prefix, str(partial))
    # Records that earlier restores wrote kept the commands of the prefix they were restored from.
    source = (old.origin or {}).get("from_prefix")
    if source and str(partial) not in recorded:
        recorded = base.rebase(recorded, source, str(partial))
    first = InstallStep(tuple(recorded), site_python=True, creates_env=True)
    cached = isinstance(build.installer, installers.Uv) and _cache_first(job, backend, build, first)
    if not cached:
        _from_wheelhouse(b, backend, build, first, step)
    # --- torch build guard (issue 16): the restored torch is the recorded plan's build
    torchbuild.guard_restore(
        plan,
        partial,
        source=f"backup {b.id} ({'uv cache' if cached else 'its wheelhouse'})",
        python=None,
        env=build.env,
        log=log.write,
        home=settings.home(job.env),
    )
    # --- end of the torch build guard
    _write_constraints(partial, plan)
    act = activation.from_plan(Activation.of_record(old.plan) or Activation(), modules.init_dir, old.recipe)
    backend.activate(build, act)
    payloads.into_env(partial)
    if not cached:  # the cache path compared already: it is only kept when every digest matched
        _compare(b, partial)
    backend.move_in(build)
    loaded = base.loaded_modules(modules.kind, delta)
    # One walk (find, on another core) while the packages are read: it clears world write and measures the env.
    purged = purge.policy(old) is not None
    with world_write_swept(partial, atimes=purged, sizes=True) as swept:
        packages = backend.inventory(build)
    job.sized(swept.walk.size)  # the progress line's figure, from the same walk
    files = swept.walk.files(purged)
    record = _restored_record(old, b, job.name, (partial, job.final), packages, files=files, modules=loaded)
    fsutil.write_atomic(partial / "envbuilder" / "record.json", record.dumps())
    for rel in swept.fixed:
        log.write(f"removed world write permission from {rel}")
    return record


def _prepare(job: _Job, partial: Path, log: BuildLog, backend: base.Backend) -> tuple[base.Build, EnvDelta]:
    """The recorded modules loaded, the recorded python and installer found: the Build the backend works in."""
    old, final, env, modules = job.old, job.final, job.env, job.modules
    plan = old.plan
    base_env = proc.scrubbed_env(env)
    job.step(f"loading modules ({modules.kind})" if plan.get("modules") else "no modules to load")
    delta = modules.apply(plan.get("module_use", []), plan.get("modules", []), base_env)
    build_env = delta.apply(base_env)
    recorded = plan.get("python") or {}
    # A managed python is installed again where it is gone (the env's pyvenv.cfg names it), by the same rules.
    python = managedpython.interpreter(recorded, env, log, job.step) or backend.python(
        recorded.get("command") or "python3", build_env, final
    )
    installer = installers.INSTALLERS[plan.get("installer", "uv")]
    program = installer.find()
    if program is None:
        raise BackupError(
            f"this env was built with {installer.name}, which is not installed here",
            hint=f"pip install {installer.name}",
        )
    tool_env, _ = installer.settings(final, env)
    tool_env.update(
        installers.bytecode_env(
            installer,
            old.kind,
            bool(plan.get("system_site_packages")),
            env,
            log.write,
            imports_next=job.imports_next,
        )
    )
    build_env.update(tool_env)
    prefix = str(plan.get("prefix") or old.prefix)
    build = base.Build(prefix, final, partial, installer, program, python, base_env, build_env, tool_env, log)
    return build, delta


def _cache_first(job: _Job, backend: base.Backend, build: base.Build, first: InstallStep) -> bool:
    """Create the env and fill it from uv's cache (_from_uv_cache); True when that served every package. The
    partial is gone again when it did not."""
    b, plan = job.b, job.old.plan
    job.step("creating the env; trying uv's cache for the backed-up packages (offline)")
    backend.create(build, first, build.env)
    # The stored wheels are checked meanwhile: a corrupt backup is refused whichever way the env is built. A
    # wheel hashed before and unchanged since (backup wrote it, verify-backup read it) is not read again.
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        checking = pool.submit(verify, b, False, True, stop, memo=True)
        cached = _from_uv_cache(b, plan, build)
        if not cached:
            stop.set()  # decompressing checks every blob anyway: no second read
        problems = checking.result()
    if problems:
        raise _unverified(b, problems)
    if not cached:
        removal.remove_tree(build.partial)
    return cached


def _write_constraints(partial: Path, plan: Mapping[str, Any]) -> None:
    """torch's pins, as create wrote them: the activate extension hands them to pip and uv (PIP_CONSTRAINT,
    UV_CONSTRAINT), and later installs into the env keep the torch build."""
    pins = (plan.get("torch") or {}).get("requirements") or []
    if pins:
        (partial / "envbuilder").mkdir(exist_ok=True)
        (partial / CONSTRAINTS).write_text("".join(f"{p}\n" for p in pins), encoding="utf-8")


def _from_wheelhouse(
    b: Backup, backend: base.Backend, build: base.Build, first: InstallStep, step: Callable[[str], None]
) -> None:
    store = wheelhouse.Store(b.root, zstd_bin=wheelhouse.zstd())
    wheels_dir = build.final.parent / f".{build.final.name}{transaction.PARTIAL}wheels-{os.getpid()}"
    try:
        wheels_dir.mkdir(mode=0o700)
        step(f"checking and unpacking {len(b.data['wheels'])} wheels, creating the env beside")
        # The wheels are decompressed in parallel while the env is created: both only write new files.
        with ThreadPoolExecutor(max_workers=pack_workers(len(b.data["wheels"]))) as pool:
            futures = [pool.submit(store.extract, w, wheels_dir) for w in b.data["wheels"]]
            backend.create(build, first, build.env)
            failed = [e for e in (f.exception() for f in futures) if e is not None]
            if failed:
                if isinstance(failed[0], BackupError):
                    raise _unverified(
                        b, [e.message if isinstance(e, BackupError) else str(e) for e in failed]
                    )
                raise failed[0]  # a full disk, say: not the backup's fault
            files = [str(f.result()) for f in futures]
        step("installing the wheels (offline)")
        backend.install_files(build, files)
    finally:
        removal.remove_tree(wheels_dir, ignore_errors=True)


def _index_flags(commands: list[list[str]]) -> list[str]:
    """The indexes the env was installed from (as recorded, mirrors included): the first as the index, the rest as
    extra indexes, and PyPI where a command used the default."""
    urls: list[str] = []
    links: list[str] = []
    pre = False
    for cmd in commands:
        if "install" not in cmd:
            continue
        has_index = False
        for flag, value in zip(cmd, cmd[1:]):
            if flag in ("--index-url", "--extra-index-url"):
                urls.append(value)
                has_index = True
            elif flag == "--find-links":
                links.append(value)
        has_index = has_index or "--no-index" in cmd
        if not has_index:
            urls.append(mirror.PYPI)
        pre = pre or "--pre" in cmd
    urls = list(dict.fromkeys(urls))
    flags = ["--index-url", urls[0]] if urls else ["--no-index"]
    for url in urls[1:]:
        flags += ["--extra-index-url", url]
    for link in dict.fromkeys(links):
        flags += ["--find-links", link]
    return [*flags, "--pre"] if pre else flags


def _from_uv_cache(b: Backup, plan: Mapping[str, Any], build: base.Build) -> bool:
    """Install the backed-up versions from uv's cache alone (offline), as a warm create would; True when every
    package then has the backup's digest. Anything else (a purged cache, a locally built wheel, another build of
    the same version) falls back to the wheelhouse."""
    reqs = [f"{w['name']}=={w['version']}" for w in b.data["wheels"]]
    target = str(build.partial / "bin" / "python")
    argv = base.own_program([*build.installer.pip(target), "--offline", "--no-deps"], build)
    argv += ["--index-strategy", "unsafe-best-match", *_index_flags(plan["install_commands"][1:]), *reqs]
    build.log.write("+ " + proc.quote(argv))
    res = proc.run(argv, env=build.env, check=False)
    if res.returncode != 0:
        build.log.write(
            "uv's cache cannot serve this env; restoring from the wheelhouse\n" + proc.tail(res.stderr)
        )
        return False
    try:
        _compare(b, build.partial)
    except BackupError as exc:
        build.log.write(f"uv's cache holds other builds ({exc.message}); restoring from the wheelhouse")
        return False
    build.log.write(f"restored {len(reqs)} packages from uv's cache; every digest equals the backup's")
    return True


def _image(job: _Job, partial: Path, log: BuildLog) -> state.EnvRecord:
    """Copy the backed-up image file into ``partial`` (verified again as it is read), unpack its overlay venv
    where it has one, and write the record there."""
    b, old = job.b, job.old
    if not kinds.kind_info(old.kind).container:
        raise BackupError(f"an image backup of a {old.kind} env cannot be restored by this release")
    job.step(f"copying {b.data['image']['file']}")
    rel = b.path.relative_to(b.root).as_posix()
    image.put_back(b.root, rel, b.data, partial)
    log.write(f"image: {b.data['image']['file']} sha256:{b.data['image']['sha256']}")
    if b.data.get("overlay"):
        job.step(f"unpacking the overlay venv {b.data['overlay']['file']}")
    moved = image.put_back_overlay(b.root, rel, b.data, partial, (old.prefix, str(job.final)))
    if moved is not None:
        log.write(f"overlay relocated: {len(moved.rewritten)} rewritten, {len(moved.left)} left")
    if b.data.get("overlay") and str(job.final) != old.prefix:
        # Its python, binds and commands name the overlay's path, which moved with the prefix.
        box = image.rebased(old.plan.get("container") or {}, old.prefix, str(job.final))
        tools = {
            **old.tools,
            "overlay_python": image.rebased(old.tools.get("overlay_python"), old.prefix, str(job.final)),
        }
        old = replace(old, plan={**old.plan, "container": box}, tools=tools)
    record = _restored_record(old, b, job.name, (partial, job.final), [dict(p) for p in old.packages])
    fsutil.write_atomic(partial / "envbuilder" / "record.json", record.dumps())
    return record


def _compare(b: Backup, partial: Path) -> None:
    """Every package restored is the one backed up (same digest), and none is missing."""
    want = {w["digest"]: w["name"] for w in b.data["wheels"]}
    have = {d.digest for d in wheelhouse.scan(partial)}
    lost = sorted(n for dg, n in want.items() if dg not in have)
    if lost:
        raise BackupError(
            f"after installing, {', '.join(lost)} differ(s) from the backup; the env was not put in place",
            hint="run with -v and report it; envbuilder verify-backup checks the backup itself",
        )


def _archive(
    job: _Job, partial: Path, log: BuildLog
) -> tuple[state.EnvRecord, Optional[relocate.Relocation]]:
    """Extract the archived env at ``partial``, relocated for ``final``; its record."""
    b, old, name, final, step = job.b, job.old, job.name, job.final, job.step
    arc = b.data["archive"]
    rel = b.path.relative_to(b.root).as_posix()
    try:  # read as verify read it: never through a symlink planted in the backup root
        with removal.open_below(b.root, f"{rel}/manifest.json") as fh:
            manifest = json.loads(fh.read())
    except OSError as exc:
        raise BackupError(f"cannot read {b.path / 'manifest.json'}: {exc.strerror}") from None
    relocation = None
    # The archived venv names its managed CPython (pyvenv.cfg's home), which is not in the archive: installed
    # again by the same rules where it is gone from this home.
    managedpython.interpreter(old.plan.get("python") or {}, job.env, log, step)
    step(f"extracting {arc['file']}")
    archive.unpack(b.path / arc["file"], partial, archive.Tools.find(), root=b.root)
    problems = archive.check_tree(partial, manifest)
    if problems:
        raise BackupError(f"the extracted env differs from the manifest: {problems[0]}")
    if str(final) != old.prefix:
        step(f"relocating {old.prefix} -> {final}")
        relocation = relocate.relocate(partial, old.prefix, str(final))
        log.write(f"relocated: {len(relocation.rewritten)} rewritten, {len(relocation.left)} left")
    # The env's own files stay exactly as archived (its envbuilder/record.json was relocated with the rest);
    # the pending marker is removed once the record is written.
    return _restored_record(old, b, name, (partial, final), [dict(p) for p in old.packages]), relocation
