"""Test fixtures for installs: small real wheels and sdists built here, and a PEP 503 index served over HTTP on
127.0.0.1 (the same simple pages pip and uv read from PyPI or download.pytorch.org)."""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import io
import re
import tarfile
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Optional


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(
    out: Path,
    name: str,
    version: str,
    modules: Mapping[str, str],
    *,
    requires: Sequence[str] = (),
    scripts: Mapping[str, str] = {},
    data: Mapping[str, str] = {},
    tag: str = "py3-none-any",
) -> Path:
    """A wheel: ``modules`` maps file paths inside site-packages to their text;
    ``scripts`` maps console-script names to ``module:function``; ``data`` maps paths under the wheel's
    ``.data`` directory (``data/share/x``, ``scripts/tool``) to their text. ``tag`` other than the default makes
    a platform wheel (``cp311-cp311-manylinux_2_28_aarch64``) that only installers for that platform take."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    files: dict[str, bytes] = {path: text.encode() for path, text in modules.items()}
    files.update({f"{dist}.data/{path}": text.encode() for path, text in data.items()})
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    files[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    purelib = "true" if tag == "py3-none-any" else "false"
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: envbuilder-tests\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n"
    ).encode()
    if scripts:
        entry = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        files[f"{info}/entry_points.txt"] = entry.encode()
    record = [_record_line(p, d) for p, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, d in files.items():
            zf.writestr(p, d)
    return path


def demo_wheels(out: Path, *, tool: bool = True) -> None:
    """The small wheels several test indexes share, built in ``out``: ebdemo 1.0 (which needs ebdep), ebdep 2.0 and,
    with ``tool``, ebtool 1.0, whose console script prints the prefix it runs from."""
    build_wheel(out, "ebdemo", "1.0", {"ebdemo/__init__.py": "VERSION = '1.0'\n"}, requires=["ebdep"])
    build_wheel(out, "ebdep", "2.0", {"ebdep/__init__.py": "WHO = 'dep'\n"})
    if tool:
        build_wheel(
            out,
            "ebtool",
            "1.0",
            {"ebtool/__init__.py": "def main():\n    import sys\n    print('ebtool from', sys.prefix)\n"},
            scripts={"ebtool": "ebtool:main"},
        )


def build_sdist(out: Path, name: str, version: str, setup_py: str) -> Path:
    """A setuptools sdist whose setup.py is ``setup_py`` (used to see the build environment)."""
    dist = f"{name}-{version}"
    files = {
        "setup.py": setup_py,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n',
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            ti = tarfile.TarInfo(f"{dist}/{rel}")
            ti.size = len(data)
            ti.mtime = int(time.time())
            tf.addfile(ti, io.BytesIO(data))
    return path


def _project(filename: str) -> str:
    if filename.endswith(".whl"):
        return normalize(filename.split("-", maxsplit=1)[0])
    return normalize(filename.rsplit("-", 1)[0])


class Index:
    """A PEP 503 simple index over a directory of distributions, served at several roots at once
    (``/simple/`` for PyPI, ``/whl/<variant>/`` for download.pytorch.org). ``gate`` holds downloads of the named
    project until it is set, so tests can stop a create in the middle of an install. ``rate`` (bytes a second)
    throttles the files' downloads, as a slow link would; ``sending`` names the files on their way meanwhile.
    ``max_age`` (seconds) sends the project pages with the ``Cache-Control`` PyPI sends them with (600 there), so
    an installer's warm cache uses them without asking again; without it every page is asked for each time."""

    def __init__(self, files: Path, rate: Optional[float] = None, max_age: Optional[int] = None) -> None:
        self.files = files
        self.url = ""
        self.rate = rate
        self.max_age = max_age
        self.sending: set[str] = set()
        self.gate: dict[str, threading.Event] = {}
        self.requested: list[str] = []
        self._digests: dict[tuple[str, int], str] = {}
        self._metadata: dict[str, bytes] = {}

    def cache_control(self) -> Optional[str]:
        """The Cache-Control of a project page (None: the header is not sent)."""
        return None if self.max_age is None else f"max-age={self.max_age}, public"

    def hold(self, project: str) -> threading.Event:
        event = threading.Event()
        self.gate[normalize(project)] = event
        return event

    def digest(self, f: Path) -> str:
        key = (f.name, f.stat().st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = hashlib.sha256(f.read_bytes()).hexdigest()
        return self._digests[key]

    def metadata(self, wheel: Path) -> Optional[bytes]:
        """The wheel's METADATA, served beside it as PyPI does (PEP 658), so resolvers need not fetch the wheel."""
        if wheel.name not in self._metadata:
            with zipfile.ZipFile(wheel) as zf:
                name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
                self._metadata[wheel.name] = zf.read(name) if name else b""
        return self._metadata[wheel.name] or None

    def page(self, project: str) -> Optional[bytes]:
        links = []
        for f in sorted(self.files.iterdir()):
            if f.is_file() and _project(f.name) == project:
                attrs = ""
                meta = self.metadata(f) if f.name.endswith(".whl") else None
                if meta:
                    meta_hash = hashlib.sha256(meta).hexdigest()
                    attrs = f' data-dist-info-metadata="sha256={meta_hash}" data-core-metadata="sha256={meta_hash}"'
                href = f"/files/{urllib.parse.quote(f.name)}#sha256={self.digest(f)}"
                links.append(f'<a href="{href}"{attrs}>{html.escape(f.name)}</a><br>')
        if not links:
            return None
        return ("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n").encode()


def _handler(index: Index) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._get(head=True)

        def do_GET(self) -> None:
            self._get(head=False)

        def _get(self, head: bool) -> None:
            path = urllib.parse.unquote(self.path.split("?", 1)[0])
            index.requested.append(f"{'HEAD' if head else 'GET'} {path}")
            if path.startswith("/files/") and path.endswith(".whl.metadata"):
                f = index.files / Path(path).name[: -len(".metadata")]
                return _reply(self, index.metadata(f) if f.is_file() else None, "text/plain", head)
            if path.startswith("/files/"):
                return self._file(index.files / Path(path).name, head)
            parts = [p for p in path.split("/") if p]
            if parts and (parts[0] == "simple" or parts[0] == "whl") and len(parts) >= 2:
                project = normalize(parts[-1])
                return _reply(self, index.page(project), "text/html", head, cache=index.cache_control())
            return _reply(self, None, "text/plain", head)

        def _file(self, f: Path, head: bool) -> None:
            """A distribution's download: held while its project's gate is shut, trickled at ``rate``."""
            gate = index.gate.get(_project(f.name))
            if gate is not None and not head:
                gate.wait(60)
            if index.rate and f.is_file() and not head:
                return _trickle(self, index, f)
            return _reply(self, f.read_bytes() if f.is_file() else None, "application/octet-stream", head)

    return Handler


def _trickle(h: http.server.BaseHTTPRequestHandler, index: Index, f: Path) -> None:
    """``f`` sent at ``index.rate`` bytes a second, in chunks of a tenth of a second each."""
    body = f.read_bytes()
    h.send_response(200)
    h.send_header("Content-Type", "application/octet-stream")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    chunk = max(int((index.rate or 0) / 10), 1)
    index.sending.add(f.name)
    try:
        with suppress(BrokenPipeError, ConnectionResetError):
            for at in range(0, len(body), chunk):
                h.wfile.write(body[at : at + chunk])
                h.wfile.flush()
                time.sleep(0.1)
    finally:
        index.sending.discard(f.name)


def _reply(
    h: http.server.BaseHTTPRequestHandler,
    body: Optional[bytes],
    ctype: str,
    head: bool = False,
    cache: Optional[str] = None,
) -> None:
    """``body`` (404 where None) with its headers; ``cache`` as its Cache-Control."""
    if body is None:
        h.send_response(404)
        h.end_headers()
        return
    h.send_response(200)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    if cache:
        h.send_header("Cache-Control", cache)
    h.end_headers()
    if head:
        return
    with suppress(BrokenPipeError, ConnectionResetError):
        h.wfile.write(body)


@contextmanager
def serve(files: Path, rate: Optional[float] = None, max_age: Optional[int] = None) -> Iterator[Index]:
    index = Index(files, rate, max_age)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield index
    finally:
        for event in index.gate.values():
            event.set()
        server.shutdown()
        server.server_close()


def mirror_env(index: Index) -> str:
    """ENVBUILDER_INDEX_MIRROR sending PyPI and download.pytorch.org to the test index."""
    return f"https://download.pytorch.org/whl/={index.url}/whl/ pypi={index.url}/simple/"
