"""`envbuilder publish`, `recipes diff`, `recipes update`: site admins publish; users see what changed."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from envbuilder import lockfile
from envbuilder import plan as planner
from envbuilder.core import settings
from envbuilder.core.errors import EnvbuilderError, LockError, PublishError
from envbuilder.core.facts import HostFacts
from envbuilder.recipe import loader, publish, registry
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import Recipe
from envbuilder.system import fsutil, host, state
from envbuilder.system.console import Out


def _catalog_for(refs: list[str]) -> tuple[Catalog, list[str]]:
    """The user's catalog, plus the directories of recipes named by file path (``path/to/name.toml``)."""
    base = Catalog.from_env()
    extra: list[Layer] = []
    names = []
    for ref in refs:
        if ref.endswith(".toml"):
            path = Path(ref).expanduser().resolve()
            if not path.is_file():
                raise PublishError(f"{ref}: no such recipe file")
            extra.append(Layer(str(path.parent), path.parent))
            names.append(path.stem)
        else:
            names.append(ref)
    if not extra:
        return base, names
    seen = {la.root for la in extra}
    return Catalog([*base.layers, *(Layer(str(r), r) for r in sorted(seen))]), names


#: The way out when the registry's file system says no (read-only, full, over quota).
REGISTRY_WAY_OUT = "publish to a registry you can write, with --registry DIR"


def handle_publish(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    reg = registry.Registry(Path(args.registry).expanduser())
    with fsutil.disk_errors((reg.root, REGISTRY_WAY_OUT)):
        return _publish(args, out, reg)


def _publish(args: argparse.Namespace, out: Out, reg: registry.Registry) -> dict[str, Any]:
    catalog, names = _catalog_for(args.recipes)
    key = Path(args.sign_key).expanduser() if args.sign_key else None
    if args.allowed_signers or args.require_signatures:
        signers = Path(args.allowed_signers).expanduser() if args.allowed_signers else None
        if publish.configure(reg, signers, args.require_signatures) and not args.json:
            out.warn(
                f"the allowed signers of {reg.root} changed: users who used this registry before refuse it "
                "until they accept the new signers (README: Threat model)"
            )
    facts = host.load_facts_file(args.facts) if args.facts else None
    locks = _locks(args.lock, names)
    # Everything is checked before anything is written: a broken recipe in the set publishes none of it.
    checked: list[tuple[Recipe, dict[str, Any]]] = []
    for name in names:
        recipe = loader.load(name, catalog)
        # The resolver's gates against the site's own compute facts (the recipe's [compute]), whatever this
        # host is; then, with --facts, a full plan against those facts.
        targets = [(HostFacts(source="the site's compute facts"), "its site's compute facts")]
        if facts is not None:
            targets.append((facts, f"the facts in {args.facts}"))
        for target, what in targets:
            try:
                planner.build(recipe, target, dict(os.environ))
            except EnvbuilderError as exc:
                raise PublishError(
                    f"{name} does not plan on {what}: {exc.message}",
                    hint=exc.hint
                    or "fix the recipe, or publish against the facts of the partition it targets",
                ) from None
        lock = locks.get(recipe.name)
        if lock is not None and lock.recipe_sha256 != lockfile.recipe_sha256(recipe.data):
            raise PublishError(
                f"{lock.path} was made from another version of {recipe.name} than the one being published",
                hint=f"regenerate it: envbuilder lock {recipe.name} --platform ... -o {lock.path}",
            )
        doc = publish.flatten_for_publish(recipe.data)
        doc["schema_version"] = 1
        checked.append((recipe, doc))
    results = []
    for recipe, doc in checked:
        pub, status, changed = publish.publish(
            reg, recipe.name, doc, key, wait=args.wait, lock=locks.get(recipe.name)
        )
        results.append(
            {
                "name": recipe.name,
                "version": pub.version,
                "status": status,
                "changed": changed,
                "sha256": pub.sha256,
                "signer": pub.signer,
                "file": str(reg.root / pub.file),
                "lock": str(reg.root / pub.lock_file) if pub.lock_file else None,
            }
        )
        if not args.json:
            if status == "unchanged":
                out.result.line(f"{recipe.name}@{pub.version}: unchanged (already published)")
            elif status == "lock added":
                out.result.line(f"{recipe.name}@{pub.version}: lock added ({pub.lock_file})")
            else:
                signed = f", signed by {pub.signer}" if pub.signer else ", unsigned"
                signed += ", with its lock" if pub.lock_file else ""
                what = (
                    f"; changed: {', '.join(changed[:6])}{' …' if len(changed) > 6 else ''}"
                    if changed
                    else ""
                )
                out.result.line(f"published {recipe.name}@{pub.version}{signed}{what}")
    return {"registry": str(reg.root), "recipes": results}


def _locks(files: list[str], names: list[str]) -> dict[str, lockfile.Lock]:
    """The ``--lock`` files by the recipe each was made from; each must belong to a recipe being published."""
    out: dict[str, lockfile.Lock] = {}
    for f in files:
        try:
            lock = lockfile.read(Path(f).expanduser(), "--lock")
        except LockError as exc:
            raise PublishError(exc.message, hint=exc.hint) from None
        if lock.format != "envbuilder":  # it holds one platform and none of the lock's provenance
            raise PublishError(
                f"{f} is a PEP 751 pylock file: a recipe is published with envbuilder's own lock",
                hint="envbuilder lock NAME -o NAME.lock.toml, then publish --lock NAME.lock.toml",
            )
        if lock.recipe not in names:
            raise PublishError(
                f"{f} locks {lock.recipe}, which is not among the recipes being published",
                hint=f"publish {lock.recipe} with it, or leave the lock out",
            )
        if lock.recipe in out:
            raise PublishError(f"two locks given for {lock.recipe}: {out[lock.recipe].path} and {f}")
        out[lock.recipe] = lock
    return out


def _published_doc(catalog: Catalog, name: str, version: str) -> dict[str, Any]:
    entry = catalog.lookup(f"{name}@{version}")
    if entry.published is None or entry.layer.registry is None:
        raise PublishError(f"{name} is not a published recipe")
    return entry.layer.registry.load(entry.published)


def handle_diff(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    catalog = Catalog.from_env()
    old = _published_doc(catalog, args.recipe, args.old)
    new = _published_doc(catalog, args.recipe, args.new)
    rows = [(k, a, b) for k, a, b in publish.diff(old, new) if k != "recipe.version"]
    if not args.json:
        out.result.heading(f"{args.recipe}: {args.old} -> {args.new}")
        if not rows:
            out.result.line("  no differences")
        for key, a, b in rows:
            if a is None:
                out.result.line(f"  + {key} = {json.dumps(b)}")
            elif b is None:
                out.result.line(f"  - {key} = {json.dumps(a)}")
            else:
                out.result.line(f"  ~ {key}: {json.dumps(a)} -> {json.dumps(b)}")
    return {
        "recipe": args.recipe,
        "old": args.old,
        "new": args.new,
        "changes": [{"key": k, "old": a, "new": b} for k, a, b in rows],
    }


def handle_update(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    """For every published recipe: its latest version, and the envs built from an older one."""
    catalog = Catalog.from_env()
    home = settings.home(os.environ)
    records = []
    for env_name in state.names(home):
        try:
            records.append(state.load(home, env_name))
        except EnvbuilderError:
            continue  # a broken record is `envbuilder list`'s to report
    rows = []
    for name in catalog.names():
        entry = catalog.entries[name]
        if entry.published is None:
            continue
        behind = []
        for rec in records:
            built = str((rec.plan or {}).get("recipe_version") or "")
            if rec.recipe == name and built and built != entry.version:
                behind.append({"env": rec.name, "built_from": built})
        rows.append(
            {"name": name, "latest": entry.version, "registry": str(entry.layer.root), "envs_behind": behind}
        )
        if not args.json:
            out.result.line(f"{name}: latest {entry.version} ({entry.layer.root})")
            for b in behind:
                out.result.line(
                    f"  {b['env']} was built from {name}@{b['built_from']}: "
                    f"envbuilder recipes diff {name} {b['built_from']} {entry.version}; "
                    f"envbuilder create {name} --force to rebuild"
                )
    if not rows and not args.json:
        out.line("no published recipes on the recipe path (see ENVBUILDER_RECIPE_PATH and the site config)")
    return {"recipes": rows}
