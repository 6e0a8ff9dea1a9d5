"""Site mirrors (pure): the files a set of locks names, where each goes in a mirror directory, the PEP 503 pages
over them, and the ``ENVBUILDER_INDEX_MIRROR`` value that points the locks' indexes at the directory.

``envbuilder mirror`` fills a directory for a site without internet with exactly the files its recipes' locks name,
for every platform in each lock. Two layouts: ``simple`` (a PEP 503 tree: ``simple/<project>/index.html`` linking
``files/<file>#sha256=...``, read by uv and pip as a ``file://`` index) and ``wheelhouse`` (one flat directory,
read with ``--find-links``). Downloading them is :mod:`envbuilder.backends.sitemirror`'s.
"""

from __future__ import annotations

import html
import json
import re
import urllib.parse
from collections.abc import Sequence

from envbuilder.core.errors import LockError, UsageError
from envbuilder.core.formats import MIRROR_LAYOUTS
from envbuilder.core.structs import dataclass
from envbuilder.lockfile import Lock
from envbuilder.resolver.mirror import PYPI, VAR

LAYOUTS = MIRROR_LAYOUTS
FILES = "files"
SIMPLE = "simple"
#: What a mirror directory holds, so that a later run with other locks adds to its pages instead of replacing them.
MANIFEST = ".envbuilder-mirror.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class MirrorFile:
    """One file the locks name: its project (normalized), file name, URL, sha256, and the locks naming it."""

    project: str
    filename: str
    url: str
    sha256: str
    locks: tuple[str, ...]

    def relpath(self, layout: str) -> str:
        """Where the file lies under the mirror directory."""
        return self.filename if layout == "wheelhouse" else f"{FILES}/{self.filename}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def filename_of(url: str, where: str) -> str:
    """The file name a URL ends in, refused where it could not be a plain name in one directory."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not name or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise LockError(f"{where}: the URL {url!r} does not end in a file name a mirror can hold")
    return name


def collect(locks: Sequence[Lock]) -> list[MirrorFile]:
    """Every file the locks name (all their platforms), each once; conda packages and two different files of one
    name are refused, naming the lock and the package."""
    found: dict[str, MirrorFile] = {}
    for lock in locks:
        where = lock.path or lock.recipe
        for platform in lock.platforms:
            for pkg in platform.packages:
                if pkg.is_conda:
                    raise LockError(
                        f"{where}: {pkg.name} {pkg.version} ({platform.arch}) is a conda package; "
                        "envbuilder mirror fills wheel mirrors only",
                        hint="mirror conda channels with conda's own tools (conda-mirror, rattler's mirror) and "
                        f"point {VAR} at the channel directory (e.g. conda-forge=/srv/conda/conda-forge)",
                    )
                for f in pkg.files:
                    _add(
                        found,
                        MirrorFile(normalize(pkg.name), filename_of(f.url, where), f.url, f.sha256, (where,)),
                    )
    return sorted(found.values(), key=lambda f: (f.project, f.filename))


def _add(found: dict[str, MirrorFile], new: MirrorFile) -> None:
    old = found.get(new.filename)
    if old is None:
        found[new.filename] = new
    elif old.sha256 != new.sha256:
        raise LockError(
            f"{new.locks[0]}: {new.filename} ({new.url}, sha256 {new.sha256}) has another hash than the file of "
            f"that name in {old.locks[0]} ({old.url}, sha256 {old.sha256}); one mirror cannot hold both",
            hint="mirror these locks into separate directories",
        )
    elif new.locks[0] not in old.locks:
        found[new.filename] = MirrorFile(
            old.project, old.filename, old.url, old.sha256, (*old.locks, *new.locks)
        )


def merged(recorded: Sequence[MirrorFile], new: Sequence[MirrorFile]) -> list[MirrorFile]:
    """What a mirror holds after ``new`` joins the files it ``recorded``; a file of a recorded name with another
    hash is refused (it would replace the bytes an earlier lock names)."""
    found = {f.filename: f for f in recorded}
    for f in new:
        _add(found, f)
    return sorted(found.values(), key=lambda f: (f.project, f.filename))


def manifest(files: Sequence[MirrorFile], layout: str) -> str:
    entries = [
        {"project": f.project, "file": f.filename, "url": f.url, "sha256": f.sha256, "locks": list(f.locks)}
        for f in files
    ]
    return json.dumps({"version": MANIFEST_VERSION, "layout": layout, "files": entries}, indent=1) + "\n"


def read_manifest(text: str, where: str, layout: str) -> list[MirrorFile]:
    """The files a mirror's manifest records; one of another layout or form is refused."""
    try:
        doc = json.loads(text)
        if doc.get("version") != MANIFEST_VERSION:
            raise ValueError(f"version {doc.get('version')!r}, expected {MANIFEST_VERSION}")
        files = [
            MirrorFile(
                str(e["project"]),
                filename_of(str(e["url"]), where),
                str(e["url"]),
                str(e["sha256"]),
                tuple(str(x) for x in e["locks"]),
            )
            for e in doc["files"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{where}: not a mirror manifest envbuilder can read ({exc})",
            hint="mirror into a new directory with --to, or remove the manifest to start the mirror's pages afresh",
        ) from None
    if doc.get("layout") != layout:
        raise UsageError(
            f"{where}: this mirror has the {doc.get('layout')!r} layout, not {layout!r}",
            hint=f"run again with --layout {doc.get('layout')}, or mirror into another directory",
        )
    return files


def pages(files: Sequence[MirrorFile]) -> dict[str, str]:
    """The PEP 503 pages of the simple layout: path under the mirror directory -> HTML."""
    projects: dict[str, list[MirrorFile]] = {}
    for f in files:
        projects.setdefault(f.project, []).append(f)
    out: dict[str, str] = {}
    for project, mine in sorted(projects.items()):
        links = [
            f'<a href="../../{FILES}/{urllib.parse.quote(f.filename)}#sha256={f.sha256}">{html.escape(f.filename)}</a><br>'
            for f in mine
        ]
        out[f"{SIMPLE}/{project}/index.html"] = _html(links)
    root = [f'<a href="{urllib.parse.quote(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)]
    out[f"{SIMPLE}/index.html"] = _html(root)
    return out


def _html(links: Sequence[str]) -> str:
    body = "\n".join(links)
    return f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0"></head><body>\n{body}\n</body></html>\n'


def upstreams(locks: Sequence[Lock]) -> list[str]:
    """The indexes the locks were resolved from (PyPI where a platform names none), each once."""
    out: list[str] = []
    for lock in locks:
        for platform in lock.platforms:
            flags = [str(x) for x in platform.inputs.get("index_flags", [])]
            named = [
                flags[i + 1] for i, a in enumerate(flags[:-1]) if a in ("--index-url", "--extra-index-url")
            ]
            if "--index-url" not in flags:
                named.insert(0, PYPI)
            out += [u for u in named if u not in out]
    return out


def env_value(indexes: Sequence[str], root: str, layout: str) -> str:
    """``ENVBUILDER_INDEX_MIRROR`` sending each of ``indexes`` to the mirror at ``root`` (an absolute path)."""
    if layout == "wheelhouse" and re.search(r"[\s;,]", root):
        raise UsageError(
            f"{root}: a wheelhouse path with a space, `;` or `,` cannot be written in {VAR}",
            hint="use --layout simple (its file:// URL quotes them) or another --to",
        )
    target = (
        root.rstrip("/")
        if layout == "wheelhouse"
        else "file://" + urllib.parse.quote(root.rstrip("/")) + f"/{SIMPLE}/"
    )
    return " ".join(f"{'pypi' if u.rstrip('/') == PYPI else u}={target}" for u in indexes)
