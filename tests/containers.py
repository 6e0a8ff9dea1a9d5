"""The container tests' world, real parts only: OCI images made from Debian's packages with the CPU torch inside,
labelled as NGC labels its PyTorch images, served by Debian's OCI registry (``docker-registry``) on 127.0.0.1, and
run by Charliecloud (``ch-run``) under the Apptainer stand-in (tests/shims/apptainer/apptainer).

The image, once per machine (``python tests/containers.py``; tests/prepare.py runs it): a bookworm root made by
mmdebstrap (python3 3.11 and its venv module, no docs, no apt caches) with torch 2.13.0 (CPU) and numpy installed
from the machine's cache of PyPI's files (tests/testwheels.py) into a venv at /opt/venv, entered with
``ch-run -w``. umoci packs it into one layer of an OCI image layout under ``ENVBUILDER_TEST_CACHE``
(/var/cache/envbuilder-tests/oci-images), and every tag of :data:`TAGS` is that layer with its own config:
only the labels, the environment and the architecture differ, so the tags cost a few hundred bytes each. The
multi-arch tag is an OCI image index (written here: umoci and skopeo make none) whose arm64 entry is the same
layer under a config that says arm64: what a test of the platform list reads is the index, and nothing runs the
arm64 entry. The root itself is removed once packed; a registry's storage with every tag pushed is kept beside
the layout (its layer a hard link), which each test registry copies, linking the layer. On this 2-core machine
it takes about a minute (mmdebstrap ~45 s, the pip install ~15 s, umoci ~7 s) and 321 MB (1.2 GB unpacked).

Charliecloud here: ``ch-run`` runs as root, and as the second user (tests/sharedfs.py) in an unprivileged user
namespace; a SquashFS image needs SquashFUSE, and /dev/fuse is 0600 on this machine, so the second user runs
an image file through a sandbox extracted from it (the stand-in does that, as Apptainer does).

What each tag's labels claim (:func:`labels`) is what a test expects: a CUDA tag's labels say CUDA 12.8 or 13.0
(as an NGC image's do), while the torch inside every tag is the same CPU build, which ``org.envbuilder.torch.build``
states. The tests reach loopback only; a test uses the world through :func:`missing` (a skip saying what is
absent) and :class:`Registry`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import armtwin
import testwheels

CACHE = armtwin.CACHE
#: The OCI image layout holding every tag, and the record of what it was made from (its stamp) and of its tags'
#: digests.
LAYOUT = CACHE / "oci-images"
RECORD = LAYOUT / "envbuilder-images.json"
#: A registry's storage with every tag pushed, which each test registry starts from (:class:`Registry`).
STORAGE = LAYOUT / "registry-storage"
SUITE = "bookworm"
#: The image's Debian packages: its python (3.11, the CPU torch file's CPython) and the venv module.
PACKAGES = ("python3", "python3-venv")
#: What the image's venv holds, from testwheels' cache: torch's dependencies come with it; numpy, as NGC's images
#: have it (torch warns at import without it).
WHEELS = ("torch==2.13.0", "numpy")
TORCH = "2.13.0"
TORCH_BUILD = "2.13.0+cpu"
PYTHON = "3.11"
VENV = "/opt/venv"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where the tags live in the registry (an NGC image is nvcr.io/nvidia/pytorch:TAG).
REPOSITORY = "envbuilder/pytorch"
#: The configs' creation time: one for every tag, so that the configs differ only where the tags do.
CREATED = "2026-11-01T00:00:00Z"
#: The programs the tests need, each with the Debian package that has it (.ci/run installs them; making the
#: images needs mmdebstrap too).
TOOLS = {
    "ch-run": "charliecloud-runtime",
    "umoci": "umoci",
    "skopeo": "skopeo",
    "docker-registry": "docker-registry",
    "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools",
}


@dataclass(frozen=True)
class Tag:
    """One tag of the image: ``cuda`` is the CUDA release its labels claim (None: a CPU image, as the torch
    inside is), ``arches`` the platforms it is published for (more than one: an OCI image index)."""

    name: str
    cuda: Optional[str] = None
    arches: tuple[str, ...] = ("amd64",)


#: The tags: a good CPU image (amd64 only, as Docker Hub's pytorch/pytorch), images whose labels say CUDA 12.8
#: (fits a driver-12 node) and CUDA 13.0 (refused there), and the CPU image as a multi-arch index.
TAGS = (
    Tag("2.13.0-cpu"),
    Tag("2.13.0-cuda12.8", cuda="12.8.1"),
    Tag("2.13.0-cuda13.0", cuda="13.0.1"),
    Tag("2.13.0-cpu-multiarch", arches=("amd64", "arm64")),
)


def labels(tag: Tag) -> dict[str, str]:
    """The labels of ``tag``'s config: NGC's names for what its PyTorch images carry, and the world's own facts."""
    found = {
        "org.opencontainers.image.title": "envbuilder test PyTorch",
        "org.opencontainers.image.version": tag.name,
        "org.opencontainers.image.created": CREATED,
        "com.nvidia.pytorch.version": TORCH,
        "org.envbuilder.torch.version": TORCH,
        "org.envbuilder.torch.build": TORCH_BUILD,
        "org.envbuilder.cuda.version": "none",
        "org.envbuilder.python.version": PYTHON,
        "org.envbuilder.architectures": ",".join(tag.arches),
    }
    if tag.cuda is not None:
        found.update({
            "com.nvidia.cuda.version": tag.cuda,
            "com.nvidia.volumes.needed": "nvidia_driver",
            "org.envbuilder.cuda.version": ".".join(tag.cuda.split(".")[:2]),
        })  # fmt: skip
    return found


def environment(tag: Tag) -> list[str]:
    """The environment of ``tag``'s config (NAME=VALUE), as an NGC image sets it: a CUDA image says which driver
    its CUDA needs (NVIDIA_REQUIRE_CUDA, read by NVIDIA's container runtime)."""
    env = [f"PATH={PATH}", f"PYTORCH_VERSION={TORCH}", f"PYTHON_VERSION={PYTHON}"]
    if tag.cuda is not None:
        major_minor = ".".join(tag.cuda.split(".")[:2])
        env += [f"CUDA_VERSION={tag.cuda}", f"NVIDIA_REQUIRE_CUDA=cuda>={major_minor}"]
    return env


def stamp() -> dict[str, object]:
    """What the layout is made from: a change here makes it again."""
    tags = {t.name: {"labels": labels(t), "env": environment(t), "arches": list(t.arches)} for t in TAGS}
    return {
        "suite": SUITE,
        "packages": list(PACKAGES),
        "wheels": list(WHEELS),
        "tags": tags,
        "storage": STORAGE.name,
        "dev": "empty",
    }


def record() -> Optional[dict[str, object]]:
    """The finished layout's record (None: there is none for this stamp)."""
    try:
        found = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("stamp") == stamp() else None


def missing_tools() -> Optional[str]:
    """The programs of :data:`TOOLS` that are not installed, with their packages (None: all are)."""
    absent = [f"{tool} ({pkg})" for tool, pkg in TOOLS.items() if not shutil.which(tool, path=_path())]
    return f"not installed: {', '.join(absent)} (.ci/run installs them)" if absent else None


def missing() -> Optional[str]:
    """Why the container world cannot be had here (None: it can)."""
    if os.geteuid() != 0:
        return "the container world's registry and images are made and served as root"
    tools = missing_tools()
    if tools:
        return tools
    if record() is None:
        return f"no OCI images at {LAYOUT} for this list of tags: `python tests/containers.py` makes them"
    return None


def _path() -> str:
    return os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def _run(argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``argv`` run to the end; a failure raises RuntimeError naming the command and its output's tail."""
    res = subprocess.run(list(argv), capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {(res.stdout + res.stderr)[-2000:]}")
    return res  # type: ignore[no-any-return]


# -- making the images (prepare) ---------------------------------------------------------------------------


def prepare() -> None:
    """Make the layout (network: Debian's mirror; PyPI's files come from testwheels' cache). Idempotent: a layout
    with this stamp is left as it is. Prints how long it took."""
    if record() is not None:
        return
    tools = missing_tools() or (
        None if shutil.which("mmdebstrap") else "not installed: mmdebstrap (mmdebstrap)"
    )
    if tools:
        raise SystemExit(f"containers: {tools}")
    if testwheels.missing():
        raise SystemExit(f"containers: {testwheels.missing()}")
    began = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    root, layout = CACHE / "oci-root.tmp", CACHE / "oci-images.tmp"
    for path in (root, layout):
        shutil.rmtree(path, ignore_errors=True)
    try:
        _make_root(root)
        _pack(root, layout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _seed(layout)
    for path in layout.rglob("*"):  # umoci writes its files for root alone; the second user reads them too
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(LAYOUT, ignore_errors=True)
    layout.rename(LAYOUT)
    print(f"containers: {LAYOUT} made in {time.monotonic() - began:.0f} s", file=sys.stderr)


def _make_root(root: Path) -> None:
    """The image's root: bookworm's python3 by mmdebstrap, then the venv filled from testwheels' cache by
    ``ch-run -w`` (the cache bound at /mnt), in a clean environment (no pip settings of this machine's)."""
    excluded = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")]
    _run(["mmdebstrap", "--quiet", "--variant=apt", "--include=" + ",".join(PACKAGES), *excluded,
          SUITE, str(root), "http://deb.debian.org/debian"])  # fmt: skip
    install = (
        f"python3 -m venv {VENV} && {VENV}/bin/pip install --quiet --no-index --find-links /mnt "
        + " ".join(WHEELS)
    )
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "USER": "root", "HOME": "/root"}
    _run(
        ["ch-run", "-w", "-b", f"{testwheels.CACHE}:/mnt", str(root), "--", "/bin/sh", "-c", install], env=env
    )
    # /dev's device nodes too: an image's /dev is empty (the runtime binds the host's), and a user who is not
    # root cannot unpack them.
    for junk in ("var/cache/apt", "var/lib/apt/lists", "root/.cache", "dev"):
        for child in (root / junk).glob("*"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _pack(root: Path, layout: Path) -> None:
    """``root`` as one layer of an OCI layout, and every tag of :data:`TAGS` as a config on that layer."""
    image = f"{layout}:root"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", image])
    _run(["umoci", "insert", "--image", image, "--history.created", CREATED, "--history.comment",
          f"mmdebstrap {SUITE} {' '.join(PACKAGES)}; pip install {' '.join(WHEELS)}", str(root), "/"])  # fmt: skip
    for tag in TAGS:
        for arch in tag.arches:
            name = tag.name if len(tag.arches) == 1 else f"{tag.name}-{arch}"
            _config(image, tag, arch, name)
        if len(tag.arches) > 1:
            _index(layout, tag)
    for helper in {f"{t.name}-{a}" for t in TAGS if len(t.arches) > 1 for a in t.arches} | {"root"}:
        _run(["umoci", "rm", "--image", f"{layout}:{helper}"])


def _seed(layout: Path) -> None:
    """Every tag of ``layout`` pushed through a registry into ``layout``'s registry storage (the layer's file there
    a hard link to the layout's), and the record of the tags' digests in it."""
    work = layout.parent / "oci-registry.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        with Registry(work) as registry:
            for tag in TAGS:
                registry.push(f"oci:{layout}:{tag.name}", tag.name)
        (work / "storage").rename(layout / STORAGE.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for data in (layout / STORAGE.name).rglob("data"):
        same = layout / "blobs" / "sha256" / data.parent.name
        if same.is_file() and same.stat().st_size == data.stat().st_size:
            data.unlink()
            os.link(same, data)
    record = {"stamp": stamp(), "digests": registry.digests}
    (layout / RECORD.name).write_text(json.dumps(record, indent=1) + "\n")


def _config(image: str, tag: Tag, arch: str, name: str) -> None:
    """The config of ``tag`` for ``arch`` on the layer of ``image``, saved as tag ``name`` of the layout."""
    argv = ["umoci", "config", "--image", image, "--tag", name, "--os", "linux", "--architecture", arch,
            "--created", CREATED, "--history.created", CREATED, "--config.cmd", "/bin/bash"]  # fmt: skip
    argv += [a for k, v in labels(tag).items() for a in ("--config.label", f"{k}={v}")]
    argv += [a for e in environment(tag) for a in ("--config.env", e)]
    _run(argv)


def _ref(layout: Path, name: str) -> dict[str, object]:
    """The descriptor of tag ``name`` in ``layout``'s index.json."""
    index = json.loads((layout / "index.json").read_text())
    found = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == name
    ]
    if len(found) != 1:
        raise RuntimeError(f"{layout}/index.json has {len(found)} entries named {name}")
    return found[0]  # type: ignore[no-any-return]


def _index(layout: Path, tag: Tag) -> None:
    """An OCI image index of ``tag``'s per-arch manifests (each with its platform), saved as tag ``tag.name``."""
    manifests = []
    for arch in tag.arches:
        ref = _ref(layout, f"{tag.name}-{arch}")
        manifests.append({"mediaType": ref["mediaType"], "digest": ref["digest"], "size": ref["size"],
                          "platform": {"architecture": arch, "os": "linux"}})  # fmt: skip
    blob = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
    ).encode()
    digest = hashlib.sha256(blob).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(blob)
    index_json = layout / "index.json"
    index = json.loads(index_json.read_text())
    index["manifests"].append({
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{digest}", "size": len(blob),
        "annotations": {"org.opencontainers.image.ref.name": tag.name},
    })  # fmt: skip
    index_json.write_text(json.dumps(index))


# -- the registry (tests) ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Registry:
    """Debian's OCI registry (distribution's ``docker-registry``) serving plain HTTP on 127.0.0.1 at a free port,
    its storage under ``root``; ``with Registry(root) as registry:`` starts it and stops it. ``seeded``: its
    storage starts as a copy of :data:`STORAGE` (every tag of :data:`TAGS` pushed, the layer hard-linked, not
    copied), and ``digests`` maps each tag to its digest in the registry (an image index's for a multi-arch tag);
    :meth:`push` adds or replaces a tag."""

    def __init__(self, root: Path, *, seeded: bool = False) -> None:
        self.root = root
        self.storage = root / "storage"
        self.port = 0
        self.digests: dict[str, str] = {}
        self.proc: Optional[subprocess.Popen[bytes]] = None
        if seeded:
            found = record()
            if found is None:
                raise RuntimeError(f"no OCI images at {LAYOUT}: `python tests/containers.py` makes them")
            self.digests = dict(found["digests"])  # type: ignore[call-overload]
            # Only a blob's data is linked: the registry never rewrites one, while it rewrites a tag's link file
            # in place (which, linked, would move the tag in every registry seeded from this storage).
            shutil.copytree(STORAGE, self.storage, copy_function=_link_blob)

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def tags(self) -> tuple[Tag, ...]:
        return TAGS

    def ref(self, tag: str) -> str:
        """``127.0.0.1:PORT/envbuilder/pytorch:TAG``."""
        return f"{self.host}/{REPOSITORY}:{tag}"

    def docker(self, tag: str) -> str:
        """The reference as Apptainer and skopeo take it: ``docker://127.0.0.1:PORT/envbuilder/pytorch:TAG``."""
        return f"docker://{self.ref(tag)}"

    def __enter__(self) -> Registry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> None:
        self.storage.mkdir(parents=True, exist_ok=True)
        for _ in range(attempts):  # a free port may be taken between the look and the registry's bind
            self.port = free_port()
            config = self.root / "config.yml"
            config.write_text(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
                f"http:\n  addr: {self.host}\n"
            )
            log = open(self.root / "registry.log", "ab")  # noqa: SIM115 (the registry's, closed by stop)
            self.proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
            log.close()
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(
            f"docker-registry did not serve at 127.0.0.1: {(self.root / 'registry.log').read_text()[-1000:]}"
        )

    def _wait_ready(self, timeout: float = 20.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if _answers(f"{self.url}/v2/"):
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def push(self, source: str, tag: str) -> str:
        """``source`` (a skopeo reference: ``oci:DIR:TAG``, ``oci-archive:FILE``...) pushed as ``tag``, every
        platform of an index with it; returns its digest in the registry."""
        digest_file = self.root / f"digest-{tag}"
        _run(["skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false", "--digestfile", str(digest_file),
              source, self.docker(tag)])  # fmt: skip
        self.digests[tag] = digest_file.read_text().strip()
        return self.digests[tag]

    def inspect(self, tag: str, *, raw: bool = False, config: bool = False) -> dict[str, object]:
        """``skopeo inspect`` of ``tag``: the image's facts (labels, architecture); ``raw`` the manifest or index
        as stored; ``config`` the image's config."""
        flags = ["--raw"] if raw else ["--config"] if config else []
        res = _run(["skopeo", "inspect", "--tls-verify=false", *flags, self.docker(tag)])
        return json.loads(res.stdout)  # type: ignore[no-any-return]


def _answers(url: str) -> bool:
    """Whether ``url`` (the registry's, on loopback) answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as res:  # noqa: S310 (http on 127.0.0.1 only)
            return bool(res.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _link_blob(src: str, dst: str) -> None:
    """A blob's data hard-linked (copied where the file systems differ), any other file copied."""
    if Path(src).name == "data":
        with contextlib.suppress(OSError):
            os.link(src, dst)
            return
    shutil.copy2(src, dst)


if __name__ == "__main__":
    prepare()
