"""`envbuilder backup|backups|restore|verify-backup|prune-backups|touch`: keep envs safe from the scratch purge."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder import backup
from envbuilder.backup import portable
from envbuilder.backup import restore as restorer
from envbuilder.core import settings
from envbuilder.core.errors import BackupError, EnvbuilderError, UsageError, ValidationFailed
from envbuilder.core.space import Need
from envbuilder.plan import preflight as estimate
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.scale import image
from envbuilder.system import (
    envwalk,
    fsutil,
    host,
    modules,
    proc,
    progress,
    purge,
    space,
    state,
    strictmodes,
    transaction,
)
from envbuilder.system.console import Cell, Out, plain
from envbuilder.system.tables import Column
from envbuilder.validate import runner as validator
from envbuilder.validate import session


def _root(arg: Optional[str]) -> tuple[Path, Optional[str]]:
    """The backup root, and a backup id when ``arg`` names one backup's directory."""
    if arg:
        path = Path(arg).expanduser().resolve()
        if (path / "backup.json").is_file():  # ROOT/envs/NAME/STAMP
            return path.parent.parent.parent, f"{path.parent.name}@{path.name}"
        return path, None
    return settings.backup_root(os.environ)[0], None


def _mib(n: object) -> str:
    return f"{int(n) / 2**20:.0f} MiB" if isinstance(n, int) else "?"


def _waiting(out: Out) -> Any:
    def on_wait(owner: fsutil.Owner) -> None:
        out.warn(f"another envbuilder (pid {owner.pid} on {owner.host}) is writing backups here; waiting")

    return on_wait


def _env_waiting(out: Out, name: str) -> Any:
    def on_wait(owner: fsutil.Owner) -> None:
        out.warn(f"another envbuilder (pid {owner.pid} on {owner.host}) is changing {name}; waiting")

    return on_wait


def handle_backup(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    home = settings.home(os.environ)
    if args.all == bool(args.env):
        raise UsageError(
            "name one env, or pass --all", hint="envbuilder backup NAME | envbuilder backup --all"
        )
    quiet = args.json or args.quiet
    # --json keeps stdout for the JSON; the steps and their bytes stay on stderr (-q silences them).
    steps = progress.Steps(out.console, quiet=args.quiet, every=progress.every_from_env(os.environ))
    step = steps.start
    if args.portable or args.output:
        return _portable(args, out, steps, home)  # a file of its own, not in a backup root
    root = Path(args.to).expanduser().resolve() if args.to else settings.backup_root(os.environ)[0]

    strictmodes.backup_root(root, os.environ)
    mutex = backup.writer_mutex(root, args.wait, _waiting(out))
    with proc.sigterm_as_interrupt(), mutex, steps, steps.watching([root]):
        if not args.all:
            # The env's own mutex too: remove, restore and pack of this env wait for the backup (or it for them).
            with state.mutex(home, args.env, timeout=args.wait, on_wait=_env_waiting(out, args.env)):
                record = state.load(home, args.env)
                mode = args.mode or backup.default_mode(record)
                if not quiet:
                    out.heading(f"Backing up {record.name} ({mode}) to {root}")
                check = _room(args, out, settings.BACKUP_WAY_OUT, record.recipe, str(root))
                result = backup.make(record, root, mode, args.format, step, preflight=check)
            steps.stop()
            if not quiet:
                _render_one(result, out)
            return result.to_json()
        records = []
        for name in state.names(home):
            try:
                records.append(state.load(home, name))
            except EnvbuilderError as exc:
                out.warn(f"{name}: {exc.message}")
        check = _room(args, out, settings.BACKUP_WAY_OUT, None, str(root))
        done, failed = backup.make_all(records, root, args.mode, step, home=home, preflight=check)
    if not quiet:
        for r in done:
            _render_one(r, out)
        for name, problem in failed:
            out.error(f"{name}: {problem.message}", problem.hint)
    data = {"backups": [r.to_json() for r in done], "failed": {n: e.to_json() for n, e in failed}}
    if failed:
        names = ", ".join(n for n, _ in failed)
        err = BackupError(f"{len(failed)} of {len(records)} env(s) could not be backed up: {names}")
        err.data = data
        raise err
    return data


def _portable(args: argparse.Namespace, out: Out, steps: progress.Steps, home: Path) -> dict[str, Any]:
    """``backup ENV --portable``: one tar with an unpack.sh, written where --output says (not in a backup root)."""
    wrong = [flag for flag, given in (("--all", args.all), ("--to", args.to), ("--mode", args.mode)) if given]
    if args.format != "tar":
        wrong.append("--format")
    if not args.portable:
        raise UsageError(
            "--output names a portable archive", hint=f"envbuilder backup {args.env} --portable -o FILE"
        )
    if wrong or not args.env:
        raise UsageError(
            f"--portable packs one env into one file; it takes no {', '.join(wrong) or '--all'}",
            hint="envbuilder backup NAME --portable [-o FILE]",
        )
    with (
        proc.sigterm_as_interrupt(),
        steps,
        state.mutex(home, args.env, timeout=args.wait, on_wait=_env_waiting(out, args.env)),
    ):
        record = state.load(home, args.env)
        dest = Path(args.output).expanduser() if args.output else portable.default_path(record, Path.cwd())
        if not (args.json or args.quiet):
            out.heading(f"Packing {record.name} into a portable archive, {dest}")
        with fsutil.disk_errors((dest.absolute().parent, "write it elsewhere with -o FILE")):
            made = portable.make(record, dest.absolute(), steps.start)
    if not (args.json or args.quiet):
        m = made.manifest
        out.result.line(
            f"wrote {made.path} ({_mib(m['payload']['size'])}, {m['payload']['compression']}): "
            f"{len(m['rewrite'])} file(s) will be rewritten to the new prefix"
        )
        if m["left"]:
            out.warn(
                f"{len(m['left'])} file(s) name {m['prefix']} in binary form and stay as they are, "
                f"e.g. {m['left'][0]}"
            )
        out.result.field(
            "unpack", f"mkdir DIR && tar -xf {made.path.name} -C DIR && sh DIR/unpack.sh NEW_PREFIX"
        )
    return made.to_json()


def _render_one(result: backup.BackupResult, out: Out) -> None:
    s = result.backup.summary()
    shared = (s["bytes"] or 0) - (s["new_bytes"] or 0)
    out.result.line(
        f"backed up {s['env']} as {s['id']} ({s['mode']}): {_mib(s['bytes'])}, of which {_mib(s['new_bytes'])} "
        f"new and {_mib(shared)} shared with earlier backups"
    )
    for note in result.notes:
        out.result.line(f"    {note}")
    out.result.field("restore", f"envbuilder restore {s['env']}")


def _room(
    args: argparse.Namespace, out: Out, way_out: str, recipe: Optional[str], target: str
) -> Optional[Callable[[Sequence[Need]], object]]:
    """Pre-flight for what this verb writes (None under --no-preflight): the limits the env's recipe states for
    the file system written to, where that recipe still loads."""
    env = dict(os.environ)
    if space.skipped(args.no_preflight, env, out.warn):
        return None
    limits: space.Limits = space.no_limits
    elsewhere: list[str] = []
    if recipe:
        try:
            loaded = loader.load(recipe, Catalog.from_env(env))
        except EnvbuilderError:
            loaded = None  # a recipe moved or gone: free space and inodes are still checked
        if loaded is not None:
            limits = estimate.limits(loaded, env)
            elsewhere = estimate.elsewhere(loaded, env, target)

    def check(needs: Sequence[Need]) -> object:
        return space.check(needs, env=env, warn=out.warn, way_out=way_out, limits=limits, elsewhere=elsewhere)

    return check


def handle_backups(args: argparse.Namespace, out: Out) -> list[dict[str, Any]]:
    root, _ = _root(args.source)
    found, skipped = backup.listing(root, args.env)
    for why in skipped:
        out.warn(why)
    rows = [b.summary() for b in found]
    if not args.json:
        if not rows:
            out.line(f"no backups in {root}" + (f" for {args.env}" if args.env else ""))
            return rows
        out.result.show(plain(str(root), "bold"))
        out.result.table(_BACKUP_COLUMNS, [_backup_row(r) for r in rows])
    return rows


#: The ID is what `restore --backup` and `verify-backup` take; how much of it was new, the JSON has too.
_BACKUP_COLUMNS = (
    Column("id"),
    Column("mode"),
    Column("size"),
    Column("new", optional=True),
    Column("created", optional=True),
    Column("verified", text=True),
)


def _backup_row(r: dict[str, Any]) -> list[Cell]:
    v = r["verified"]
    verified = (f"ok {v['time']}" if v["ok"] else "FAILED") if v else "at write"
    if r["error"]:
        verified = f"BROKEN: {r['error']}"
    return [r["id"], r["mode"], _mib(r["bytes"]), _mib(r["new_bytes"]), str(r["created"]), verified]


def handle_verify(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    root, from_id = _root(args.source)
    b = backup.find(root, from_id or args.backup)
    problems = backup.verify(b)
    data = {"id": b.id, "ok": not problems, "problems": problems}
    if problems:
        err = BackupError(
            f"{b.id} failed verification: " + "; ".join(problems[:3]),
            hint=f"it cannot be restored; back the env up again (envbuilder backup {b.env}) if it still exists",
        )
        err.data = data
        raise err
    if not args.json:
        count = len(b.data.get("wheels", ())) or 1
        out.result.line(f"{b.id} is intact ({count} file(s) re-hashed, {_mib(b.data.get('bytes'))})")
    return data


def handle_prune(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    root, _ = _root(args.source)
    strictmodes.backup_root(root, os.environ)
    with backup.writer_mutex(root, args.wait, _waiting(out)):
        result = backup.prune(root, args.keep, args.env, args.dry_run)
    for why in result.left:
        out.warn(why)
    if not args.json:
        verb = "would remove" if args.dry_run else "removed"
        out.result.line(
            f"{verb} {len(result.removed)} backup(s) and {result.blobs} stored wheel(s); "
            f"{_mib(result.freed)} freed"
        )
        for bid in result.removed:
            out.result.line(f"    {bid}")
    return result.to_json()


def handle_restore(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    root, from_id = _root(args.source)
    b = backup.find(root, args.env, args.backup or (from_id.split("@", 1)[1] if from_id else None))
    quiet = args.json or args.quiet
    # As for backup: the steps stay on stderr under --json.
    steps = progress.Steps(out.console, quiet=args.quiet, every=progress.every_from_env(env))
    if not quiet:
        out.heading(f"Restoring {b.id} ({b.mode}, created {b.data.get('created')})")
    final = Path(args.prefix or b.data["prefix"]).expanduser().resolve()
    where = (final.parent, "restore elsewhere with --prefix DIR (and --name NAME)")
    check = _room(args, out, where[1], (b.data.get("record") or {}).get("recipe"), str(final))
    if check is not None:
        fig = estimate.of_backup(b.data)
        check([Need(str(final.parent), f"the restored env {final}", fig.bytes, fig.files, fig.source)])
    # An env that --force replaces is removed after the swap, while the smoke check runs: joined here.
    with (
        proc.sigterm_as_interrupt(),
        transaction.Later() as later,
        steps,
        steps.watching([transaction.partial_of(final)]),
        fsutil.disk_errors(where),
    ):
        opts = restorer.RestoreOptions(
            prefix=args.prefix,
            name=args.name,
            force=args.force,
            # With --validate the ranks import torch: no separate import before them.
            smoke_check=not (args.no_validate or args.validate),
            later=later,
            wait=args.wait,
            node=None if args.check_import or args.no_validate or args.validate else host.probe(env),
        )
        result = restorer.restore(b, env, modules.detect(env), opts, steps.start, sized=steps.sized)
    data = result.to_json()
    rec = result.record
    if rec.image:
        rec = _repack(rec, settings.home(env), out)
        data["image"] = rec.image.get("path")
    if not quiet:
        for note in result.notes:
            out.line(f"    {note}")
        out.result.line(f"{result.status} {rec.name} at {rec.prefix} from {b.id}")
        reloc = result.relocation
        if reloc:
            out.result.field("relocated", f"{len(reloc['rewritten'])} file(s) rewritten to the new prefix")
            if reloc["left"]:
                out.warn(
                    f"{len(reloc['left'])} file(s) still name {b.data.get('prefix')} and were not changed, "
                    f"e.g. {reloc['left'][0]}"
                )
        smoke = (rec.validation or {}).get("checks", {}).get("import")
        if result.import_proven:
            out.result.field("import check", result.import_proven)
        elif smoke:
            out.result.field("smoke check", f"torch {smoke.get('torch')} imports: {smoke.get('status')}")
        out.result.field("activate", f"source {rec.prefix}/bin/activate")
    failed = [k for k, v in ((rec.validation or {}).get("checks") or {}).items() if v.get("status") == "fail"]
    if failed:
        raise ValidationFailed(f"{rec.name} was restored, but its smoke check failed: {', '.join(failed)}")
    if args.validate:
        recipe = loader.load(rec.recipe, Catalog.from_env(env))
        report = session.execute(
            rec, recipe, host.probe(), env, validator.Options(), out=out, quiet=quiet, home=settings.home(env)
        )
        data["validation"] = session.finish(report)
    return data


def _repack(rec: state.EnvRecord, home: Path, out: Out) -> state.EnvRecord:
    """A backup holds the env, not its image (it is made again from the env in seconds): the restored env's image
    is packed again, where the old one was (beside the env, or in its own directory)."""
    old = Path(rec.image["path"])
    beside = old.parent == Path(str(rec.origin.get("from_prefix", ""))).parent
    try:
        with state.mutex(home, rec.name):
            return image.pack(home, rec, None if beside else old.parent)
    except EnvbuilderError as exc:
        out.warn(f"the restored env's image was not made again: {exc.message} (envbuilder pack {rec.name})")
        return rec


def handle_touch(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    home = settings.home(os.environ)
    record = state.load(home, args.env)
    with state.mutex(home, record.name):
        count = purge.touch(record)
        # The record's sample of least recently read files holds the times from before: measured again.
        state.save(home, replace(record, files=envwalk.measure(Path(record.prefix), purged=True)))
    if not args.json:
        out.result.line(f"refreshed the access time of {count} file(s) in {record.prefix}")
    return {"name": record.name, "files": count}
