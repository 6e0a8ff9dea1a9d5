"""Filling a site mirror: each file the locks name downloaded once, its sha256 checked before it takes its name,
and the simple layout's pages (and a conda channel's repodata.json) written over them: the network half of the site mirror (what goes where is
:mod:`envbuilder.resolver.sitemirror`'s, pure).

A download goes to a hidden temporary name beside its place and is renamed only once its hash matches the lock, so
an interrupted or refused download never leaves a file under its final name; a file already there with the
locked hash is not downloaded again, so a rerun finishes what an earlier one began.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from envbuilder import __version__
from envbuilder.core.errors import LockError, NetworkError
from envbuilder.core.structs import dataclass
from envbuilder.resolver import sitemirror
from envbuilder.resolver.indexfetch import _opener  # one home for the proxies an index read honours
from envbuilder.resolver.sitemirror import MirrorFile
from envbuilder.system import fsutil

TIMEOUT_S = 120.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Filled:
    downloaded: tuple[str, ...]
    skipped: tuple[str, ...]
    bytes_downloaded: int
    #: Every file the mirror holds now: these locks' and those earlier runs recorded.
    held: int


def fill(
    files: Sequence[MirrorFile],
    root: Path,
    layout: str,
    env: Mapping[str, str],
    log: Callable[[str], None] = lambda _: None,
) -> Filled:
    """Every file of ``files`` under ``root`` in ``layout``, and (simple) the index pages over them and over what
    earlier runs put there (the manifest records it)."""
    downloaded: list[str] = []
    skipped: list[str] = []
    total = 0
    with fsutil.disk_errors((root, "mirror to another directory with --to DIR")):
        recorded = _recorded(root, layout)
        held = sitemirror.merged([f for f in recorded if (root / f.relpath(layout)).is_file()], files)
        for f in files:
            dest = root / f.relpath(layout)
            if dest.is_file() and not dest.is_symlink() and _sha256(dest) == f.sha256:
                skipped.append(f.filename)
                continue
            size = _download(f, dest, env)
            log(f"{f.filename} ({size} bytes)")
            downloaded.append(f.filename)
            total += size
        if any(f.subdir for f in held):
            _index_channel(root / sitemirror.CONDA)
        written = sitemirror.pages(held) if layout == "simple" else {}
        written[sitemirror.MANIFEST] = sitemirror.manifest(held, layout)
        for rel, text in written.items():
            fsutil.write_atomic(root / rel, text.encode())
    return Filled(tuple(downloaded), tuple(skipped), total, len(held))


def _index_channel(channel: Path) -> None:
    """repodata.json for every subdir of the mirror's conda channel, written by py-rattler's indexer."""
    try:
        import asyncio  # noqa: PLC0415 - only a mirror with conda packages needs them

        from rattler.index import index_fs  # noqa: PLC0415
    except ImportError:
        raise LockError(
            "the locks name conda packages, and the mirror's channel is indexed with py-rattler, which is not "
            "installed here",
            hint="install envbuilder on Python 3.10 or newer (py-rattler comes with it), or mirror wheel locks only",
        ) from None
    fsutil.mkdirs(channel / "noarch")  # conda asks every channel for noarch too
    asyncio.run(index_fs(channel, write_zst=False, write_shards=False, force=True))


def _recorded(root: Path, layout: str) -> list[MirrorFile]:
    path = root / sitemirror.MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return sitemirror.read_manifest(text, str(path), layout)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(f: MirrorFile, dest: Path, env: Mapping[str, str]) -> int:
    """``f`` at ``dest``, its hash checked; nothing under ``dest``'s name unless it matches."""
    fsutil.mkdirs(dest.parent)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        digest, size = _fetch(f, tmp, env)
        if digest != f.sha256:
            raise LockError(
                f"{f.filename} from {f.url} has sha256 {digest}, but {', '.join(f.locks)} locks {f.sha256}",
                hint="the index serves other bytes than when the lock was made: lock again "
                "(envbuilder lock NAME) if the change is expected, else ask the index's keepers",
            )
        tmp.replace(dest)
        return size
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _fetch(f: MirrorFile, tmp: Path, env: Mapping[str, str]) -> tuple[str, int]:
    if not f.url.startswith(("http://", "https://", "file://")):
        raise LockError(
            f"{', '.join(f.locks)}: {f.filename}: only http(s) and file URLs are downloaded: {f.url}"
        )
    request = urllib.request.Request(f.url, headers={"User-Agent": f"envbuilder/{__version__}"})  # noqa: S310
    digest = hashlib.sha256()
    size = 0
    try:
        with _opener(f.url, env).open(request, timeout=TIMEOUT_S) as response, tmp.open("wb") as out:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except urllib.error.HTTPError as e:
        raise _unreachable(f, f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as e:
        raise _unreachable(f, str(getattr(e, "reason", e))) from None
    return digest.hexdigest(), size


def _unreachable(f: MirrorFile, cause: str) -> NetworkError:
    error = NetworkError(
        ("envbuilder", "mirror"),
        1,
        "",
        url=f.url,
        cause=cause,
        hint="run envbuilder mirror where the index is reachable, then copy the directory to the site",
    )
    error.message = f"could not download {f.filename} (named by {', '.join(f.locks)}) from {f.url}: {cause}"
    error.args = (error.message,)
    return error
