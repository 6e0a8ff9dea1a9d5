"""Reading wheel indexes for a plan (I/O): the project page of each upstream index, through the site's mirrors.

Each upstream index URL (``https://download.pytorch.org/whl/cu130``, PyPI) goes through ENVBUILDER_INDEX_MIRROR
to the sources an install would really use. A URL source is read once (``GET <source>/<project>/``, PEP 691 JSON
asked for, PEP 503 HTML understood), all URL sources in parallel. A directory or ``file://`` source is listed (a
``file://`` simple index is read from its ``<project>/index.html``); that needs no network, so it happens offline
too. A ``pypi`` target beside other targets of a non-PyPI upstream (``https://download.pytorch.org/whl/=URL,pypi``)
is where the install finds dependencies, not torch, so it is not read for that upstream.

What a read can mean:
- 200 with a page: the files listed on it, of ``project`` only.
- 404: the index exists but has no such project: an ok page with no files (download.pytorch.org answers a variant
  it never built that way), so the resolver learns "nothing here" rather than "unknown".
- Anything else (another HTTP status, no connection, a timeout, a body that is no index page): the page gets
  ``error`` and the resolver uses the shipped table for it. No exception escapes for these.

Answers are cached under ``<home>/cache/index/<sha256 of the page URL>.json`` (directory 0700, files 0600, written
atomically) for ``ttl`` seconds; ``refresh`` reads again anyway. A read that fails (no network on this node, the
index down) falls back on the copy read before, of any age, where it was read after the shipped table's date: it
is then the newer knowledge, and the page says that its read failed and when its copy was made. Offline
(``offline=True`` or ENVBUILDER_OFFLINE set to 1/true) no URL is read: fresh cache entries are still used
(``refresh`` then changes nothing), other URL pages get an error saying why.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envbuilder.core import settings
from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass
from envbuilder.resolver import knowledge, matrix, mirror
from envbuilder.resolver.gates import TorchRequest
from envbuilder.resolver.indexfacts import (
    IndexFacts,
    PageRead,
    WheelFile,
    normalize,
    parse_simple_html,
    project_wheel,
    wheel_from_json,
)
from envbuilder.system import fsutil

OFFLINE_VAR = "ENVBUILDER_OFFLINE"
TIMEOUT_VAR = "ENVBUILDER_INDEX_TIMEOUT"
TTL_S = 86400.0
TIMEOUT_S = 10.0
CACHE_VERSION = 2  # 2: a yanked file keeps its reason
CACHE_FILE_MODE = 0o600
CACHE_DIR_MODE = 0o700


@dataclass(frozen=True)
class Read:
    """One source's answer: the files it lists, when they were read, from the cache or not, or why it failed."""

    files: tuple[WheelFile, ...] = ()
    read_at: float = 0.0
    cached: bool = False
    error: Optional[str] = None
    #: Why this (cached) answer stands in for a read that failed now.
    failed: Optional[str] = None


def read(
    upstreams: Sequence[str],
    env: Mapping[str, str],
    *,
    home: Path,
    refresh: bool = False,
    offline: bool = False,
    ttl: float = TTL_S,
    project: str = "torch",
) -> IndexFacts:
    """The ``project`` pages of ``upstreams`` as seen through the mirrors in ``env``; see the module docstring."""
    rules = mirror.from_env(env)
    why_offline = "--offline" if offline else offline_reason(env)
    sources = {up: mirror.served_from(up, rules) for up in dict.fromkeys(upstreams)}
    urls = list(dict.fromkeys(u for found in sources.values() for u in found if not _is_dir(u)))
    cache = _Cache(settings.index_cache_dir(home), ttl)
    reads = _read_urls(urls, project, env, cache, refresh=refresh, why_offline=why_offline)
    for found in sources.values():
        reads.update({d: _read_dir(d, project) for d in found if _is_dir(d) and d not in reads})
    pages = {up: _page(up, found, reads) for up, found in sources.items()}
    return IndexFacts(pages, _fallback(pages, why_offline))


def read_torch(
    request: Optional[TorchRequest], env: Mapping[str, str], *, refresh: bool = False, offline: bool = False
) -> Optional[IndexFacts]:
    """What the wheel indexes an install of ``request`` will use say about torch (through the mirror rules in
    ``env``, cached in the envbuilder home); None when nothing is asked of torch (it comes from the site)."""
    if request is None:
        return None
    urls = knowledge.upstreams(request, matrix.load_matrix())
    # read honours ENVBUILDER_OFFLINE itself, and names it as the reason.
    return read(urls, env, home=settings.home(env), refresh=refresh, offline=offline)


def offline_reason(env: Mapping[str, str]) -> Optional[str]:
    """``ENVBUILDER_OFFLINE=1`` when the environment asks for offline plans, else None."""
    value = env.get(OFFLINE_VAR, "")
    return f"{OFFLINE_VAR}={value}" if value.strip().lower() in ("1", "true", "yes", "on") else None


def timeout(env: Mapping[str, str]) -> float:
    text = env.get(TIMEOUT_VAR, "").strip()
    try:
        value = float(text) if text else TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(
            f"{TIMEOUT_VAR}={text!r} is not a positive number of seconds", hint=f"e.g. {TIMEOUT_VAR}=10"
        )
    return value


def _key(url: str) -> str:
    return url.rstrip("/")


def _is_dir(source: str) -> bool:
    return source.startswith(("/", "file://"))


def _page_url(source: str, project: str) -> str:
    return f"{_key(source)}/{normalize(project)}/"


def _page(upstream: str, found: Sequence[str], reads: Mapping[str, Read]) -> PageRead:
    parts = [reads[s] for s in found]
    files = {f.filename: f for r in parts for f in r.files}
    url_parts = [reads[s] for s in found if not _is_dir(s)]
    return PageRead(
        upstream=upstream,
        sources=tuple(found),
        files=tuple(files.values()),
        read_at=min((r.read_at for r in parts), default=time.time()),
        cached=bool(url_parts) and all(r.cached for r in url_parts),
        error="; ".join(r.error for r in parts if r.error) or None,
        failed="; ".join(r.failed for r in parts if r.failed) or None,
    )


def _fallback(pages: Mapping[str, PageRead], why_offline: Optional[str]) -> Optional[str]:
    """Why only the shipped table can be used: set when pages were asked for and none could be read."""
    if not pages or any(p.ok for p in pages.values()):
        return None
    if why_offline:
        return why_offline
    errors = [p.error or "" for p in pages.values()]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"every index read failed: {errors[0]}{more}"


def _read_urls(
    urls: Sequence[str],
    project: str,
    env: Mapping[str, str],
    cache: _Cache,
    *,
    refresh: bool,
    why_offline: Optional[str],
) -> dict[str, Read]:
    reads: dict[str, Read] = {}
    for url in urls:
        hit = cache.get(_page_url(url, project), project) if why_offline or not refresh else None
        if hit is not None:
            reads[url] = hit
    todo = [u for u in urls if u not in reads]
    if why_offline:
        note = f"not read ({why_offline}) and no fresh copy in the cache"
        return {
            **reads,
            **{u: Read(read_at=time.time(), error=f"{_page_url(u, project)}: {note}") for u in todo},
        }
    if not todo:
        return reads
    # The network parts (urllib, http.client, threads) only when a page is read: a cached plan imports none.
    from envbuilder.resolver import indexfetch  # noqa: PLC0415

    pages = [_page_url(u, project) for u in todo]
    for url, page, got in zip(todo, pages, indexfetch.fetch_all(pages, project, env, timeout(env))):
        if got.error is None:
            cache.put(page, got)
        reads[url] = got if got.error is None else _kept(cache, page, project, got.error) or got
    return reads


def _kept(cache: _Cache, page: str, project: str, error: str) -> Optional[Read]:
    """For a page whose read failed (a node without a network, the index down, a refresh): the copy read before,
    of any age, where it is newer than the shipped table, which would stand in for it otherwise."""
    hit = cache.get(page, project, any_age=True)
    table = datetime.datetime.combine(
        datetime.date.fromisoformat(matrix.load_matrix().as_of), datetime.time(), datetime.timezone.utc
    )
    if hit is None or hit.read_at < table.timestamp():
        return None
    return replace(hit, failed=error)


def _read_dir(source: str, project: str) -> Read:
    """A wheel directory's ``project`` files (``--find-links``), or a ``file://`` simple index's page."""
    path = Path(urllib.parse.unquote(urllib.parse.urlsplit(source).path) if "://" in source else source)
    now = time.time()
    page = path / normalize(project) / "index.html"
    try:
        if page.is_file():
            return Read(tuple(parse_simple_html(page.read_bytes(), project)), now)
        names = sorted(p.name for p in path.iterdir())
    except OSError as e:
        return Read(read_at=now, error=f"{source}: cannot list ({e.strerror or e})")
    wheels = (project_wheel(n, project) for n in names)
    return Read(tuple(w for w in wheels if w is not None), now)


class _Cache:
    """Pages read before, one JSON file per page URL; an unreadable or foreign entry counts as absent."""

    def __init__(self, root: Path, ttl: float) -> None:
        self.root = root
        self.ttl = ttl

    def _path(self, url: str) -> Path:
        return self.root / f"{hashlib.sha256(url.encode()).hexdigest()}.json"

    def get(self, url: str, project: str, *, any_age: bool = False) -> Optional[Read]:
        try:
            data = json.loads(self._path(url).read_bytes())
            read_at = float(data["read_at"])
            entries = data["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if data.get("version") != CACHE_VERSION or data.get("url") != url:
            return None
        if not any_age and not 0 <= time.time() - read_at < self.ttl:
            return None
        files = (wheel_from_json(e, project) for e in entries if isinstance(e, dict))
        return Read(tuple(f for f in files if f is not None), read_at, cached=True)

    def put(self, url: str, got: Read) -> None:
        data = {
            "version": CACHE_VERSION,
            "url": url,
            "read_at": got.read_at,
            "files": [f.to_json() for f in got.files],
        }
        try:  # the cache only saves time; a read-only home must not fail a plan
            self.root.mkdir(parents=True, exist_ok=True, mode=CACHE_DIR_MODE)
            self.root.chmod(CACHE_DIR_MODE)
            fsutil.write_atomic(self._path(url), json.dumps(data).encode(), mode=CACHE_FILE_MODE)
        except OSError as exc:
            fsutil.cache_unwritable(self.root, exc)
