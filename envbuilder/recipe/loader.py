"""Load a recipe: follow its ``extends`` chain, validate each file strictly, merge, and remember where every value
came from (built-in defaults < site file < recipe chain < command line).

The merge rule, parent first: tables merge key by key and a child's value replaces its parent's, except lists,
which add up: a child's items follow its parent's, a string already there stays where it is, and a [[packages]]
entry (a validation reference) with a parent's name takes that entry's place. A file's ``replace = ["packages"]``
sets those lists in place of its parents' instead. A list that is one value (``scheduler.interactive``, an argv)
is replaced whole, and a file's lists always replace the built-in defaults. ``recipe.description`` belongs to the
file that says it: a child does not inherit its parent's.

Loading is pure: the files come as documents that the catalog has already read and, for a published recipe,
verified against its registry (see ``Documents``); here they are only checked, merged and traced."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional

from envbuilder.core import checks, containers, launchers
from envbuilder.core.errors import RecipeError, did_you_mean
from envbuilder.core.kinds import kind_info
from envbuilder.core.structs import dataclass
from envbuilder.recipe import schema, schemacheck, sections
from envbuilder.recipe.document import Document, Documents
from envbuilder.recipe.spec import ArrayOf, Field

DEFAULTS_SOURCE = "<defaults>"
#: Files one recipe may reach through ``extends`` (the shipped ones reach 3): no chain on the path grows without end.
MAX_EXTENDS = 16


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    chain: tuple[str, ...]  # display names of the files, child first
    data: Mapping[str, Any]
    provenance: Mapping[str, str]  # dotted key -> source
    #: Published recipes: the registry version loaded.
    version: str = ""

    # One typed view per table (``recipe.torch.version``); the defaults live in ``sections``.

    @cached_property
    def recipe(self) -> sections.About:
        return sections.view(sections.About, self.data.get("recipe", {}))

    @cached_property
    def corrections(self) -> tuple[sections.Correction, ...]:
        return tuple(sections.view(sections.Correction, c) for c in self.data.get("corrections", ()))

    @cached_property
    def site(self) -> sections.Site:
        return sections.view(sections.Site, self.data.get("site", {}))

    @cached_property
    def compute(self) -> sections.Compute:
        return sections.view(sections.Compute, self.data.get("compute", {}))

    @cached_property
    def scheduler(self) -> sections.Scheduler:
        return sections.view(sections.Scheduler, self.data.get("scheduler", {}))

    @cached_property
    def modules(self) -> sections.Modules:
        return sections.view(sections.Modules, self.data.get("modules", {}))

    @cached_property
    def filesystems(self) -> Mapping[str, sections.Filesystem]:
        return {k: sections.view(sections.Filesystem, v) for k, v in self.data.get("filesystems", {}).items()}

    @cached_property
    def env_profiles(self) -> Mapping[str, sections.Profile]:
        return {k: sections.view(sections.Profile, v) for k, v in self.data.get("env_profiles", {}).items()}

    @cached_property
    def launcher(self) -> sections.Launcher:
        return sections.view(sections.Launcher, self.data.get("launcher", {}))

    @cached_property
    def env(self) -> sections.Env:
        return sections.view(sections.Env, self.data.get("env", {}))

    @cached_property
    def container(self) -> sections.Container:
        return sections.view(sections.Container, self.data.get("container", {}))

    @cached_property
    def python(self) -> sections.Python:
        return sections.view(sections.Python, self.data.get("python", {}))

    @cached_property
    def conda(self) -> sections.Conda:
        return sections.view(sections.Conda, self.data.get("conda", {}))

    @cached_property
    def torch(self) -> sections.Torch:
        return sections.view(sections.Torch, self.data.get("torch", {}))

    @cached_property
    def packages(self) -> tuple[sections.Package, ...]:
        return tuple(sections.view(sections.Package, p) for p in self.data.get("packages", ()))

    @cached_property
    def activate(self) -> sections.Activate:
        return sections.view(sections.Activate, self.data.get("activate", {}))

    @cached_property
    def validation(self) -> sections.Validation:
        return sections.view(sections.Validation, self.data.get("validation", {}))

    def get(self, dotted: str) -> Any:
        """The raw value at a dotted key (None where it is unset), for generic readers (tests, tools); code reads
        the typed views."""
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def source_of(self, dotted: str) -> str:
        return self.provenance.get(dotted, DEFAULTS_SOURCE)

    def leaves(self) -> list[tuple[str, Any, str]]:
        out: list[tuple[str, Any, str]] = []
        _leaves(self.data, "", out, self.provenance)
        return out


def _leaves(node: Any, path: str, out: list[tuple[str, Any, str]], prov: Mapping[str, str]) -> None:
    if isinstance(node, Mapping) and node:
        for key in node:
            _leaves(node[key], f"{path}.{key}" if path else key, out, prov)
    elif isinstance(node, list) and node:
        # Each item on its own: under extends one list holds items of several files.
        whole = prov.get(path, DEFAULTS_SOURCE)
        out.extend((f"{path}[{i}]", item, prov.get(f"{path}[{i}]", whole)) for i, item in enumerate(node))
    else:
        out.append((path, node, prov.get(path, DEFAULTS_SOURCE)))


def load(name: str, catalog: Documents, overrides: Optional[Mapping[str, tuple[Any, str]]] = None) -> Recipe:
    """Load recipe ``name`` from the documents ``catalog`` supplies. ``overrides`` maps dotted keys to (value,
    source) applied last (CLI flags)."""
    top = catalog.recipe_document(name)
    schemacheck.validate(top.data, top.label)
    # A published recipe extends nothing: its verified bytes are the whole recipe.
    chain = [top] if top.published else _follow_chain(top, catalog)
    merged: dict[str, Any] = {}
    prov: dict[str, str] = {}
    _merge(merged, sections.seed(), _Source(DEFAULTS_SOURCE), prov, "")
    for doc in reversed(chain):
        body = {k: v for k, v in doc.data.items() if k not in ("schema_version", "extends", "replace")}
        if doc is not top:
            body = _without_description(body)
        _merge(merged, body, _Source(doc.label, frozenset(doc.data.get("replace", ()))), prov, "")
    for dotted, (value, source) in (overrides or {}).items():
        _set(merged, dotted, value)
        _forget(prov, dotted)
        prov[dotted] = source

    recipe_name = merged.get("recipe", {}).get("name")
    if recipe_name is None:
        raise RecipeError(
            "missing required key",
            file=top.label,
            key="recipe.name",
            hint=f"add name = {top.path.stem!r} to [recipe]",
        )
    if recipe_name != (top.name if top.published else top.path.stem):
        raise RecipeError(
            f"recipe.name {recipe_name!r} does not match the file name {top.path.name!r}",
            file=top.label,
            key="recipe.name",
            hint=f"rename the file to {recipe_name}.toml or set name = {top.path.stem!r}",
        )
    schemacheck.check_required(
        {**merged, "schema_version": schema.SCHEMA_VERSION}, lambda key: _table_source(prov, key, top.label)
    )
    _cross_checks(merged, prov, top.label)
    return Recipe(
        name=top.name,
        path=top.path,
        chain=tuple(doc.label for doc in chain),
        data=merged,
        provenance=prov,
        version=top.version,
    )


def _follow_chain(top: Document, catalog: Documents) -> list[Document]:
    """``top`` and the files its ``extends`` reach, child first; ``top`` is validated already."""
    chain = [top]
    while True:
        doc = chain[-1]
        parent = doc.data.get("extends")
        if parent is None:
            return chain
        if not parent.strip():
            raise RecipeError(
                "extends is empty",
                file=doc.label,
                key="extends",
                hint="name a parent file (site.toml) or remove the key",
            )
        if len(chain) >= MAX_EXTENDS:
            raise RecipeError(
                f"extends reaches more than {MAX_EXTENDS} files ({' -> '.join(d.label for d in chain[:3])} -> ...); "
                f"the limit is {MAX_EXTENDS}",
                file=doc.label,
                key="extends",
                hint="merge some of the files the chain runs through",
            )
        found = catalog.parent_document(doc, parent)
        if any(other.real == found.real for other in chain):
            loop = " -> ".join(other.real_label for other in [*chain, found])
            # Blame the file whose extends closes the loop.
            raise RecipeError(f"extends cycle: {loop}", file=doc.label, key="extends")
        schemacheck.validate(found.data, found.label)
        chain.append(found)


@dataclass(frozen=True)
class _Source:
    """One file merged over the recipe so far: its name for provenance, and the lists it replaces."""

    label: str
    replace: frozenset[str] = frozenset()


def _without_description(body: Mapping[str, Any]) -> dict[str, Any]:
    """A parent's values less its description, which says what the parent is, not what its child is."""
    about = {k: v for k, v in body.get("recipe", {}).items() if k != "description"}
    return {**body, "recipe": about} if "recipe" in body else dict(body)


def _merge(
    dst: dict[str, Any], src: Mapping[str, Any], source: _Source, prov: dict[str, str], path: str
) -> None:
    for key, value in src.items():
        dotted = f"{path}.{key}" if path else key
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            # Tables merge key by key (a variant adds a partition or a profile without restating the rest).
            _merge(dst[key], value, source, prov, dotted)
        elif isinstance(value, Mapping):
            dst[key] = {}
            _merge(dst[key], value, source, prov, dotted)
            if not value:
                prov[dotted] = source.label
        elif isinstance(value, list):
            dst[key] = _merge_list(dst.get(key), value, source, prov, dotted)
        else:
            dst[key] = value
            _forget(prov, dotted)
            prov[dotted] = source.label


def _merge_list(old: Any, new: list[Any], source: _Source, prov: dict[str, str], dotted: str) -> list[Any]:
    """``new`` after the inherited items of ``old`` (see the module's docstring); records each item's file."""
    spec = schema.spec_at(dotted)
    whole = isinstance(spec, Field) and spec.whole
    inherits = (
        isinstance(old, list)
        and prov.get(dotted, DEFAULTS_SOURCE) != DEFAULTS_SOURCE
        and dotted not in source.replace
        and not whole
    )
    items = (
        [(item, prov.get(f"{dotted}[{i}]", DEFAULTS_SOURCE)) for i, item in enumerate(old)]
        if inherits
        else []
    )
    key = spec.key if isinstance(spec, ArrayOf) else _same
    at = {key(item): i for i, (item, _) in enumerate(items)} if key else {}
    for item in new:
        i = at.get(key(item)) if key else None
        if i is None:
            items.append((item, source.label))
        else:
            items[i] = (item, source.label)  # the child restates or redefines it: its place stays
    _forget(prov, dotted)
    prov[dotted] = source.label
    for i, (_, label) in enumerate(items):
        prov[f"{dotted}[{i}]"] = label
    return [item for item, _ in items]


def _same(item: Any) -> Any:
    """A string names itself (a module, a check, a flag): restating one keeps one."""
    return item


def _forget(prov: dict[str, str], dotted: str) -> None:
    """Drop the provenance of what was under ``dotted`` (a replaced subtree's, a list's items')."""
    for old in [k for k in prov if k.startswith((dotted + ".", dotted + "["))]:
        del prov[old]


def _table_source(prov: Mapping[str, str], table: str, default: str) -> str:
    """The file that defined (part of) a table: the source of any value under it, the child's first."""
    sources = [src for key, src in prov.items() if key.startswith(table + ".") or key == table]
    files = [src for src in sources if src != DEFAULTS_SOURCE]
    return files[-1] if files else default


def _set(dst: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = dst
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _cross_checks(data: Mapping[str, Any], prov: Mapping[str, str], top: str) -> None:
    """Rules that span keys (the schema checks each key alone)."""

    def where(key: str) -> str:
        return prov.get(key, top)

    def members(key: str, allowed: Any, what: str, hint: Optional[str] = None) -> None:
        section, field = key.split(".")
        for i, value in enumerate(data.get(section, {}).get(field, [])):
            if value not in allowed:
                raise RecipeError(
                    f"{what} {value!r}",
                    file=where(key),
                    key=f"{key}[{i}]",
                    hint=hint or did_you_mean(value, allowed) or f"known: {', '.join(allowed) or 'none'}",
                )

    members("activate.profiles", list(data.get("env_profiles", {})), "no env_profiles entry named")
    members("torch.allow", schema.GATES, "unknown resolver gate")
    members("container.allow", containers.IMAGE_GATES, "unknown image gate")
    members(
        "torch.packages",
        schema.TORCH_PACKAGES,
        "torch.packages takes torch, torchvision and torchaudio only, found",
        hint="put other packages in [[packages]]",
    )
    members("validation.checks", checks.NAMES, "unknown validation check")
    if data.get("env", {}).get("kind") == "container" and not data.get("container", {}).get("image"):
        raise RecipeError(
            'env.kind = "container" needs the image it is: container.image is not set',
            file=where("env.kind"),
            key="container.image",
            hint=containers.IMAGE_EXAMPLE,
        )
    fs_name = data.get("env", {}).get("filesystem")
    if fs_name and fs_name not in data.get("filesystems", {}):
        raise RecipeError(
            f"no filesystems entry named {fs_name!r}",
            file=where("env.filesystem"),
            key="env.filesystem",
            hint=did_you_mean(fs_name, data.get("filesystems", {}))
            or f"defined file systems: {', '.join(data.get('filesystems', {})) or 'none'}",
        )
    partitions = data.get("scheduler", {}).get("partitions", {})
    for key in ("scheduler.partition", "validation.partition"):
        section, field = key.split(".")
        partition = data.get(section, {}).get(field)
        if partition and partitions and partition not in partitions:
            raise RecipeError(
                f"partition {partition!r} is not in scheduler.partitions",
                file=where(key),
                key=key,
                hint=did_you_mean(partition, partitions) or f"partitions: {', '.join(partitions)}",
            )
    _nodes_within_site(data, where)
    scheduler = data.get("scheduler", {}).get("type")
    for key, launcher in (
        ("launcher.default", data.get("launcher", {}).get("default")),
        ("validation.launcher", data.get("validation", {}).get("launcher")),
    ):
        needs = launchers.LAUNCHERS[launcher].scheduler if launcher in launchers.LAUNCHERS else None
        if needs and scheduler != needs:
            raise RecipeError(
                f"launcher {launcher} needs scheduler.type = {needs!r}, found {scheduler!r}",
                file=where(key),
                key=key,
            )
    if kind_info(data.get("env", {}).get("kind")).conda and not data.get("conda", {}).get("channels"):
        raise RecipeError(
            "a conda env needs conda.channels",
            file=where("env.kind"),
            key="conda.channels",
            hint='e.g. channels = ["conda-forge"]',
        )
    paths = [("env.prefix", data.get("env", {}).get("prefix", ""))]
    paths += [(f"filesystems.{n}.path", fs.get("path", "")) for n, fs in data.get("filesystems", {}).items()]
    for key, value in paths:
        if _BAD_VAR.search(str(value)):
            raise RecipeError(
                f"malformed ${{...}}: expected ${{NAME}}, found string {value!r}", file=where(key), key=key
            )


def _nodes_within_site(data: Mapping[str, Any], where: Callable[[str], str]) -> None:
    """validation.nodes against the site's maximum: the chosen partition's max_nodes, or where no partition is
    chosen the largest one (when every partition declares one). The schema has checked the types."""
    nodes = data.get("validation", {}).get("nodes")
    partitions = data.get("scheduler", {}).get("partitions", {})
    if not isinstance(nodes, int) or not partitions:
        return
    chosen = data.get("validation", {}).get("partition") or data.get("scheduler", {}).get("partition")
    if chosen in partitions:
        limit = partitions[chosen].get("max_nodes")
        source = f"scheduler.partitions.{chosen}.max_nodes"
    elif all("max_nodes" in part for part in partitions.values()):
        chosen = max(partitions, key=lambda name: partitions[name]["max_nodes"])
        limit = partitions[chosen]["max_nodes"]
        source = f"the largest partition's, scheduler.partitions.{chosen}.max_nodes"
    else:
        return
    if limit is not None and nodes > limit:
        raise RecipeError(
            f"expected 1 to {limit} nodes ({source}), found integer {nodes}",
            file=where("validation.nodes"),
            key="validation.nodes",
            hint=f"use at most {limit} nodes, or a partition that allows more",
        )


_BAD_VAR = re.compile(r"\$\{(?![A-Za-z_][A-Za-z0-9_]*\})")
