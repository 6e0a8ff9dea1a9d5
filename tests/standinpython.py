"""One CPython download for the managed-python tests (python.source = "managed"), laid out as
python-build-standalone's releases are (``<release>/<file>``), so that a loopback server stands in for the
download index through uv's own mirror setting. Made once per machine under /var/cache/envbuilder-tests
(``ENVBUILDER_TEST_CACHE``) by ``python tests/standinpython.py`` (tests/prepare.py runs it); the tests reach
loopback only.

First choice is the real archive: the ``install_only_stripped`` CPython 3.12 build that this machine's uv lists
(about 30 MB), from uv's own download URL. Where that host cannot be reached (these machines reach PyPI, Debian
and npm only), the archive is made here from a local CPython 3.12 with a shared libpython (pyenv's), in the same
layout (``python/bin``, ``python/lib``; the interpreter's run path made ``$ORIGIN/../lib`` with patchelf, as the
real builds have it; stripped, without its tests: about 7 MB). uv checks every download against the sha256 its
built-in list pins, which only the real archive has; for the stand-in a downloads list in uv's JSON format names
its own sha256 (``downloads.json``, given to envbuilder as ``python_downloads``), keeping the release URL that
the mirror setting replaces. ``manifest.json`` says which one is here."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from contextlib import suppress
from pathlib import Path
from typing import Any, Optional

import armtwin

DIR = armtwin.CACHE / "python-downloads"
MANIFEST = DIR / "manifest.json"
LISTING = "downloads.json"
MINOR = "3.12"
#: The release URL of uv's downloads list, which a mirror stands for (resolver/mirror.py PYTHON_UPSTREAMS).
UPSTREAM = "https://github.com/astral-sh/python-build-standalone/releases/download"
#: The release label of a stand-in archive (a real archive keeps its own).
STANDIN_RELEASE = "20260101"
#: What this module makes (2: with ensurepip, as the real builds have it); a cache made otherwise is made again.
LAYOUT = 2


def load() -> tuple[Optional[dict[str, Any]], str]:
    """(the manifest, "") where the download is here, else (None, why not)."""
    try:
        manifest: dict[str, Any] = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return (
            None,
            f"no CPython download in {DIR}: run `python tests/standinpython.py` (tests/prepare.py does)",
        )
    if manifest.get("layout") != LAYOUT:
        return None, f"{DIR} was made by an older tests/standinpython.py: run it again"
    if not (DIR / manifest["release"] / manifest["file"]).is_file():
        return None, f"{DIR} lost its archive: run `python tests/standinpython.py` again"
    return manifest, ""


def prepare() -> dict[str, Any]:
    found, _ = load()
    if found is not None:
        print(f"standinpython: {DIR} holds {found['file']} ({found['origin']})")
        return found
    DIR.mkdir(parents=True, exist_ok=True)
    manifest = {**(_real() or _standin()), "layout": LAYOUT}
    MANIFEST.write_text(json.dumps(manifest, indent=1))
    print(f"standinpython: {DIR} now holds {manifest['file']} ({manifest['origin']})")
    return manifest


def _uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def _real() -> Optional[dict[str, Any]]:
    """The real archive of the newest CPython 3.12 this uv lists, where its host answers; else None."""
    res = subprocess.run(
        [_uv(), "python", "list", "--all-versions", "--only-downloads", "--output-format", "json", MINOR],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "UV_NO_CONFIG": "1", "HOME": str(Path.home())},
    )
    rows = json.loads(res.stdout) if res.returncode == 0 else []
    arch = platform.machine()
    url = next(
        (
            r["url"]
            for r in rows
            if r.get("os") == "linux"
            and r.get("arch") == arch
            and r.get("libc") == "gnu"
            and r.get("variant") == "default"
            and r.get("url")
        ),
        None,
    )
    if url is None:
        return None
    release, name = urllib.parse.unquote(url).split("/")[-2:]
    target = DIR / release / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(target, "wb") as out:  # noqa: S310 - uv's URL
            shutil.copyfileobj(response, out)
    except OSError as exc:
        target.unlink(missing_ok=True)
        with suppress(OSError):
            target.parent.rmdir()
        print(f"standinpython: {url} cannot be read here ({exc}); making a stand-in", file=sys.stderr)
        return None
    version = name.split("-")[1].split("+")[0]
    return {
        "origin": "python-build-standalone",
        "version": version,
        "release": release,
        "file": name,
        "listing": None,
    }


def _source() -> Path:
    """A local CPython 3.12 installation with a shared libpython: its prefix."""
    for candidate in sorted((Path.home() / ".pyenv" / "versions").glob(f"{MINOR}.*"), reverse=True):
        if (candidate / "lib" / f"libpython{MINOR}.so.1.0").is_file() and (
            candidate / "bin" / f"python{MINOR}"
        ).is_file():
            return candidate
    raise RuntimeError(f"no CPython {MINOR} with a shared libpython under ~/.pyenv/versions for the stand-in")


def _standin() -> dict[str, Any]:
    src = _source()
    patchelf = shutil.which("patchelf")
    if patchelf is None:
        raise RuntimeError(
            "patchelf is not installed (apt-get install patchelf): the stand-in cannot be made"
        )
    version = subprocess.run(
        [str(src / "bin" / f"python{MINOR}"), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    name = f"cpython-{version}+{STANDIN_RELEASE}-{platform.machine()}-unknown-linux-gnu-install_only_stripped.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "python"
        _copy_install(src, root, patchelf)
        target = DIR / STANDIN_RELEASE / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(target, "w:gz") as tar:
            tar.add(root, arcname="python")
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    _write_listing(version, name, digest)
    return {
        "origin": f"stand-in made from {src}",
        "version": version,
        "release": STANDIN_RELEASE,
        "file": name,
        "listing": LISTING,
    }


_SKIPPED = ("test", "idlelib", "tkinter", "turtledemo", "site-packages", "__pycache__")


def _copy_install(src: Path, root: Path, patchelf: str) -> None:
    """The install-only layout: bin/python3.12 (+ python3, python), lib/libpython, the standard library."""
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    exe = root / "bin" / f"python{MINOR}"
    shutil.copy2(src / "bin" / f"python{MINOR}", exe)
    for link in ("python3", "python"):
        (root / "bin" / link).symlink_to(exe.name)
    lib = root / "lib" / f"libpython{MINOR}.so.1.0"
    shutil.copy2(src / "lib" / lib.name, lib)
    (root / "lib" / f"libpython{MINOR}.so").symlink_to(lib.name)
    stdlib = src / "lib" / f"python{MINOR}"
    shutil.copytree(
        stdlib,
        root / "lib" / stdlib.name,
        symlinks=True,
        ignore=lambda d, names: [n for n in names if n in _SKIPPED or n.startswith("config-")],
    )
    (root / "lib" / stdlib.name / "site-packages").mkdir()
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN/../lib", str(exe)], check=True)
    shared = [exe, lib, *sorted((root / "lib" / stdlib.name / "lib-dynload").glob("*.so"))]
    subprocess.run(["strip", "--strip-unneeded", *map(str, shared)], check=True)


def _write_listing(version: str, name: str, digest: str) -> None:
    """The stand-in in uv's downloads-list format, at the release URL the mirror setting replaces."""
    major, minor, patch = (int(p) for p in version.split("."))
    arch = platform.machine()
    listing = {
        f"cpython-{version}-linux-{arch}-gnu": {
            "name": "cpython",
            "arch": {"family": arch, "variant": None},
            "os": "linux",
            "libc": "gnu",
            "major": major,
            "minor": minor,
            "patch": patch,
            "prerelease": "",
            "url": f"{UPSTREAM}/{STANDIN_RELEASE}/{urllib.parse.quote(name)}",
            "sha256": digest,
            "variant": None,
            "build": STANDIN_RELEASE,
        }
    }
    (DIR / LISTING).write_text(json.dumps(listing, indent=1))


if __name__ == "__main__":
    prepare()
