"""`envbuilder create NAME`: plan, then build the env (modules, backend, activate extension, record)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from envbuilder import plan as planner
from envbuilder.backends import activation, network
from envbuilder.backends.buildlog import BuildLog, open_log
from envbuilder.build import create as creator
from envbuilder.build import images
from envbuilder.core import checks, kinds, settings
from envbuilder.core.errors import NetworkError, ResolverError, UsageError, ValidationFailed
from envbuilder.core.facts import HostFacts
from envbuilder.plan import preflight
from envbuilder.recipe import edits, loader
from envbuilder.recipe.catalog import Catalog, find_lock
from envbuilder.resolver import mirror
from envbuilder.resolver.matrix import table_age
from envbuilder.system import fsutil, host, modules, proc, progress, purge, space, state, transaction
from envbuilder.system.console import Out


class _Progress:
    def __init__(self, out: Out, quiet: bool, every: float, steps_quiet: bool) -> None:
        self.out = out
        self.quiet = quiet
        self.steps = progress.Steps(out.console, quiet=steps_quiet, every=every)

    def note(self, text: str) -> None:
        if not self.quiet:
            self.out.line(f"    {text}")

    def wait(self, text: str) -> None:
        self.out.warn(text)


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    opts = planner.Options(
        prefix=args.prefix,
        installer=args.installer,
        locked=args.locked,
        partition=args.partition,
    )
    catalog = Catalog.from_env(env)
    recipe = loader.load(args.recipe, catalog)
    if args.name is not None:
        check_name(args.name)
        if not args.prefix:  # the recipe's prefix, for this name ({name} in env.prefix)
            opts = dataclasses.replace(opts, prefix=named_prefix(recipe, env, args.name))
    facts = host.facts_for(args.facts)
    the_plan, unread = _plan(recipe, facts, env, opts, catalog=catalog, args=args)
    same_arch(the_plan, platform.machine())
    # --json keeps stdout for the JSON; the steps and their progress stay on stderr, or a batch job's output
    # says nothing for the minutes of an install. -q silences them.
    talk = _Progress(out, args.quiet or args.json, progress.every_from_env(env), steps_quiet=args.quiet)
    if not (args.quiet or args.json):
        what = f"{args.name} (recipe {the_plan.recipe}, " if args.name else f"{the_plan.recipe} ("
        tool = the_plan.container.runtime if the_plan.container else the_plan.installer
        out.heading(f"Creating {what}{the_plan.kind}, {tool}) at {the_plan.prefix}")
        if the_plan.resolution:
            r = the_plan.resolution
            out.field(
                "torch", f"{r.torch} {r.variant} from {mirror.shown(r.index_url, mirror.from_env(env))}"
            )
        if the_plan.lock and the_plan.lock.applies:
            lk, arch = the_plan.lock.summary, the_plan.lock.arch
            out.field("lock", f"{lk.path} ({lk.origin}): {lk.platforms[arch or '']} packages for {arch}")
        for w in the_plan.warnings:
            out.warn(w)
        if unread:  # before minutes of building: the install reads the same indexes
            out.warn(network.plan_saw(unread))
    checked = (
        None if space.skipped(args.no_preflight, env, out.warn) else _preflight(the_plan, recipe, env, out)
    )
    steps = talk.steps
    report = creator.Reporter(
        step=steps.start, note=talk.note, wait=talk.wait, moving=steps.moving, downloads=steps.downloading
    )
    # An env that --force replaces is removed after the swap, while the checks run; joined before the end.
    with transaction.Later() as later:
        copts = creator.CreateOptions(
            force=args.force,
            name=args.name,
            smoke_check=not args.no_validate,
            validate_after=not args.no_validate,
            later=later,
            wait=args.wait,
            installer_source="--installer" if args.installer else "recipe",
        )
        where = (Path(the_plan.prefix).parent, "build elsewhere with --prefix DIR")
        with proc.sigterm_as_interrupt(), steps, fsutil.disk_errors(where), _saw(unread):
            result = creator.create(
                the_plan, recipe, env, modules.detect(env), copts, report=report, facts=facts.to_json()
            )
        data = result.to_json()
        data["preflight"] = checked
        if not args.json:
            _render(result, out, [])
        if result.recipe_edit and not args.quiet:
            _edited(result.record, the_plan.recipe, result.recipe_edit, out)
        if result.smoke_deferred:
            data["validation"], result = _validate(result, recipe, facts, env, args=args, out=out)
            data["env"] = result.record.to_json()
    hint = _backup_hint(result.record, env)
    if hint and not args.json:
        days = (purge.policy(result.record) or {}).get("purge_days")
        out.line(f"{the_plan.prefix} is purged after {days} days unread; keep a copy in $WORK: {hint}")
    data["advice"] = hint
    _failing(result, data)
    return data


def _preflight(
    the_plan: planner.Plan, recipe: loader.Recipe, env: dict[str, str], out: Out
) -> Optional[dict[str, object]]:
    """Refuse before building what the env's file system (or uv's cache's) cannot hold; None where nothing is
    estimated (a container env's image)."""
    needs = preflight.for_plan(the_plan, str(settings.uv_cache(env)[0]))
    if not needs:
        return None
    verdict = space.check(
        needs,
        env=env,
        warn=out.warn,
        way_out="build elsewhere with --prefix DIR",
        limits=preflight.limits(recipe, env),
        elsewhere=preflight.elsewhere(recipe, env, the_plan.prefix),
    )
    return space.to_json(needs, verdict)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _plan(
    recipe: loader.Recipe,
    facts: HostFacts,
    env: dict[str, str],
    opts: planner.Options,
    *,
    catalog: Catalog,
    args: argparse.Namespace,
) -> tuple[planner.Plan, list[str]]:
    """The plan, and the index pages that could not be read (the install meets them too, even where the plan had
    a copy read before)."""
    if kinds.kind_info(recipe.env.kind).container:
        return images.container_plan(recipe, facts, env, opts, offline=args.offline), []
    lock = None if args.no_lock else find_lock(recipe, catalog, env, args.lock)
    from envbuilder.resolver import indexread  # noqa: PLC0415 - urllib and threads only when an index is read

    index = indexread.read_torch(
        planner.torch_request(recipe), env, refresh=args.refresh, offline=args.offline
    )
    unread = [e for p in index.pages.values() for e in (p.error or p.failed,) if e] if index else []
    return planner.build(recipe, facts, env, opts, lock=lock, index=index, table_age=table_age()), unread


def check_name(name: str) -> None:
    """An env name is a file name in the records, logs, mutexes and backups: a plain one."""
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"--name {name!r} is not an env name",
            hint="letters, digits, '.', '_' and '-', starting with a letter or digit (100 at most)",
        )


def named_prefix(recipe: loader.Recipe, env: dict[str, str], name: str) -> Optional[str]:
    """The recipe's env.prefix with ``{name}`` standing for ``name`` (None where it needs unset variables: the
    plan says which)."""
    text, missing = planner.expand(recipe.env.prefix, env, name)
    if missing == ["SCRATCH"] and env.get("HOME"):
        text, missing = planner.expand(planner.FALLBACK_ROOT, env, name)
    return None if missing else text


def same_arch(the_plan: planner.Plan, here: str) -> None:
    """An env is built by the machine it runs on: its python, its wheels' platform tags and every compiled
    extension are this machine's. A plan for other nodes is refused here, not built wrong."""
    target = the_plan.target.arch
    if not target or not here or target == here:
        return
    where = f"an {target} node of {the_plan.site}" if the_plan.site else f"an {target} machine"
    how = f" (e.g. {' '.join(the_plan.interactive_command)})" if the_plan.interactive_command else ""
    raise ResolverError(
        f"{the_plan.recipe} is for {target} nodes, and this machine is {here}: an env built here would hold "
        f"{here} wheels and a {here} python",
        gate="platform",
        hint=f"run `envbuilder create {the_plan.recipe}` on {where}{how}; `envbuilder lock {the_plan.recipe} "
        f"--platform {target}` works from here",
    )


def _validate(
    created: creator.CreateResult,
    recipe: loader.Recipe,
    facts: HostFacts,
    env: dict[str, str],
    *,
    args: argparse.Namespace,
    out: Out,
) -> tuple[Optional[dict[str, Any]], creator.CreateResult]:
    """The full suite right after the build, where this host can run it: its ranks import torch and write the
    bytecode, in place of the smoke check. Where it cannot run here, say how to, and run the smoke check."""
    from envbuilder.validate import runner as validator  # noqa: PLC0415
    from envbuilder.validate import session  # noqa: PLC0415 - not imported by --no-validate

    quiet = bool(args.quiet or args.json)
    try:
        result = session.execute(
            created.record,
            recipe,
            facts,
            env,
            validator.Options(partition=args.partition, write_bytecode=True),
            out=out,
            quiet=quiet,
            home=settings.home(env),
        )
    except (validator.NotHere, validator.NoAllocation) as exc:
        # Not runnable here (a login node, a multi-node run outside an allocation): say how to, and smoke instead.
        if not quiet:
            out.line(
                exc.message if isinstance(exc, validator.NotHere) else f"not validating here: {exc.message}"
            )
            if exc.hint:
                out.line(f"  {exc.hint}")
        if kinds.kind_info(created.record.kind).container:
            return (
                None,
                created,
            )  # the build read the torch inside the image: there is no host python to smoke
        return None, _smoke(created, facts, env, out=out, quiet=quiet)
    created = dataclasses.replace(
        created, record=dataclasses.replace(created.record, validation=result.to_json())
    )
    if checks.FIRST in result.failed and not kinds.kind_info(created.record.kind).container:
        # torch does not import (the launcher may not even start): the smoke check says why, and records it, as
        # a create that it had preceded would have.
        return result.to_json(), _smoke(created, facts, env, out=out, quiet=quiet)
    if set(result.failed) & set(checks.SMOKE):
        # What the smoke check would have found: the caller fails as it did, with the create's data.
        return result.to_json(), created
    return session.finish(result), created


def _smoke(
    created: creator.CreateResult, facts: HostFacts, env: dict[str, str], *, out: Out, quiet: bool
) -> creator.CreateResult:
    """The smoke check that a validation which cannot run here did not replace, logged in the create's log."""
    if not quiet:
        out.line("checking that torch imports")
    log = BuildLog(Path(created.log)) if created.log else open_log(settings.home(env), created.record.name)
    with proc.sigterm_as_interrupt():
        try:
            record = creator.smoke_recorded(
                created.record,
                modules.detect(env),
                env,
                settings.home(env),
                log=log,
                gpus=len(facts.gpus or []),
            )
        finally:
            log.close()
    smoke = record.validation or {}
    failed = _failed(smoke)
    if not quiet and smoke and not failed:
        imp = (smoke.get("checks") or {}).get("import", {})
        out.result.field("smoke check", f"torch {imp.get('torch')} imports (cuda {imp.get('cuda')})")
    return dataclasses.replace(created, record=record)


def _failing(result: creator.CreateResult, data: dict[str, Any]) -> None:
    """A smoke check that failed, or a validation that found what it would have: the env is built and recorded,
    and the command fails with its data."""
    failed = _failed(result.record.validation or {})
    if not failed:
        return
    what = "smoke check" if (result.record.validation or {}).get("kind") == "smoke" else "validation"
    exc = ValidationFailed(
        f"the env was built at {result.record.prefix}, but its {what} failed: {', '.join(failed)}",
        hint=f"see {result.log}" if result.log else "envbuilder show " + result.record.name,
    )
    exc.data = data
    raise exc


def _failed(result: Mapping[str, Any]) -> list[str]:
    return [k for k, v in (result.get("checks") or {}).items() if v.get("status") == "fail"]


def _backup_hint(record: state.EnvRecord, env: dict[str, str]) -> Optional[str]:
    """The backup advice for a new env: only one the scratch purge can take needs a copy, so only then are the
    backups looked up (and the backup module imported)."""
    if not purge.policy(record):
        return None
    from envbuilder import backup  # noqa: PLC0415

    return backup.advice(record, "ok", bool(backup.backups(settings.backup_root(env)[0], record.name)))


def _mib(size: object) -> str:
    return f"{int(size or 0) / 2**20:.0f} MiB" if isinstance(size, (int, str)) else "?"


@contextlib.contextmanager
def _saw(unread: list[str]) -> Iterator[None]:
    """An installer that could not reach its index says that the plan could not read it either."""
    try:
        yield
    except NetworkError as exc:
        raise network.with_plan(exc, unread) from None


def _edited(record: state.EnvRecord, recipe: str, edit: edits.Edit, out: Out) -> None:
    """On stderr, under --json too: an env left alone although its recipe changed since it was built."""
    if edit.status == "unchanged":
        return
    named = f" --name {record.name}" if record.name != recipe else ""
    rebuild = f"`envbuilder create {recipe}{named} --force` rebuilds it"
    if edit.status == "unknown":
        out.warn(
            f"{record.name}'s record keeps no recipe digest: whether its recipe changed cannot be told; "
            f"{rebuild} from the recipe as it is now"
        )
        return
    if not edit.described:
        out.warn(
            f"the recipe {recipe} changed since {record.name} was built (its record, from an older "
            f"envbuilder, keeps no copy of the values to say which); {rebuild}"
        )
        return
    keys = f": {len(edit.changes)} key(s) differ" if edit.changes else ""
    out.warn(f"the recipe {recipe} changed since {record.name} was built{keys}; {rebuild}")
    for change in edit.changes[:_CHANGES_SHOWN]:
        out.line(f"  {change.shown()}")
    if len(edit.changes) > _CHANGES_SHOWN:
        out.line(f"  and {len(edit.changes) - _CHANGES_SHOWN} more (--json lists them all)")


#: Changed keys listed on stderr (--json lists every one).
_CHANGES_SHOWN = 12


def _render(result: creator.CreateResult, out: Out, failed: list[str]) -> None:
    rec = result.record
    if result.status == "exists":
        edited = result.recipe_edit is not None and result.recipe_edit.status != "unchanged"
        done = "nothing done" if edited else "nothing to do (--force rebuilds it)"
        out.result.line(f"{rec.name} already exists at {rec.prefix}; {done}")
        # Nothing was checked now: what the record says the env holds.
        variant = ((rec.plan or {}).get("torch") or {}).get("variant")
        if rec.torch:
            shown = variant and not rec.torch.endswith(f"+{variant}")
            out.result.field("torch", rec.torch + (f" ({variant})" if shown else ""))
    elif kinds.kind_info(rec.kind).container:
        _render_container(result, out)
    else:
        in_env = [p for p in rec.packages if p.get("in_env")]
        total = sum(int(p.get("size") or 0) for p in in_env)
        largest = sorted(in_env, key=lambda p: -int(p.get("size") or 0))[:3]
        sizes = ", ".join(f"{p['name']} {_mib(p.get('size'))}" for p in largest)
        out.result.line(
            f"{result.status} {rec.name}: {len(in_env)} packages, {_mib(total)} ({sizes}) at {rec.prefix}"
        )
        if result.log:
            out.result.field("log", result.log)
    smoke = (rec.validation or {}).get("checks") or {}
    if smoke and not failed and result.status != "exists":
        imp = smoke.get("import", {})
        out.result.field("smoke check", f"torch {imp.get('torch')} imports (cuda {imp.get('cuda')})")
    if kinds.kind_info(rec.kind).container:  # no bin/activate: a function enters the image
        out.result.field(
            "enter",
            f'eval "$(envbuilder activate {rec.name})"; {rec.name} COMMAND... (or envbuilder run {rec.name} COMMAND...)',
        )
    else:
        out.result.field("activate", activation.activate_line(rec.prefix))


def _render_container(result: creator.CreateResult, out: Out) -> None:
    """What a container env holds: its image (reference, digest, file and size) and the overlay's packages."""
    rec = result.record
    tools, box = rec.tools, (rec.plan or {}).get("container") or {}
    image = Path(rec.prefix) / Path(str(tools.get("image_file") or "image.sif")).name
    size = image.stat().st_size if image.is_file() else None
    out.result.line(f"{result.status} {rec.name}: the image {tools.get('image')} at {rec.prefix}")
    out.result.field("image file", f"{image} ({_bytes(size)}, sha256 {str(tools.get('image_sha256'))[:16]}…)")
    out.result.field("digest", str(tools.get("image_digest") or "none (not from a registry, or not read)"))
    overlay = (box.get("overlay") or {}).get("path")
    if overlay:
        mine = [f"{p['name']} {p['version']}" for p in rec.packages if p.get("in_env")]
        out.result.field(
            "packages on top",
            f"{len(mine)} in {overlay} ({_bytes(_tree_size(Path(overlay)))}): {', '.join(mine)}",
        )
    if result.log:
        out.result.field("log", result.log)


def _bytes(size: Optional[int]) -> str:
    """A size for people: MiB, or KiB below one MiB (an overlay of a few small packages)."""
    if size is None:
        return "size unknown"
    return _mib(size) if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def _tree_size(root: Path) -> int:
    """The bytes of the files under ``root`` (its links not followed)."""
    return sum(p.lstat().st_size for p in fsutil.walk(root) if p.is_file() and not p.is_symlink())
