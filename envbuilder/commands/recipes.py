"""`envbuilder recipes list|show|schema`."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional

from envbuilder import plan as planner
from envbuilder.core.errors import PublishError, RecipeError
from envbuilder.recipe import loader, schemajson
from envbuilder.recipe.catalog import Catalog, Entry, find_lock
from envbuilder.resolver import knowledge
from envbuilder.resolver.matrix import load_matrix, table_age
from envbuilder.system.console import Cell, Out, plain
from envbuilder.system.tables import Column


def list_recipes(catalog: Catalog) -> list[dict[str, Any]]:
    rows = []
    for name in catalog.names():
        entry = catalog.entries[name]
        row: dict[str, Any] = {
            "name": name,
            "file": entry.display(),
            "layer": entry.layer.label,
            "overrides": [str(p) for p in entry.shadows],
        }
        try:
            recipe = loader.load(name, catalog)
        except (RecipeError, PublishError) as exc:
            row.update(error=exc.message)
            rows.append(row)
            continue
        row.update(
            site=recipe.site.name,
            status=recipe.site.status,
            example=recipe.recipe.example,
            kind=recipe.env.kind,
            torch=recipe.torch.version if recipe.torch.install else "from site",
            variant=recipe.torch.variant if recipe.torch.install else None,
            version=entry.version or recipe.recipe.version,
            published=_published(entry),
            description=recipe.recipe.description,
        )
        rows.append(row)
    return rows


def _published(entry: Entry) -> Optional[dict[str, Any]]:
    """A published recipe's entry for users, once loaded: its signer is the one the signature check found."""
    if entry.published is None or entry.layer.registry is None:
        return None
    return entry.layer.registry.describe(entry.published)


def handle_list(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    catalog = Catalog.from_env()
    rows = list_recipes(catalog)
    if not args.json:
        out.result.table(_LIST_COLUMNS, [_list_row(row) for row in rows])
        for row in rows:
            if "error" in row:
                out.warn(f"{row['name']}: {row['error']}")
    return {
        "recipes": rows,
        "search_path": [{"label": la.label, "root": str(la.root)} for la in catalog.layers],
    }


#: "from" is "builtin" or the ENVBUILDER_RECIPE_PATH entry: the first to go where 80 columns are all there is.
_LIST_COLUMNS = (
    *(Column(c) for c in ("name", "version", "site", "status", "kind", "torch")),
    Column("from", optional=True),
)


def _list_row(row: dict[str, Any]) -> list[Cell]:
    if "error" in row:
        return [row["name"], "", "", plain("broken", "red"), "", "", row["layer"]]
    torch = row["torch"] + (f" {row['variant']}" if row.get("variant") else "")
    return [
        row["name"],
        row["version"] or "-",
        row["site"] or "-",
        row["status"] + (" example" if row.get("example") else ""),
        row["kind"],
        torch,
        row["layer"],
    ]


def handle_show(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    catalog = Catalog.from_env()
    recipe = loader.load(args.recipe, catalog)
    entry = catalog.lookup(args.recipe)
    published = _published(entry)
    lock = find_lock(recipe, catalog, os.environ)
    leaves = recipe.leaves()
    if not args.json:
        out.result.heading(f"{recipe.name}: {' <- '.join(recipe.chain)}")
        if lock is not None:
            arches = ", ".join(f"{p.arch} ({len(p.packages)} packages)" for p in lock.platforms)
            out.result.line(f"  lock: {lock.path} ({lock.origin}), made {lock.created}: {arches}")
        if entry.published is not None:
            p = entry.published
            signer = published["signer"] if published else None
            out.result.line(
                f"  published {recipe.name}@{p.version} in {entry.layer.root} on {p.published} by {p.by}; "
                + (f"signed by {signer}" if signer else "unsigned")
            )
            if p.validations:
                last = p.validations[-1]
                figures = ", ".join(f"{k} {v}" for k, v in (last.get("figures") or {}).items())
                out.result.line(
                    f"  last validated {last.get('date')} on {last.get('partition') or last.get('host')}: "
                    f"{last.get('status')}" + (f" ({figures})" if figures else "")
                )
            else:
                out.result.line("  not yet validated (envbuilder validate ENV --publish-report)")
        width = max(len(k) for k, _, _ in leaves)
        for key, value, source in leaves:
            shown = json.dumps(value)
            if args.explain:
                out.result.line(f"  {key.ljust(width)} = {shown}    # {source}")
            else:
                out.result.line(f"  {key.ljust(width)} = {shown}")
    facts = _torch_facts(recipe, args) if args.explain else None
    if facts and not args.json:
        out.result.line()
        out.result.heading("Where the torch facts come from")
        for line in facts:
            out.result.line(f"  - {line}")
    return {
        "name": recipe.name,
        "version": recipe.version or None,
        "published": published,
        "lock": lock.summary().to_json() if lock else None,
        "files": list(recipe.chain),
        "values": recipe.data,
        "sources": {k: s for k, _, s in leaves} if args.explain else None,
        "torch_facts": facts,
    }


def _torch_facts(recipe: loader.Recipe, args: argparse.Namespace) -> Optional[list[str]]:
    """Which torch facts the resolver would take from the index (and when it was read), which from the table."""
    request = planner.torch_request(recipe)
    if request is None:
        return None
    from envbuilder.resolver import indexread  # noqa: PLC0415 - urllib and threads only when an index is read

    index = indexread.read_torch(request, os.environ, refresh=args.refresh, offline=args.offline)
    know = knowledge.merge(load_matrix(), index, request.channel, table_age())
    return [*know.lines, *know.warnings]


def handle_schema(args: argparse.Namespace, out: Out) -> None:
    print(json.dumps(schemajson.json_schema(), indent=2))
