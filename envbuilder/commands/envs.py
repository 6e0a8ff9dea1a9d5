"""`envbuilder list|show|remove|activate|modulefile`: the envs this user has built (their records)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

from envbuilder import backup
from envbuilder.backends import activation
from envbuilder.backends import container as container_backend
from envbuilder.core import kinds, settings
from envbuilder.core.errors import EnvbuilderError, EnvNotFound, StateError, UnsafePath, UsageError
from envbuilder.plan import container
from envbuilder.plan.activation import Activation
from envbuilder.recipe.catalog import Catalog
from envbuilder.render import modulefile
from envbuilder.scale import image
from envbuilder.system import fsutil, purge, removal, state, strictmodes, transaction
from envbuilder.system.console import Cell, Out
from envbuilder.system.tables import Column


def _home() -> Path:
    return settings.home(os.environ)


def _summary(record: state.EnvRecord, latest: Optional[backup.Backup]) -> dict[str, Any]:
    health = state.health(record)
    purged = purge.status(record)
    return {
        "name": record.name,
        "recipe": record.recipe,
        "prefix": record.prefix,
        "created": record.created,
        "torch": record.torch,
        "installer": record.tools.get("installer"),
        "health": health.to_json(),
        "purge": purged.to_json() if purged else None,
        "backup": latest.id if latest else None,
        "image": image.freshness(record).to_json(),
        "advice": backup.advice(record, health.status, latest is not None),
    }


def _purge_text(purged: Optional[dict[str, Any]]) -> str:
    if not purged:
        return "-"
    left = purged["days_left"]
    if left is None:
        return "-"
    return f"{left:.0f} d" if left >= 1 else "due now"


def handle_list(args: argparse.Namespace, out: Out) -> list[dict[str, Any]]:
    home = _home()
    latest = {b.env: b for b in backup.backups(settings.backup_root(os.environ)[0]) if not b.error}
    rows = []
    for name in state.names(home):
        try:
            rows.append(_summary(state.load(home, name), latest.get(name)))
        except StateError as exc:
            rows.append({"name": name, "error": exc.message})
    if not args.json:
        if not rows:
            out.line(f"no envs recorded in {home} (envbuilder create NAME builds one)")
            return rows
        out.result.table(_LIST_COLUMNS, [_list_row(row) for row in rows])
        for row in rows:
            if row.get("advice"):
                out.line(f"{row['name']}: {row['advice']}")
            if row.get("image", {}).get("status") in ("stale", "missing"):
                out.line(f"{row['name']}: image {row['image']['detail']} (envbuilder pack {row['name']})")
    return rows


#: The name and the prefix are what a user types next; when and where its backup is, `backups NAME` shows too.
_LIST_COLUMNS = (
    Column("name"),
    Column("health"),
    Column("purge in", optional=True),
    Column("backup", optional=True),
    Column("torch"),
    Column("prefix"),
)


def _list_row(row: dict[str, Any]) -> list[Cell]:
    stamp = row["backup"].split("@", 1)[1] if row.get("backup") else "none"
    return [
        row["name"],
        row.get("health", {}).get("status", "unreadable"),
        _purge_text(row.get("purge")),
        stamp,
        row.get("torch") or "-",
        row.get("prefix") or row.get("error", ""),
    ]


def _load_built(name: str) -> state.EnvRecord:
    """The env's record; where there is none but a recipe of that name exists, the error says to build it."""
    try:
        return state.load(_home(), name)
    except EnvNotFound as exc:
        if not _is_recipe(name):
            raise
        raise EnvNotFound(
            f"{exc.message}: recipe {name} has not been built yet",
            hint=f"envbuilder create {name} (`envbuilder list` shows the envs you have)",
        ) from None


def _is_recipe(name: str) -> bool:
    """Whether a recipe of that name is on the recipe path (a path that cannot be read says no: the error at
    hand is the missing env)."""
    try:
        return name in Catalog.from_env(os.environ, warn=lambda _: None).names()
    except EnvbuilderError:
        return False


def handle_share(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    """A copy of the env's record in the site's directory, readable by all (the user's consent to ``impact``)."""
    record = _load_built(args.env)
    with fsutil.disk_errors():
        path = state.share(record, Path(args.to))
    if not args.json:
        out.result.line(
            f"shared {record.name}'s record as {path} (readable by all; remove it to stop sharing)"
        )
    return {"env": record.name, "path": str(path)}


def handle_show(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    record = _load_built(args.env)
    data = record.to_json()
    data["health"] = state.health(record).to_json()
    fresh = image.freshness(record)
    data["image_status"] = fresh.to_json()
    plan = record.plan or {}
    act = Activation.of_record(record.plan) or Activation()
    data["activation"] = {
        "loads": list(act.modules),
        "said": act.modules_said(plan.get("modules") or (), plan.get("build_modules") or ()),
    }
    if record.kind == "container":
        data["container"] = _container_facts(record)
    if not args.json:
        out.result.heading(f"{record.name} (recipe {record.recipe})")
        out.result.field("prefix", record.prefix)
        out.result.field("health", f"{data['health']['status']}: {data['health']['detail']}")
        out.result.field("created", record.created)
        out.result.field(
            "tools", ", ".join(f"{k} {v}" for k, v in record.tools.items() if k != "python_path")
        )
        in_env = [p for p in record.packages if p.get("in_env")]
        out.result.field("packages", ", ".join(f"{p['name']}=={p['version']}" for p in in_env))
        if (plan.get("python") or {}).get("where"):
            out.result.field("python from", plan["python"]["where"])
        if plan.get("modules"):
            out.result.field("built with", " ".join(plan["modules"]))
        if act.modules or plan.get("modules") or plan.get("build_modules"):
            out.result.field("activation", data["activation"]["said"])
        if record.validation:
            checks = record.validation.get("checks", {})
            out.result.field("last check", ", ".join(f"{k}: {v.get('status')}" for k, v in checks.items()))
        if record.kind == "container":
            _show_container(data["container"], out)
            out.result.field(
                "enter", f'eval "$(envbuilder activate {record.name})"; {record.name} COMMAND...'
            )
        else:  # a container env has no bin/activate: `activate` prints the function that enters its image
            out.result.field("activate", _activate_field(record))
        if fresh.status != "none":
            out.result.field("image", f"{fresh.status}: {fresh.detail}")
    return data


def _container_facts(record: state.EnvRecord) -> dict[str, Any]:
    """A container env's image as its record has it: the file, its sha256 and registry digest, the runtime, the
    binds, and the torch inside."""
    tools, box = record.tools, (record.plan or {}).get("container") or {}
    return {
        "image": tools.get("image") or box.get("image"),
        "file": str(
            Path(record.prefix) / Path(str(tools.get("image_file") or box.get("file") or "image.sif")).name
        ),
        "sha256": tools.get("image_sha256"),
        "digest": tools.get("image_digest") or None,
        "runtime": tools.get("runtime") or box.get("runtime"),
        "binds": list(box.get("binds") or ()),
        "gpu": box.get("gpu"),
        "torch": record.torch,
        "cuda": tools.get("cuda") or None,
        "python": tools.get("python") or None,
        "os": tools.get("image_os") or None,
        "glibc": tools.get("image_glibc") or None,
    }


def _show_container(box: dict[str, Any], out: Out) -> None:
    out.result.field("image", f"{box['image']} ({box['file']})")
    out.result.field("sha256", box["sha256"] or "not recorded")
    out.result.field("digest", box["digest"] or "none (not from a registry, or not read)")
    out.result.field("runtime", f"{box['runtime']}{' --nv' if box['gpu'] else ''}")
    out.result.field("binds", ", ".join(box["binds"]) or "none")
    inside = [
        f"torch {box['torch'] or '?'}",
        f"CUDA {box['cuda'] or 'none'}",
        f"Python {box['python'] or '?'}",
        f"on {box['os'] or 'an unknown system'} (glibc {box['glibc'] or '?'})",
    ]
    out.result.field("inside", ", ".join(inside))


def _activate_field(record: state.EnvRecord) -> str:
    """The line to source, or (where the env is not safe to source) why not: show still shows the rest."""
    try:
        return activation.activate_line(record.prefix)
    except UnsafePath as exc:
        return f"refused: {exc.message}"


def handle_activate(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    record = _load_built(args.env)
    shell = args.shell or activation.default_shell(os.environ)
    if args.image:
        return _activate_image(record, shell, out, args.json)
    if kinds.kind_info(record.kind).container:
        line = activation.container_line(record.name, record.prefix, record.plan, record.tools, shell)
        if not args.json:
            out.line(
                f"{record.name} ARGS... runs ARGS inside its image (give it a shell's name to open one there)"
            )
            print(line)
        return {"name": record.name, "command": line}
    line = activation.activate_line(record.prefix, shell)
    if not args.json:
        print(line)
    return {"name": record.name, "command": line}


def _activate_image(record: state.EnvRecord, shell: str, out: Out, as_json: bool) -> dict[str, Any]:
    """Mount (or unpack) the env's image on this node; the line activates that copy."""
    used = image.use(record, os.environ)
    if used.cleaned:
        out.line(
            f"unmounted a dead mount of {record.name}'s image (its squashfuse was gone) before mounting it again"
        )
    line = image.activate_line(used, shell)
    if not as_json:
        if not image.line_has_comment(shell):  # its line carries no comment saying how the image is used
            out.line(image.described(used))
        print(line)
    return {"name": record.name, "command": line, "image": used.to_json()}


def handle_remove(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    home = _home()
    record = state.load(home, args.env)
    prefix = Path(record.prefix)
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"remove {record.name} ({prefix}) needs confirmation", hint="pass --yes")
        asked = (
            f"drop the record of {record.name} ({prefix} stays)"
            if _not_its_env(record)
            else f"remove {record.name} and delete {prefix}"
        )
        answer = input(f"{asked}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            # Declining is an answer, not an error.
            if not args.json:
                out.result.line(f"kept {record.name} ({prefix})")
            return {"name": record.name, "prefix": str(prefix), "removed": False}
    # The mutex backup, restore and pack of this env hold too: a remove never pulls the env from under them.
    with state.mutex(home, record.name):
        _unchanged_since_asked(home, record)
        left = _not_its_env(record)
        if left is None and prefix.is_dir():
            # An interrupted remove never leaves half an env under the env's own name (the next create or
            # restore there removes the rest); the record goes only once the env has.
            transaction.discard(prefix)
        state.record_path(home, record.name).unlink()
        cache = _drop_runtime_cache(record) if left is None else None
    if left is not None:
        out.warn(f"left {prefix} in place: {left}; only the record of {record.name} was removed")
    if not args.json:
        out.result.line(
            f"removed the record of {record.name}; {prefix} is left"
            if left
            else f"removed {record.name} ({prefix})"
        )
    if cache is not None and not args.json:
        out.result.line(cache)
    return {
        "name": record.name,
        "prefix": str(prefix),
        "removed": True,
        "prefix_left": left,
        "runtime_cache": cache,
    }


def _drop_runtime_cache(record: state.EnvRecord) -> Optional[str]:
    """A removed container env's runtime cache beside it (create made it), removed unless another env uses it;
    what was done, in words (None for other kinds and where there was none)."""
    if not kinds.kind_info(record.kind).container:
        return None
    runtime = str(
        record.tools.get("runtime") or ((record.plan or {}).get("container") or {}).get("runtime") or ""
    )
    work = container_backend.work_dir(Path(record.prefix).parent, runtime)
    if not runtime or (not work.exists() and not work.is_symlink()):
        return None
    kept = container_backend.drop_work_dir(Path(record.prefix), runtime)
    return f"removed {runtime}'s cache {work}" if kept is None else f"kept {runtime}'s cache {work}: {kept}"


def _unchanged_since_asked(home: Path, record: state.EnvRecord) -> None:
    """The record read before the question (and before the mutex) must still be the env's: a create --force or
    restore that moved it meanwhile would otherwise lose its record to a remove the user agreed to for the old."""
    try:
        now = state.load(home, record.name)
    except EnvNotFound:
        raise StateError(f"{record.name} was removed by another envbuilder meanwhile") from None
    if now.prefix != record.prefix:
        raise StateError(
            f"{record.name} moved from {record.prefix} to {now.prefix} while remove waited; nothing was removed",
            hint=f"envbuilder remove {record.name} again, if you still want it gone",
        )


def _not_its_env(record: state.EnvRecord) -> Optional[str]:
    """Why the record's prefix is not its env (then only the record goes); None when it is, or is gone."""
    if not os.path.lexists(record.prefix):
        return None
    source = str(record.origin.get("backup") or "")
    origin = (source.split("@", 1)[0], str(record.origin.get("from_prefix"))) if "@" in source else None
    return removal.env_problem(Path(record.prefix), record.name, origin)


def _is_dir_target(output: str, fmt: str) -> bool:
    """Whether ``-o OUTPUT`` names the directory to write NAME.lua (or NAME) into, made if absent: an existing
    directory, a path ending in ``/``, or for Lua a name without ``.lua`` (Lmod reads Lua only from ``.lua``
    files). Anything else is the file itself; a Tcl modulefile's name has no fixed suffix."""
    if output.endswith(("/", os.sep)) or Path(output).is_dir():
        return True
    return fmt == "lua" and not output.endswith(".lua")


def handle_modulefile(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    record = state.load(_home(), args.env)
    # `module load` puts the env's bin first on PATH: no one else may be able to write there.
    strictmodes.env_scripts(Path(record.prefix), ["bin"])
    activate = Activation.of_record(record.plan) or Activation()
    entry: tuple[str, ...] = ()
    if kinds.kind_info(record.kind).container:  # `module load` defines a function that enters the image
        entry = container.entry_argv((record.plan or {}).get("container") or {}, record.prefix, record.tools)
    text = modulefile.render(
        name=record.name,
        prefix=record.prefix,
        recipe=record.recipe,
        activate=activate,
        constraints=activation.has_constraints(Path(record.prefix)),
        fmt=args.format,
        entry=entry,
    )
    note = modulefile.conda_step_note(activate)
    if note:
        out.warn(note.removeprefix("envbuilder: "))
    written = None
    if args.output:
        target = Path(args.output)
        if _is_dir_target(args.output, args.format):
            # Lmod reads NAME.lua; Environment Modules takes a modulefile's name as it is.
            target = target / (f"{record.name}.lua" if args.format == "lua" else record.name)
        with fsutil.disk_errors((target.parent, "write it elsewhere with -o PATH")):
            fsutil.write_atomic(target, text.encode())
        written = str(target.resolve())  # the file itself, wherever -o was relative to or a directory
        if not args.json:
            loaded = target.name[: -len(".lua")] if target.name.endswith(".lua") else target.name
            out.result.line(f"wrote {target}; `module use {target.parent}` then `module load {loaded}`")
    elif not args.json:
        sys.stdout.write(text)
    return {
        "name": record.name,
        "path": written,
        "format": args.format,
        "modulefile": text,
        "warnings": [note] if note else [],
    }
