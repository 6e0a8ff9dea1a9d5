"""A fixture HTTP server on 127.0.0.1 imitating download.pytorch.org and PyPI, and stand-in torch wheels.

Every root serves its OWN files, as the real indexes do: ``/whl/cpu/``, ``/whl/cu126/``, ``/whl/cu130/``,
``/whl/cu132/``, ``/whl/nightly/cu130/`` (download.pytorch.org's variant indexes) and ``/simple/`` (PyPI, also for
dependencies: ``/simple/<project>/``). A project page is PEP 691 JSON when the Accept header asks for it and PEP 503
HTML otherwise (``html_only`` makes a root answer HTML whatever is asked); files download from
``/<root>/<file name>`` with their core metadata beside them (PEP 658), so uv and pip install from it. Every request
is logged in ``requested`` (``GET /whl/cu130/torch/ json``).

``pytorch_like`` builds a layout with the shapes the resolver must handle: a release newer than any table (2.16.0),
a removed variant (no cu126 for 2.15 and 2.16), files for one architecture only (cu126 is x86_64 only), a nightly
root whose oldest dated build was pruned, and PyPI's default builds carrying no local label.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from wheelindex import build_wheel, normalize

JSON_TYPE = "application/vnd.pypi.simple.v1+json"

STABLE = ("2.13.0", "2.14.1", "2.15.0", "2.16.0")
#: The release newer than any table.
NEWEST = "2.16.0"
#: Variants per release, as download.pytorch.org has them (cu126 was dropped with 2.15).
VARIANTS = {
    "2.13.0": ("cpu", "cu126", "cu130"),
    "2.14.1": ("cpu", "cu126", "cu130", "cu132"),
    "2.15.0": ("cpu", "cu130", "cu132"),
    "2.16.0": ("cpu", "cu130", "cu132"),
}
#: Variants with aarch64 files; the others have x86_64 files only.
AARCH64 = ("cpu", "cu130", "cu132")
CUDA = {"cpu": None, "cu126": "12.6", "cu130": "13.0", "cu132": "13.2"}
ARCH_FLAGS = {
    "cpu": "",
    "cu126": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
    "cu130": "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
    "cu132": "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
}
#: PyPI's default build per release (its files carry no local label).
PYPI_DEFAULT = {"2.13.0": "cu130", "2.14.1": "cu130", "2.15.0": "cu132", "2.16.0": "cu132"}
REQUIRES_PYTHON = {"2.13.0": ">=3.10", "2.14.1": ">=3.10", "2.15.0": ">=3.11", "2.16.0": ">=3.11"}
PYTHONS = {
    "2.13.0": ("cp310", "cp311", "cp312", "cp313", "cp314", "cp314t"),
    "2.14.1": ("cp310", "cp311", "cp312", "cp313", "cp314", "cp314t"),
    "2.15.0": ("cp311", "cp312", "cp313", "cp314", "cp314t", "cp315", "cp315t"),
    "2.16.0": ("cp311", "cp312", "cp313", "cp314", "cp314t", "cp315", "cp315t"),
}
NIGHTLIES = ("2.16.0.dev20261101", "2.16.0.dev20261115", "2.16.0.dev20261122")
#: A dated nightly that the nightly root no longer holds (pruned).
NIGHTLY_PRUNED = "2.16.0.dev20260815"


def build_torch_wheel(
    out: Path, version: str, local: str, cuda: Optional[str], arch_flags: str, *, tag: str
) -> Path:
    """An installable STAND-IN torch wheel: a CUDA torch wheel cannot exist on this CPU machine (nor would a
    4 GB file help a test), so this one carries only what an installed build is checked by, read without a GPU:
    the version with its local label (``2.15.0+cu130``; ``local=""`` gives PyPI's unlabelled name), ``torch.version``
    (``__version__``, ``cuda``: None for a CPU build, ``git_version``), ``torch.cuda`` as any build answers on a
    machine without a GPU (none available, no devices) and, for CUDA builds, ``torch._C._cuda_getArchFlags()``
    returning ``arch_flags`` ("sm_80 sm_90"). ``tag`` is the wheel tag (``cp311-cp311-manylinux_2_28_x86_64``)."""
    full = f"{version}+{local}" if local else version
    git = hashlib.sha1(full.encode(), usedforsecurity=False).hexdigest()
    modules = {
        "torch/__init__.py": "from torch import _C, cuda, version\n\n__version__ = version.__version__\n",
        "torch/cuda/__init__.py": "def is_available():\n    return False\n\n\ndef device_count():\n    return 0\n",
        "torch/version.py": (
            "from typing import Optional\n\n"
            "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']\n"
            f"__version__ = {full!r}\n"
            "debug = False\n"
            f"cuda: Optional[str] = {cuda!r}\n"
            f"git_version = {git!r}\n"
            "hip: Optional[str] = None\n"
            "xpu: Optional[str] = None\n"
        ),
        # A real CPU build's _C has no _cuda_getArchFlags at all.
        "torch/_C.py": (f"def _cuda_getArchFlags():\n    return {arch_flags!r}\n" if cuda else ""),
    }
    return build_wheel(out, "torch", full, modules, tag=tag)


@dataclass(frozen=True)
class Entry:
    path: Path
    requires_python: Optional[str] = None
    #: None: not yanked; a text (maybe empty): yanked, with that reason.
    yanked: Optional[str] = None


class TorchIndex:
    """The served roots (``whl/cu130``, ``simple``): each maps file names to their entries."""

    def __init__(self) -> None:
        self.roots: dict[str, dict[str, Entry]] = {}
        self.html_only: set[str] = set()
        #: Roots that answer every request with this HTTP status.
        self.fail: dict[str, int] = {}
        #: Roots that wait this many seconds before answering a project page.
        self.delay: dict[str, float] = {}
        #: Roots whose project pages are cut short (a proxy's error page, a truncated answer).
        self.broken: set[str] = set()
        self.requested: list[str] = []
        self.url = ""
        self._metadata: dict[Path, bytes] = {}
        self._lock = threading.Lock()

    def add(
        self, root: str, path: Path, requires_python: Optional[str] = None, yanked: Optional[str] = None
    ) -> None:
        self.roots.setdefault(root.strip("/"), {})[path.name] = Entry(path, requires_python, yanked)

    def remove(self, root: str, filename: str) -> None:
        del self.roots[root.strip("/")][filename]

    def pages(self, project: str = "torch") -> list[str]:
        """The project-page requests logged so far (``GET /whl/cu130/torch/ json``)."""
        return [r for r in self.requested if r.split()[1].endswith(f"/{project}/")]

    def metadata(self, wheel: Path) -> bytes:
        with self._lock:
            if wheel not in self._metadata:
                with zipfile.ZipFile(wheel) as zf:
                    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
                    self._metadata[wheel] = zf.read(name)
            return self._metadata[wheel]

    def _root(self, path: str) -> tuple[str, str]:
        """(root, rest) of a request path: the longest root that prefixes it."""
        inner = path.strip("/")
        for root in sorted(self.roots, key=len, reverse=True):
            if inner.startswith(root + "/"):
                return root, inner[len(root) + 1 :]
        return "", inner

    def _files(self, root: str, project: str) -> list[tuple[str, Entry]]:
        entries = self.roots.get(root, {})
        return [(n, e) for n, e in sorted(entries.items()) if normalize(n.split("-", 1)[0]) == project]

    def page_json(self, root: str, project: str) -> Optional[bytes]:
        files = self._files(root, project)
        if not files:
            return None
        out = []
        for name, entry in files:
            meta = hashlib.sha256(self.metadata(entry.path)).hexdigest()
            item = {
                "filename": name,
                "url": f"/{root}/{urllib.parse.quote(name)}",
                "hashes": {"sha256": _digest(entry.path)},
                "requires-python": entry.requires_python,
                "core-metadata": {"sha256": meta},
                "dist-info-metadata": {"sha256": meta},
                "yanked": entry.yanked if entry.yanked else entry.yanked is not None,
            }
            out.append(item)
        return json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": out}).encode()

    def page_html(self, root: str, project: str) -> Optional[bytes]:
        files = self._files(root, project)
        if not files:
            return None
        links = []
        for name, entry in files:
            meta = hashlib.sha256(self.metadata(entry.path)).hexdigest()
            attrs = f' data-dist-info-metadata="sha256={meta}" data-core-metadata="sha256={meta}"'
            if entry.requires_python:
                attrs += f' data-requires-python="{_escape(entry.requires_python)}"'
            if entry.yanked is not None:
                attrs += f' data-yanked="{_escape(entry.yanked)}"'
            href = f"/{root}/{urllib.parse.quote(name)}#sha256={_digest(entry.path)}"
            links.append(f'<a href="{href}"{attrs}>{_escape(name)}</a><br/>')
        body = "<!DOCTYPE html>\n<html><body>\n<h1>Links for " + project + "</h1>\n"
        return (body + "\n".join(links) + "\n</body></html>\n").encode()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


_DIGESTS: dict[tuple[Path, int], str] = {}


def _digest(path: Path) -> str:
    key = (path, path.stat().st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


def _handler(index: TorchIndex) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._get(head=True)

        def do_GET(self) -> None:
            self._get(head=False)

        def _get(self, head: bool) -> None:
            path = urllib.parse.unquote(self.path.split("?", 1)[0])
            root, rest = index._root(path)
            wants_json = JSON_TYPE in self.headers.get("Accept", "") and root not in index.html_only
            method = "HEAD" if head else "GET"
            index.requested.append(f"{method} {path} {'json' if wants_json else 'html'}")
            if root in index.fail:
                return self._send(None, "text/plain", head, status=index.fail[root])
            entries = index.roots.get(root, {})
            if rest.endswith(".whl.metadata") and rest[: -len(".metadata")] in entries:
                return self._send(index.metadata(entries[rest[: -len(".metadata")]].path), "text/plain", head)
            if rest in entries:
                return self._send(entries[rest].path.read_bytes(), "application/octet-stream", head)
            if root and rest and "/" not in rest:  # /<root>/<project>/
                return self._send(*_project_page(index, root, normalize(rest), wants_json), head)
            return self._send(None, "text/plain", head)

        def _send(self, body: Optional[bytes], ctype: str, head: bool = False, status: int = 200) -> None:
            if body is None:
                status = 404 if status == 200 else status
                body = f"{status}\n".encode()
                ctype = "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if head:
                return
            with suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

    return Handler


def _project_page(index: TorchIndex, root: str, project: str, wants_json: bool) -> tuple[bytes, str]:
    """A project's page under ``root`` and its content type: late, torn or in either format as the test set."""
    if root in index.delay:
        threading.Event().wait(index.delay[root])
    if root in index.broken:
        return b'{"meta": {"api-version": "1.1"}, "files": [', JSON_TYPE
    if wants_json:
        return index.page_json(root, project), JSON_TYPE
    return index.page_html(root, project), "text/html"


@contextmanager
def serve(index: TorchIndex) -> Iterator[TorchIndex]:
    """``index`` served on 127.0.0.1 (its ``url`` set) until the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()


def torch_mirror(server: TorchIndex) -> str:
    """ENVBUILDER_INDEX_MIRROR sending download.pytorch.org's /whl/ and PyPI to ``server``."""
    return f"https://download.pytorch.org/whl/={server.url}/whl/ pypi={server.url}/simple/"


def _platforms(variant: str) -> Sequence[str]:
    arches = ("x86_64", "aarch64") if variant in AARCH64 else ("x86_64",)
    return [f"manylinux_2_28_{a}" for a in arches]


def _pythons(release: str, python_tag: str) -> list[str]:
    return list(dict.fromkeys([*PYTHONS[release], python_tag]))


def _add(
    index: TorchIndex, root: str, out: Path, version: str, *, local: str, variant: str, python_tag: str
) -> None:
    release = version.partition(".dev")[0]
    for py in _pythons(release, python_tag):
        for platform in _platforms(variant):
            tag = f"{py}-{py}-{platform}"
            wheel = build_torch_wheel(out, version, local, CUDA[variant], ARCH_FLAGS[variant], tag=tag)
            index.add(root, wheel, requires_python=REQUIRES_PYTHON[release])


def pytorch_like(tmp_path: Path, python_tag: str = "cp311") -> TorchIndex:
    """download.pytorch.org and PyPI as of late 2026, with stand-in wheels (see the module docstring). Files
    exist for every Python of each release plus ``python_tag`` (the tests' own, so installs work)."""
    index = TorchIndex()
    for release in STABLE:
        for variant in VARIANTS[release]:
            _add(
                index,
                f"whl/{variant}",
                tmp_path / variant,
                release,
                local=variant,
                variant=variant,
                python_tag=python_tag,
            )
        default = PYPI_DEFAULT[release]
        _add(index, "simple", tmp_path / "pypi", release, local="", variant=default, python_tag=python_tag)
    for nightly in NIGHTLIES:
        _add(
            index,
            "whl/nightly/cu130",
            tmp_path / "nightly",
            nightly,
            local="cu130",
            variant="cu130",
            python_tag=python_tag,
        )
    # PyPI also has the other platforms' files; no Linux installer takes them.
    for tag in ("cp311-cp311-win_amd64", "cp311-none-macosx_11_0_arm64"):
        wheel = build_torch_wheel(tmp_path / "pypi-other", "2.15.0", "", None, "", tag=tag)
        index.add("simple", wheel, requires_python=REQUIRES_PYTHON["2.15.0"])
    return index


def add_build(
    index: TorchIndex,
    root: str,
    out: Path,
    build: str,
    *,
    python_tag: str,
    cuda: Optional[str] = None,
    arch_flags: str = "",
    arches: Sequence[str] = ("x86_64",),
) -> list[str]:
    """Stand-in torch wheels of ``build`` (``2.15.0+cu140``, ``2.15.0+rocm6.4``: any variant, also those
    ``pytorch_like`` does not have) under ``root``, for ``python_tag`` on each of ``arches``; returns their names."""
    version, _, variant = build.partition("+")
    names = []
    for arch in arches:
        tag = f"{python_tag}-{python_tag}-manylinux_2_28_{arch}"
        wheel = build_torch_wheel(out / variant, version, variant, cuda, arch_flags, tag=tag)
        index.add(root, wheel, requires_python=">=3.9")
        names.append(wheel.name)
    return names
