"""Where recipes come from: the built-in directory, then the site config's registries, then ENVBUILDER_RECIPE_PATH
(later entries win). A directory holding a registry index is read as a registry: its published versions, each
verified before use; any other directory is read as plain recipe files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from envbuilder._toml import TOMLDecodeError, loads
from envbuilder.errors import PublishError, RecipeError, RecipeNotFound, did_you_mean
from envbuilder.registry import Policy, Published, Registry

RECIPE_PATH_VAR = "ENVBUILDER_RECIPE_PATH"
CONFIG_VAR = "ENVBUILDER_CONFIG"
SITE_CONFIG = Path("/etc/envbuilder/config.toml")
REGISTRY_KEYS = ("path", "require_signatures", "allowed_signers")


@dataclass(frozen=True)
class Layer:
    label: str  # "builtin", "site config", or the directory as the user wrote it
    root: Path
    registry: Optional[Registry] = None


@dataclass(frozen=True)
class Entry:
    name: str
    path: Path
    layer: Layer
    #: Entries of the same name in earlier layers that this one overrides.
    shadows: tuple[Path, ...] = ()
    description: str = ""
    site: str = ""
    status: str = ""
    #: For a published recipe: its version, and every version the registry holds.
    version: str = ""
    published: Optional[Published] = None

    def display(self) -> str:
        if self.published is not None:
            return f"{self.layer.root}: {self.name}@{self.version}"
        return display_path(self.path, self.layer)


def display_path(path: Path, layer: Layer) -> str:
    try:
        rel = path.relative_to(layer.root)
    except ValueError:
        return str(path)
    return f"{layer.label}:{rel}" if layer.label == "builtin" else str(path)


def builtin_dir() -> Path:
    """recipes/ inside the installed wheel, or the repository's top-level recipes/ when run from source."""
    here = Path(__file__).resolve().parent
    packaged = here / "_recipes"
    if packaged.is_dir():
        return packaged
    return here.parent / "recipes"


def layers(env: Optional[Mapping[str, str]] = None) -> list[Layer]:
    env = os.environ if env is None else env
    out = [Layer("builtin", builtin_dir())]
    out += site_registries(env)
    for part in env.get(RECIPE_PATH_VAR, "").split(":"):
        if part.strip():
            root = Path(part).expanduser()
            out.append(Layer(part, root, Registry(root) if Registry.looks_like(root) else None))
    return out


def config_path(env: Mapping[str, str]) -> Optional[Path]:
    if env.get(CONFIG_VAR):
        return Path(env[CONFIG_VAR]).expanduser()
    return SITE_CONFIG if SITE_CONFIG.is_file() else None


def site_registries(env: Mapping[str, str]) -> list[Layer]:
    """The registries the site config names (``[[registries]]`` with path, require_signatures, allowed_signers)."""
    path = config_path(env)
    if path is None:
        return []
    doc = read_toml(path)
    unknown = sorted(set(doc) - {"registries"})
    if unknown:
        raise RecipeError(
            f"unknown key {unknown[0]!r}", file=str(path), key=unknown[0], hint="expected [[registries]]"
        )
    items = doc.get("registries", [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RecipeError("expected an array of tables ([[registries]])", file=str(path), key="registries")
    out = []
    for n, item in enumerate(items):
        key = f"registries[{n}]"
        for k in item:
            if k not in REGISTRY_KEYS:
                raise RecipeError(
                    f"unknown key {k!r}",
                    file=str(path),
                    key=f"{key}.{k}",
                    hint=did_you_mean(k, REGISTRY_KEYS) or f"expected one of {', '.join(REGISTRY_KEYS)}",
                )
        if not isinstance(item.get("path"), str):
            raise RecipeError(
                "expected a string: the registry's directory", file=str(path), key=f"{key}.path"
            )
        if not isinstance(item.get("require_signatures", False), bool):
            raise RecipeError("expected true or false", file=str(path), key=f"{key}.require_signatures")
        signers = item.get("allowed_signers")
        if signers is not None and not isinstance(signers, str):
            raise RecipeError("expected a path", file=str(path), key=f"{key}.allowed_signers")
        root = Path(item["path"]).expanduser()
        policy = Policy(bool(item.get("require_signatures", False)), Path(signers) if signers else None)
        out.append(Layer(f"site config ({path})", root, Registry(root, policy)))
    return out


def read_toml(path: Path, shown: Optional[str] = None) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"cannot read: {exc.strerror}", file=shown or str(path)) from None
    try:
        return loads(text)
    except TOMLDecodeError as exc:
        raise RecipeError(f"not valid TOML: {exc}", file=shown or str(path)) from None


class Catalog:
    """All recipes on the search path, by name. Scanning parses files but validates nothing."""

    def __init__(self, search: list[Layer]) -> None:
        self.layers = search
        self.entries: dict[str, Entry] = {}
        #: Files that do not parse, by path: whether they are recipes cannot be known, so they are not entries.
        self.broken: dict[Path, RecipeError] = {}
        #: Every file by stem, for "not found" messages that can say what the file with that name is.
        self.stems: dict[str, Path] = {}
        for layer in search:
            if not layer.root.is_dir():
                continue
            if layer.registry is not None:
                self._add_registry(layer, layer.registry)
                continue
            for path in sorted(layer.root.rglob("*.toml")):
                self._add(path, layer)

    def _add_registry(self, layer: Layer, registry: Registry) -> None:
        """A registry's recipes at their latest versions (the files are verified when loaded, not listed)."""
        for name in sorted(registry.index()):
            pub = registry.get(name)
            path = registry.root / pub.file
            self.stems[name] = path
            self._put(Entry(name, path, layer, version=pub.version, published=pub))

    def lookup(self, ref: str) -> Entry:
        """The entry for ``NAME`` or ``NAME@VERSION`` (a version only exists for published recipes)."""
        name, _, version = ref.partition("@")
        entry = self.entries.get(name)
        if not version or entry is None:
            if entry is None:
                raise RecipeNotFound(
                    f"no recipe named {name!r} on the recipe path",
                    hint=did_you_mean(name, self.names(), n=3, cutoff=0.5)
                    or "run `envbuilder recipes list` to see them",
                )
            return entry
        for layer in reversed(self.layers):
            if layer.registry is None or not layer.root.is_dir():
                continue
            try:
                pub = layer.registry.get(name, version)
            except PublishError:
                continue
            return Entry(name, layer.registry.root / pub.file, layer, version=pub.version, published=pub)
        if entry.published is None:
            raise RecipeNotFound(
                f"{name} is not a published recipe ({entry.display()}), so it has no versions",
                hint=f"use {name} without @{version}",
            )
        have = ", ".join(
            p.version
            for la in self.layers
            if la.registry and la.root.is_dir()
            for p in la.registry.versions(name)
        )
        raise RecipeNotFound(f"no published version {version!r} of {name}", hint=f"published: {have}")

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Catalog:
        return cls(layers(env))

    def _add(self, path: Path, layer: Layer) -> None:
        self.stems[path.stem] = path
        try:
            doc = read_toml(path, display_path(path, layer))
        except RecipeError as exc:
            self.broken[path] = exc
            return
        recipe = doc.get("recipe")
        if not isinstance(recipe, dict):
            return  # a base file (site.toml, center.toml): reachable only through extends
        raw_name = recipe.get("name")
        name = raw_name if isinstance(raw_name, str) else path.stem
        site = doc.get("site", {}) if isinstance(doc.get("site"), dict) else {}
        self._put(
            Entry(
                name=str(name),
                path=path,
                layer=layer,
                description=str(recipe.get("description", "")),
                site=str(site.get("name", "")),
                status=str(site.get("status", "")),
            )
        )

    def _put(self, entry: Entry) -> None:
        old = self.entries.get(entry.name)
        if old is not None and old.layer == entry.layer:
            raise RecipeError(
                f"recipe name {entry.name!r} is defined twice in one directory: {old.path} and {entry.path}",
                file=str(entry.path),
                key="recipe.name",
            )
        shadows = (*old.shadows, old.path) if old else ()
        self.entries[entry.name] = replace(entry, shadows=shadows)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def layer_of(self, path: Path) -> Layer:
        resolved = path.resolve()
        best: Optional[Layer] = None
        for layer in self.layers:
            try:
                resolved.relative_to(layer.root.resolve())
            except ValueError:
                continue
            best = layer
        return best or Layer(str(path.parent), path.parent)
