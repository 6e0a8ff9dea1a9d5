"""What a wheel index lists, as values (pure): wheel file names, PEP 691 / PEP 503 project pages, and the facts
read from them that the resolver asks about (which releases exist, with which local build labels, for which
Pythons and platforms).

A wheel file name is ``name-version(-build)?-python-abi-platform.whl``; each tag may be a compressed set joined by
``.`` (``cp311.cp312``, ``manylinux_2_17_x86_64.manylinux2014_x86_64``). The version may carry a local label
(``2.15.0+cu130``): download.pytorch.org names its builds that way, while PyPI's files carry none.

Reading pages from the network or the cache is ``envbuilder.resolver.indexread``'s work; it hands these values over.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any, Optional, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from envbuilder.core.structs import dataclass

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
#: What a reader asks for: PEP 691 JSON first, HTML where the index offers nothing else.
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"

# The glibc floor of the legacy manylinux names (PEP 513, 571, 599).
_LEGACY_GLIBC = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}
_LINUX_ARCH = re.compile(
    r"^(?:manylinux_(?P<major>\d+)_(?P<minor>\d+)|(?P<legacy>manylinux1|manylinux2010|manylinux2014)"
    r"|musllinux_\d+_\d+|linux)_(?P<arch>.+)$"
)
_CPYTHON = re.compile(r"^cp(?P<major>\d)(?P<minor>\d+)(?P<t>t?)$")


@functools.lru_cache(maxsize=1024)
def normalize(name: str) -> str:
    """A project name in PEP 503 normal form (``Torch_Vision`` -> ``torch-vision``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _python(tag: str) -> str:
    """``cp311`` -> ``3.11``, ``cp314t`` -> ``3.14t``; any other tag (``py3``, ``pp310``) stays as it is."""
    m = _CPYTHON.match(tag)
    return f"{m['major']}.{m['minor']}{m['t']}" if m else tag


def _linux(platform: str) -> Optional[tuple[str, Optional[str]]]:
    """(arch, glibc) of a Linux platform tag; glibc is None for ``linux_*`` and musl tags. None elsewhere."""
    m = _LINUX_ARCH.match(platform)
    if m is None:
        return None
    if m["major"]:
        return m["arch"], f"{m['major']}.{m['minor']}"
    return m["arch"], _LEGACY_GLIBC.get(m["legacy"] or "")


@functools.lru_cache(maxsize=256)
def _specifier(text: str) -> SpecifierSet:
    return SpecifierSet(text)


def _version_key(text: str) -> tuple[int, Union[Version, str]]:
    try:
        return 1, Version(text)
    except InvalidVersion:
        return 0, text


@dataclass(frozen=True)
class WheelFile:
    filename: str
    project: str  # normalized (PEP 503)
    version: str  # the public version: 2.15.0, 2.16.0.dev20261101
    local: str  # the local label ("cu130", "cpu"), "" where the file has none (PyPI's builds)
    python_tags: tuple[str, ...]
    abi_tag: str
    platforms: tuple[str, ...]
    requires_python: Optional[str] = None
    yanked: bool = False
    #: The index's reason for the yank (PEP 592), "" where it gave none or the file is not yanked.
    yanked_reason: str = ""

    @property
    def variant(self) -> str:
        """The build variant the local label names ("cu130" for ``+cu130.post1``), "" for an unlabelled file."""
        return label_variant(self.local)

    @property
    def full_version(self) -> str:
        return f"{self.version}+{self.local}" if self.local else self.version

    @property
    def arch(self) -> Optional[str]:
        """The CPU architecture of a Linux wheel (x86_64, aarch64, ...); None for other platforms and ``any``."""
        found = [_linux(p) for p in self.platforms]
        return next((f[0] for f in found if f is not None), None)

    @property
    def glibc(self) -> Optional[str]:
        """The lowest glibc the file needs ("2.28" for manylinux_2_28); None where no tag names one."""
        floors = [f[1] for f in (_linux(p) for p in self.platforms) if f is not None and f[1] is not None]
        return min(floors, key=lambda v: tuple(int(x) for x in v.split("."))) if floors else None

    @property
    def pythons(self) -> tuple[str, ...]:
        """The Python versions the file is built for: ("3.11",), ("3.14t",); generic tags stay ("py3",)."""
        return tuple(_python(t) for t in self.python_tags)

    def runs_on(self, arch: Optional[str]) -> bool:
        """Whether the file installs on a Linux host of ``arch`` (None: any platform)."""
        return arch is None or self.arch == arch or self.platforms == ("any",)

    def supports(self, python: Optional[str]) -> bool:
        """Whether the file installs under Python ``python`` ("3.11", "3.14t"; None: any)."""
        if python is None:
            return True
        if not self._python_tag_fits(python):
            return False
        if self.requires_python:
            try:
                return _specifier(self.requires_python).contains(python.rstrip("t"), prereleases=True)
            except (InvalidSpecifier, InvalidVersion):
                return (
                    True  # a broken requires-python is the installer's problem, not a reason to hide a file
                )
        return True

    def _python_tag_fits(self, python: str) -> bool:
        if python in self.pythons:
            return True
        if any(t.startswith("py") and t[2:] == python.partition(".")[0] for t in self.python_tags):
            return True  # py3, py2.py3: pure wheels
        if self.abi_tag == "abi3" and not python.endswith(
            "t"
        ):  # the stable ABI: cp39-abi3 runs on 3.9 and later
            return any(_version_key(p) <= _version_key(python) for p in self.pythons if p[:1].isdigit())
        return False

    def to_json(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "requires_python": self.requires_python,
            "yanked": self.yanked_reason or self.yanked,
        }


#: A normalized local label: its variant (ROCm with its version), then the rest.
_LABEL = re.compile(r"(?P<variant>rocm\d+(?:\.\d+)*|[^.]*)(?:\.(?P<rest>.*))?")


def label_variant(local: str) -> str:
    """The variant a PEP 440 local label names: its first segment (``cu130.post1`` -> ``cu130``,
    ``cu117.with.pypi.cudnn`` -> ``cu117``, ``cpu.cxx11.abi`` -> ``cpu``); "" for no label."""
    return split_label(local)[0]


def split_label(local: str) -> tuple[str, str]:
    """(variant, the rest) of a local label: ``cu130.post1`` -> ("cu130", "post1"), ``cu130`` -> ("cu130", "").
    PEP 440 separates a label's segments with ``.``, ``-`` or ``_`` (normalized to ``.``); the case is folded.
    A ROCm variant keeps its version's numeric segments (``rocm6.2.4``, as its index directory is named)."""
    m = _LABEL.fullmatch(re.sub(r"[-_]", ".", local.strip().lower()))
    return (m["variant"], m["rest"] or "") if m else ("", "")


def yank_reason(value: Any) -> Optional[str]:
    """PEP 592/691 ``yanked``: None when the file is not yanked, else the reason ("" where none is given).
    JSON says ``true``/``false`` or a reason; an HTML anchor's ``data-yanked`` value is the reason."""
    if isinstance(value, str):
        return value.strip() or None
    return "" if value is True else None


def parse_wheel_filename(name: str) -> Optional[WheelFile]:
    """The wheel a file name describes, or None for anything that is not a well-formed wheel name."""
    return _parse(name, None, None, None)


def project_wheel(
    filename: str, project: str, requires_python: Optional[str] = None, yanked: Union[bool, str, None] = None
) -> Optional[WheelFile]:
    """The wheel ``filename`` names if it is one of ``project``'s (sdists and other projects give None).
    ``yanked``: True or a reason (a text, maybe empty) for a yanked file; False or None for one that is not."""
    reason = yanked if isinstance(yanked, str) else ("" if yanked else None)
    return _parse(filename, normalize(project), requires_python or None, reason)


def _parse(
    name: str, project: Optional[str], requires_python: Optional[str], yanked: Optional[str]
) -> Optional[WheelFile]:
    if not name.endswith(".whl"):
        return None
    parts = name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or not all(parts):
        return None
    if len(parts) == 6 and not parts[2][0].isdigit():
        return None  # a build tag starts with a digit
    found = normalize(parts[0])
    version = _split_version(parts[1])
    if version is None or (project is not None and found != project):
        return None
    python, abi, platform = parts[-3:]
    return WheelFile(
        filename=name,
        project=found,
        version=version[0],
        local=version[1],
        python_tags=tuple(python.split(".")),
        abi_tag=abi,
        platforms=tuple(platform.split(".")),
        requires_python=requires_python,
        yanked=yanked is not None,
        yanked_reason=yanked or "",
    )


# A version already in PEP 440's normal form, which is how indexes name their files; the regex is ten times
# quicker than packaging's parser, and a cached PyPI torch page holds a thousand names.
_INT = r"(?:0|[1-9]\d*)"
_NORMAL = re.compile(
    rf"(?P<public>{_INT}(?:\.{_INT})*(?:(?:a|b|rc){_INT})?(?:\.post{_INT})?(?:\.dev{_INT})?)"
    rf"(?:\+(?P<local>(?:[a-z0-9]*[a-z][a-z0-9]*|{_INT})(?:\.(?:[a-z0-9]*[a-z][a-z0-9]*|{_INT}))*))?"
)


def _split_version(text: str) -> Optional[tuple[str, str]]:
    """(public version, local label or "") in normal form; None for no version at all."""
    m = _NORMAL.fullmatch(text)
    if m:
        return m["public"], m["local"] or ""
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    return version.public, version.local or ""


def wheel_from_json(entry: Mapping[str, Any], project: str) -> Optional[WheelFile]:
    """The inverse of ``WheelFile.to_json`` (None for an entry that is not one of ``project``'s wheels)."""
    filename, requires = entry.get("filename"), entry.get("requires_python")
    if not isinstance(filename, str):
        return None
    return project_wheel(
        filename, project, requires if isinstance(requires, str) else None, yank_reason(entry.get("yanked"))
    )


def parse_simple_json(body: Union[bytes, str], project: str) -> list[WheelFile]:
    """The ``project`` wheels a PEP 691 JSON page lists. A body that is no such page raises ValueError."""
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise ValueError("not a PEP 691 project page (no `files` list)")
    out = []
    for entry in data["files"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise ValueError(f"a PEP 691 file entry without a filename: {str(entry)[:80]}")
        requires = entry.get("requires-python")
        wheel = project_wheel(
            entry["filename"],
            project,
            requires if isinstance(requires, str) else None,
            yank_reason(entry.get("yanked")),
        )
        if wheel is not None:
            out.append(wheel)
    return out


@functools.lru_cache(maxsize=1)
def _anchors_parser() -> type[Any]:
    """The HTML parser class for simple pages, made on first use: html.parser costs ~4 ms of every start, and a
    JSON index page (or a cached one) needs none."""
    import html.parser  # noqa: PLC0415

    class Anchors(html.parser.HTMLParser):
        """Collects (file name, attributes) of every <a>; attribute values arrive with their entities decoded."""

        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.links: list[tuple[str, dict[str, Optional[str]]]] = []
            self._open: Optional[dict[str, Optional[str]]] = None
            self._text: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
            if tag == "a":
                self._open, self._text = dict(attrs), []

        def handle_data(self, data: str) -> None:
            if self._open is not None:
                self._text.append(data)

        def handle_endtag(self, tag: str) -> None:
            if tag == "a" and self._open is not None:
                self.links.append(("".join(self._text).strip(), self._open))
                self._open = None

    return Anchors


def _href_name(href: str) -> str:
    path = urllib.parse.urlsplit(href).path
    return urllib.parse.unquote(path.rsplit("/", 1)[-1])


def parse_simple_html(body: Union[bytes, str], project: str) -> list[WheelFile]:
    """The ``project`` wheels a PEP 503 HTML page lists (the file name is the href's last path segment, else the
    anchor's text); ``data-requires-python`` and ``data-yanked`` come from the anchors."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    parser = _anchors_parser()()
    parser.feed(text)
    parser.close()
    out = []
    for label, attrs in parser.links:
        name = _href_name(attrs.get("href") or "") or label
        if not name.endswith(".whl"):
            name = label
        yanked = (attrs.get("data-yanked") or "").strip() if "data-yanked" in attrs else None
        wheel = project_wheel(name, project, attrs.get("data-requires-python"), yanked)
        if wheel is not None:
            out.append(wheel)
    return out


@dataclass(frozen=True)
class PageRead:
    """One upstream index's project page, read from its sources (after ENVBUILDER_INDEX_MIRROR)."""

    upstream: str
    sources: tuple[str, ...]
    files: tuple[WheelFile, ...] = ()
    read_at: float = 0.0  # epoch seconds; the oldest of its sources' reads
    cached: bool = False  # every URL source came from the cache
    error: Optional[str] = None
    #: Why the cache stands in: the read failed now (the page is still ok, with what was read before).
    failed: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        """``read from SOURCES at T (cached)`` for plan output."""
        when = datetime.datetime.fromtimestamp(self.read_at, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        )
        line = f"read from {', '.join(self.sources)} at {when}" + (" (cached)" if self.cached else "")
        return line + (f"; read again now, it failed: {self.failed}" if self.failed else "")

    def to_json(self) -> dict[str, Any]:
        versions = sorted({f.version for f in self.files}, key=_version_key)
        return {
            "upstream": self.upstream,
            "sources": list(self.sources),
            "read_at": self.read_at,
            "cached": self.cached,
            "error": self.error,
            "failed": self.failed,
            "files": len(self.files),
            "versions": versions,
        }


def _key(url: str) -> str:
    return url.rstrip("/")


@dataclass(frozen=True)
class IndexFacts:
    """Every page read for a plan. No pages means "the shipped table only"; ``fallback`` says why, if known."""

    pages: Mapping[str, PageRead] = field(default_factory=dict)
    fallback: Optional[str] = None

    def page(self, upstream: str) -> Optional[PageRead]:
        """The page read for ``upstream`` (trailing ``/`` ignored), if it was read without error."""
        found = self.pages.get(upstream) or next(
            (p for k, p in self.pages.items() if _key(k) == _key(upstream)), None
        )
        return found if found is not None and found.ok else None

    def failure(self, upstream: str) -> Optional[str]:
        """Why the page of ``upstream`` could not be read; None where it was read, or never asked for."""
        found = self.pages.get(upstream) or next(
            (p for k, p in self.pages.items() if _key(k) == _key(upstream)), None
        )
        return found.error if found is not None else None

    def files_for(
        self, upstream: str, version: str, arch: Optional[str] = None, python: Optional[str] = None
    ) -> list[WheelFile]:
        """The files of ``version`` (public, or full with ``+local``) that install on ``arch`` under ``python``."""
        return [f for f in self._files(upstream, arch, python) if _same_version(f, version)]

    def versions(
        self, upstream: str, arch: Optional[str] = None, python: Optional[str] = None, yanked: bool = False
    ) -> list[str]:
        """The public versions with a file for ``arch`` and ``python``, oldest first; yanked files count only
        with ``yanked=True`` (installers skip them unless pinned)."""
        found = {f.version for f in self._files(upstream, arch, python) if yanked or not f.yanked}
        return sorted(found, key=_version_key)

    def locals(
        self, upstream: str, version: str, arch: Optional[str] = None, python: Optional[str] = None
    ) -> list[str]:
        """The local labels the files of ``version`` carry ("" for none), sorted."""
        return sorted({f.local for f in self.files_for(upstream, version, arch, python)})

    def _files(self, upstream: str, arch: Optional[str], python: Optional[str]) -> Iterable[WheelFile]:
        page = self.page(upstream)
        files = page.files if page is not None else ()
        return (f for f in files if f.runs_on(arch) and f.supports(python))

    def to_json(self) -> dict[str, Any]:
        return {"fallback": self.fallback, "pages": [p.to_json() for p in self.pages.values()]}


def _same_version(wheel: WheelFile, version: str) -> bool:
    public, _, local = version.partition("+")
    try:
        same = Version(public) == Version(wheel.version)
    except InvalidVersion:
        same = public == wheel.version
    return same and (not local or local == wheel.local)
