"""Where recipes come from: the built-in directory, then ENVBUILDER_RECIPE_PATH (later entries win)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from envbuilder._toml import TOMLDecodeError, loads
from envbuilder.errors import RecipeError

RECIPE_PATH_VAR = "ENVBUILDER_RECIPE_PATH"


@dataclass(frozen=True)
class Layer:
    label: str  # "builtin" or the directory as the user wrote it
    root: Path


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

    def display(self) -> str:
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
    for part in env.get(RECIPE_PATH_VAR, "").split(":"):
        if part.strip():
            out.append(Layer(part, Path(part).expanduser()))
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
            for path in sorted(layer.root.rglob("*.toml")):
                self._add(path, layer)

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
        self.entries[entry.name] = Entry(
            entry.name, entry.path, entry.layer, shadows, entry.description, entry.site, entry.status
        )

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
