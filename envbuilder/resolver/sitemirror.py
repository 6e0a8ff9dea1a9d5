"""Site mirrors (pure): the files a set of locks names, where each goes in a mirror directory, the PEP 503 pages
over them, and the ``ENVBUILDER_INDEX_MIRROR`` value that points the locks' indexes at the directory.

``envbuilder mirror`` fills a directory for a site without internet with exactly the files its recipes' locks name,
for every platform in each lock. Two layouts: ``simple`` (a PEP 503 tree: ``simple/<project>/index.html`` linking
``files/<file>#sha256=...``, read by uv and pip as a ``file://`` index) and ``wheelhouse`` (one flat directory,
read with ``--find-links``). Conda packages go, whatever the layout, into one channel ``conda/<subdir>/`` that
every channel of the locks is sent to (the lock pins each build, so one channel serves them all). Downloading
them, and the channel's repodata.json, is :mod:`envbuilder.resolver.mirrorfill`'s.
"""

from __future__ import annotations

import html
import json
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import replace

from envbuilder.core.errors import LockError, UsageError
from envbuilder.core.formats import MIRROR_LAYOUTS
from envbuilder.core.structs import dataclass
from envbuilder.lockfile import Lock
from envbuilder.resolver.mirror import PYPI, VAR, channel_url

LAYOUTS = MIRROR_LAYOUTS
FILES = "files"
SIMPLE = "simple"
#: conda packages go into one channel, whatever the layout: ``conda/<subdir>/<file>`` with its repodata.json.
CONDA = "conda"
_SUBDIR = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
#: What a mirror directory holds, so that a later run with other locks adds to its pages instead of replacing them.
MANIFEST = ".envbuilder-mirror.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class MirrorFile:
    """One file the locks name: its project (normalized), file name, URL, sha256, and the locks naming it; a
    conda package's platform subdir (``linux-64``), empty for a wheel or sdist."""

    project: str
    filename: str
    url: str
    sha256: str
    locks: tuple[str, ...]
    subdir: str = ""

    @property
    def key(self) -> str:
        """What names it in the mirror: conda's subdirs each hold their own files."""
        return f"{self.subdir}/{self.filename}"

    def relpath(self, layout: str) -> str:
        """Where the file lies under the mirror directory."""
        if self.subdir:
            return f"{CONDA}/{self.subdir}/{self.filename}"
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
    """Every file the locks name (all their platforms), each once; two different files of one name are refused,
    naming the locks."""
    found: dict[str, MirrorFile] = {}
    for lock in locks:
        where = lock.path or lock.recipe
        for platform in lock.platforms:
            for pkg in platform.packages:
                for f in pkg.files:
                    subdir = _subdir(f.url, where) if pkg.is_conda else ""
                    name = filename_of(f.url, where)
                    _add(found, MirrorFile(normalize(pkg.name), name, f.url, f.sha256, (where,), subdir))
    return sorted(found.values(), key=lambda f: (f.project, f.filename))


def _subdir(url: str, where: str) -> str:
    """A conda package's subdir: the directory its URL names it in (``.../conda-forge/linux-64/x-1-0.conda``)."""
    parts = urllib.parse.urlsplit(url).path.rstrip("/").split("/")
    if len(parts) < 3 or not _SUBDIR.match(parts[-2]):
        raise LockError(
            f"{where}: the conda package URL {url!r} does not name its platform subdir (linux-64, noarch)"
        )
    return parts[-2]


def _add(found: dict[str, MirrorFile], new: MirrorFile) -> None:
    old = found.get(new.key)
    if old is None:
        found[new.key] = new
    elif old.sha256 != new.sha256:
        raise LockError(
            f"{new.locks[0]}: {new.filename} ({new.url}, sha256 {new.sha256}) has another hash than the file of "
            f"that name in {old.locks[0]} ({old.url}, sha256 {old.sha256}); one mirror cannot hold both",
            hint="mirror these locks into separate directories",
        )
    elif new.locks[0] not in old.locks:
        found[new.key] = replace(old, locks=(*old.locks, *new.locks))


def merged(recorded: Sequence[MirrorFile], new: Sequence[MirrorFile]) -> list[MirrorFile]:
    """What a mirror holds after ``new`` joins the files it ``recorded``; a file of a recorded name with another
    hash is refused (it would replace the bytes an earlier lock names)."""
    found = {f.key: f for f in recorded}
    for f in new:
        _add(found, f)
    return sorted(found.values(), key=lambda f: (f.project, f.filename))


def manifest(files: Sequence[MirrorFile], layout: str) -> str:
    entries = [
        {
            "project": f.project,
            "file": f.filename,
            "url": f.url,
            "sha256": f.sha256,
            "locks": list(f.locks),
            **({"subdir": f.subdir} if f.subdir else {}),
        }
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
                str(e.get("subdir", "")),
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
        if not f.subdir:  # conda packages have repodata.json instead
            projects.setdefault(f.project, []).append(f)
    out: dict[str, str] = {}
    for project, mine in sorted(projects.items()):
        links = [
            f'<a href="../../{FILES}/{urllib.parse.quote(f.filename)}#sha256={f.sha256}">{html.escape(f.filename)}</a><br>'
            for f in mine
        ]
        out[f"{SIMPLE}/{project}/index.html"] = _html(links)
    named = sorted(p.split("/")[1] for p in out)
    root = [f'<a href="{urllib.parse.quote(p)}/">{html.escape(p)}</a><br>' for p in named]
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


def channels(locks: Sequence[Lock]) -> list[str]:
    """The conda channels the locks were resolved from (as URLs), each once."""
    out: list[str] = []
    for lock in locks:
        for platform in lock.platforms:
            named = [channel_url(str(c)) for c in platform.inputs.get("conda_channels", [])]
            out += [c for c in named if c not in out]
    return out


def env_value(indexes: Sequence[str], root: str, layout: str, conda: Sequence[str] = ()) -> str:
    """``ENVBUILDER_INDEX_MIRROR`` sending each of ``indexes`` to the mirror at ``root`` (an absolute path), and
    each conda channel of ``conda`` to its conda channel."""
    if (layout == "wheelhouse" or conda) and re.search(r"[\s;,]", root):
        raise UsageError(
            f"{root}: a wheelhouse or conda channel path with a space, `;` or `,` cannot be written in {VAR}",
            hint="use --layout simple (its file:// URL quotes them) for wheels only, or another --to",
        )
    target = (
        root.rstrip("/")
        if layout == "wheelhouse"
        else "file://" + urllib.parse.quote(root.rstrip("/")) + f"/{SIMPLE}/"
    )
    rules = [f"{'pypi' if u.rstrip('/') == PYPI else u}={target}" for u in indexes]
    rules += [f"{c}={root.rstrip('/')}/{CONDA}" for c in conda]
    return " ".join(rules)
