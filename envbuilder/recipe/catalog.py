"""Where recipes come from: the built-in directory, then the site config's registries, then ENVBUILDER_RECIPE_PATH
(later entries win). A directory holding a registry index is read as a registry: its published versions, each
verified before use; any other directory is read as plain recipe files.

Whatever lies on the path, one bad file never breaks every command: a file that cannot be read or parsed (not
UTF-8, a FIFO, a device, a symlink loop, too large, too deeply nested) and a directory that cannot be listed are
skipped with a warning. A recipe that is asked for and broken is its file's error: a broken file takes the place
of the recipes of the same name in earlier layers (the built-in ``local`` under a user's broken ``local.toml``).

The catalog does the reading (and a registry the verifying) for the loader: it hands over documents ready to merge
(``document.Documents``), so that loading itself runs no process and opens no file."""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from envbuilder import lockfile
from envbuilder.core import settings
from envbuilder.core.errors import PublishError, RecipeError, RecipeNotFound, did_you_mean
from envbuilder.core.structs import dataclass
from envbuilder.recipe.document import Document
from envbuilder.recipe.registry import INDEX as REGISTRY_INDEX
from envbuilder.recipe.registry import Published, Registry
from envbuilder.recipe.scancache import FIELDS, ScanCache
from envbuilder.recipe.trust import Policy, pin_dir
from envbuilder.system import textfile
from envbuilder.system.console import Out
from envbuilder.system.fsutil import file_key
from envbuilder.system.siteconfig import config_path, read_toml

if TYPE_CHECKING:  # only a type here: the recipe arrives loaded
    from envbuilder.recipe.loader import Recipe

REGISTRY_KEYS = ("path", "require_signatures", "allowed_signers")
#: The most files and directories one directory of the path is searched through (a site ships a few dozen).
MAX_SCANNED = 10_000


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
    package = Path(__file__).resolve().parent.parent
    packaged = package / "_recipes"
    if packaged.is_dir():
        return packaged
    return package.parent / "recipes"


def layers(env: Optional[Mapping[str, str]] = None) -> list[Layer]:
    env = os.environ if env is None else env
    out = [Layer("builtin", builtin_dir())]
    out += site_registries(env)
    for part in env.get(settings.RECIPE_PATH_VAR, "").split(":"):
        if part.strip():
            root = Path(part).expanduser()
            # Its trust settings are its own, pinned on first use (in the user's envbuilder home).
            pinned = Registry(root, Policy(pins=pin_dir(settings.home(env))))
            out.append(Layer(part, root, pinned if Registry.looks_like(root) else None))
    return out


def site_registries(env: Mapping[str, str]) -> list[Layer]:
    """The registries the site config names (``[[registries]]`` with path, require_signatures, allowed_signers)."""
    path = config_path(env)
    if path is None:
        return []
    doc = read_toml(path)
    # [[shared_roots]]: the group-shared backup roots, read by strictmodes where a check needs them;
    # [settings] and [locked]: the settings, read by system.configfiles; [[quota_commands]]: the site's quota
    # commands, read by system.space where pre-flight runs.
    unknown = sorted(set(doc) - {"registries", "shared_roots", "settings", "locked", "quota_commands"})
    if unknown:
        raise RecipeError(
            f"unknown key {unknown[0]!r}",
            file=str(path),
            key=unknown[0],
            hint="expected [[registries]], [[shared_roots]], [[quota_commands]], [settings] or [locked]",
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
        policy = Policy(
            bool(item.get("require_signatures", False)),
            Path(signers) if signers else None,
            pins=pin_dir(settings.home(env)),
            config=path,
        )
        out.append(Layer(f"site config ({path})", root, Registry(root, policy)))
    return out


def registry_layer(root: Path, env: Mapping[str, str]) -> Layer:
    """The registry at ``root`` as a layer of its own: with the policy the site config gives it where it names
    it (its signatures required, its signers), else with the user's pins, as on the recipe path."""
    for layer in site_registries(env):
        if resolved(layer.root) == resolved(root):
            return layer
    if not Registry.looks_like(root):
        raise RecipeError(
            f"{root} is not a recipe registry (no {REGISTRY_INDEX} in it)",
            hint="name the directory `envbuilder publish --registry` wrote",
        )
    return Layer(str(root), root, Registry(root, Policy(pins=pin_dir(settings.home(env)))))


def resolved(path: Path) -> Path:
    """``path.resolve()``, or the path made absolute where it cannot be resolved (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a loop before Python 3.13; ValueError: a NUL
        return path.absolute()


class Catalog:
    """All recipes on the search path, by name. Scanning parses files but validates nothing."""

    def __init__(self, search: list[Layer], cache: Optional[Path] = None) -> None:
        """Scan ``search``; ``cache``: where the scan keeps what it learned from each file (scancache)."""
        self.layers = search
        self.entries: dict[str, Entry] = {}
        #: Files that do not parse, by path: whether they are recipes cannot be known, so they are not entries.
        self.broken: dict[Path, RecipeError] = {}
        #: Names a broken file (or two files of one name in one directory) makes unusable, with that error and
        #: the layer: asking for the name is the error, never an earlier layer's recipe of the same name.
        self.unusable: dict[str, tuple[Layer, RecipeError]] = {}
        #: Every file by stem, for "not found" messages that can say what the file with that name is.
        self.stems: dict[str, Path] = {}
        #: What was skipped and why: (the recipe name the file would hold, if any; the line for the user).
        self._skipped: list[tuple[Optional[str], str]] = []
        #: Where the lines go when the catalog is first used (``from_env`` sets it).
        self._warn: Optional[Callable[[str], None]] = None
        self._seen = ScanCache(cache)
        for layer in search:
            if layer.registry is not None:
                if layer.root.is_dir():
                    self._add_registry(layer, layer.registry)
                continue
            if self._listable_root(layer):
                for path in self._recipe_files(layer):
                    self._add(path, layer)
        self._seen.save()

    def _listable_root(self, layer: Layer) -> bool:
        try:
            mode = layer.root.stat().st_mode
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # a path entry that does not exist is no news
                self._skipped.append(
                    (None, f"skipped {layer.root} on the recipe path: {textfile.os_reason(exc)}")
                )
            return False
        if not stat.S_ISDIR(mode):
            self._skipped.append((None, f"skipped {layer.root} on the recipe path: not a directory"))
            return False
        return True

    def _recipe_files(self, layer: Layer) -> list[Path]:
        """Every ``*.toml`` under the layer's root, sorted. Symlinked directories are not entered (as rglob did
        not), so no link can loop the walk; a directory that cannot be listed is a warning."""
        files: list[Path] = []
        todo = [layer.root]
        seen = 0
        while todo:
            directory = todo.pop()
            try:
                with os.scandir(directory) as listing:
                    items = list(itertools.islice(listing, MAX_SCANNED + 1 - seen))
            except OSError as exc:
                self._skipped.append((None, f"skipped {directory}: cannot list it ({exc.strerror or exc})"))
                continue
            seen += len(items)
            if seen > MAX_SCANNED:
                self._skipped.append(
                    (
                        None,
                        f"skipped the rest of {layer.root} on the recipe path: more than {MAX_SCANNED} files "
                        f"and directories under it; the limit is {MAX_SCANNED}",
                    )
                )
                break
            for item in items:
                try:
                    is_dir = item.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    todo.append(Path(item.path))
                elif item.name.endswith(".toml"):
                    files.append(Path(item.path))
        return sorted(files)

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
        entry = self.get(name)
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

    def recipe_document(self, ref: str) -> Document:
        """Recipe ``ref`` (``NAME`` or ``NAME@VERSION``) read from its file, or the error that says why it cannot be."""
        if "@" in ref:
            entry = self.lookup(ref)
        else:
            found = self.get(ref)
            if found is None:
                self._not_found(ref)
            entry = found
        if entry.published is not None and entry.layer.registry is not None:
            # A published recipe is used only once its bytes match the registry's index, its signature and the name
            # and version in it check; those very bytes are used (no second read that a registry writer could swap),
            # and it extends nothing.
            data = entry.layer.registry.load(entry.published, latest="@" not in ref)
            return replace(
                self._locate(entry.path), data=data, name=entry.name, version=entry.version, published=True
            )
        return replace(self._read(entry.path), name=entry.name, version=entry.version)

    def parent_document(self, child: Document, extends: str) -> Document:
        """The file ``child``'s ``extends`` names: a ``.toml`` path beside it, else a recipe on the path."""
        if extends.endswith(".toml"):
            candidate = resolved(child.path.parent / extends)
            # Something there but unreadable (a FIFO, a symlink loop) is read_toml's error, not "not found".
            if not (candidate.exists() or candidate.is_symlink()):
                raise RecipeError(
                    f"parent file {extends!r} not found (looked for {candidate})",
                    file=child.label,
                    key="extends",
                )
            return self._read(candidate)
        entry = self.get(extends)  # a broken file of that name is its own error, not "not found"
        if entry is None:
            raise RecipeError(
                f"parent recipe {extends!r} not found on the recipe path",
                file=child.label,
                key="extends",
                hint=did_you_mean(extends, self.names()) or "a file parent must end in .toml",
            )
        return self._read(entry.path)

    def _read(self, path: Path) -> Document:
        """The file at ``path``, parsed; a file the scan found broken is that error."""
        found = self._locate(path)
        broken = next((exc for p, exc in self.broken.items() if resolved(p) == found.real), None)
        if broken is not None:
            raise broken
        return replace(found, data=read_toml(path, found.label))

    def _locate(self, path: Path) -> Document:
        """The document at ``path`` with its names and no data yet."""
        real = resolved(path)
        return Document(
            path=path,
            label=display_path(path, self.layer_of(path)),
            data={},
            real=real,
            real_label=display_path(real, self.layer_of(real)),
        )

    def _not_found(self, name: str) -> NoReturn:
        """Say why NAME is not a recipe as precisely as the files allow."""
        path = self.stems.get(name)
        if path is not None and path in self.broken:
            raise self.broken[path]
        if path is not None:
            shown = display_path(path, self.layer_of(path))
            doc = read_toml(path, shown)
            declared = doc.get("recipe", {}).get("name") if isinstance(doc.get("recipe"), dict) else None
            if declared is None and not isinstance(doc.get("recipe"), dict):
                raise RecipeNotFound(
                    f"{shown} has no [recipe] table: it is a base file, reached only through extends",
                    hint=f"add [recipe] with name = {name!r} to make it a recipe",
                )
            raise RecipeError(
                f"recipe.name {declared!r} does not match the file name {path.name!r}",
                file=shown,
                key="recipe.name",
                hint=f"set name = {name!r}",
            )
        hint = (
            did_you_mean(name, self.names(), n=3, cutoff=0.5) or "run `envbuilder recipes list` to see them"
        )
        raise RecipeNotFound(f"no recipe named {name!r} on the recipe path", hint=hint)

    @property
    def warnings(self) -> list[str]:
        """What was skipped and why, one line each."""
        return [line for _, line in self._skipped]

    def _flush(self, asked: Optional[str] = None) -> None:
        """Say what was skipped, once, when the catalog is first used; not the file whose error is being raised."""
        warn, self._warn = self._warn, None
        if warn is None:
            return
        for name, line in self._skipped:
            if name is None or name != asked:
                warn(line)

    def get(self, name: str) -> Optional[Entry]:
        """The entry named ``name``, None if there is none, or the error of the broken file that holds the name."""
        if name in self.unusable:
            self._flush(asked=name)
            raise self.unusable[name][1]
        self._flush()
        return self.entries.get(name)

    @classmethod
    def from_env(
        cls, env: Optional[Mapping[str, str]] = None, warn: Optional[Callable[[str], None]] = None
    ) -> Catalog:
        """The user's catalog; what it skipped goes to ``warn`` (stderr by default) when it is first used."""
        env = os.environ if env is None else env
        catalog = cls(layers(env), settings.catalog_cache(settings.home(env)))
        catalog._warn = warn or Out().warn
        return catalog

    def _add(self, path: Path, layer: Layer) -> None:
        self.stems[path.stem] = path
        key = file_key(path)  # before the read: a change during it is a new key next time
        summary = self._seen.get(path, key)
        if summary is None:
            summary = self._summary(path, layer)
            if summary is None:
                return
            self._seen.put(path, key, summary)
        if not summary["recipe"]:
            return  # a base file (site.toml, center.toml): reachable only through extends
        self._put(
            Entry(
                name=summary["name"],
                path=path,
                layer=layer,
                description=summary["description"],
                site=summary["site"],
                status=summary["status"],
            )
        )

    def _summary(self, path: Path, layer: Layer) -> Optional[dict[str, Any]]:
        """What the scan needs from the file at ``path``, parsed; None for a broken file (it is recorded)."""
        try:
            doc = read_toml(path, display_path(path, layer))
        except RecipeError as exc:
            self.broken[path] = exc
            line = f"skipped {exc.message}"
            hidden = self.entries.get(path.stem)
            if hidden is not None:
                line += f" (recipe {path.stem!r} is unusable until it is fixed: it hides {hidden.display()})"
            self._skipped.append((path.stem, line))
            # A plain file's recipe name is its stem (load checks it), so the broken file holds that name.
            self._unusable(path.stem, layer, exc)
            return None
        recipe = doc.get("recipe")
        if not isinstance(recipe, dict):
            return {"recipe": False, **dict.fromkeys(FIELDS, "")}
        raw_name = recipe.get("name")
        site = doc.get("site", {}) if isinstance(doc.get("site"), dict) else {}
        return {
            "recipe": True,
            "name": raw_name if isinstance(raw_name, str) else path.stem,
            "description": str(recipe.get("description", "")),
            "site": str(site.get("name", "")),
            "status": str(site.get("status", "")),
        }

    def _unusable(self, name: str, layer: Layer, exc: RecipeError) -> None:
        self.unusable[name] = (layer, exc)
        self.entries.pop(name, None)

    def _put(self, entry: Entry) -> None:
        held = self.unusable.get(entry.name)
        if held is not None:
            if held[0] == entry.layer:
                return  # the broken file beside it might be the one meant: the name stays unusable
            # A later layer's recipe replaces the broken file, as it would replace a good one.
            del self.unusable[entry.name]
        old = self.entries.get(entry.name)
        if old is not None and old.layer == entry.layer:
            exc = RecipeError(
                f"recipe name {entry.name!r} is defined twice in one directory: {old.path} and {entry.path}",
                file=str(entry.path),
                key="recipe.name",
            )
            self._skipped.append((entry.name, f"skipped {exc.message}"))
            self._unusable(entry.name, entry.layer, exc)
            return
        shadows = (*old.shadows, old.path) if old else ()
        self.entries[entry.name] = replace(entry, shadows=shadows)

    def names(self) -> list[str]:
        self._flush()
        return sorted(self.entries)

    def layer_of(self, path: Path) -> Layer:
        real = resolved(path)
        best: Optional[Layer] = None
        for layer in self.layers:
            try:
                real.relative_to(resolved(layer.root))
            except ValueError:
                continue
            best = layer
        return best or Layer(str(path.parent), path.parent)


def find_lock(
    recipe: Recipe, catalog: Catalog, env: Mapping[str, str], explicit: Optional[str] = None
) -> Optional[lockfile.Lock]:
    """The lock ``create`` uses: ``--lock FILE``, else yours (``envbuilder lock NAME`` wrote it), else the one
    published with the recipe's registry version (verified like the recipe)."""
    if explicit:
        return lockfile.read(Path(explicit).expanduser(), "--lock")
    mine = lockfile.user_path(settings.home(env), recipe.name)
    if mine.is_file():
        return lockfile.read(mine, "yours")
    entry = catalog.entries.get(recipe.name)
    if recipe.version:
        entry = catalog.lookup(f"{recipe.name}@{recipe.version}")
    if entry is not None and entry.published is not None and entry.layer.registry is not None:
        return entry.layer.registry.verify_lock(entry.published)
    return None
