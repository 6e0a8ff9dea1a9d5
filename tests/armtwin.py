"""An aarch64 node on this x86_64 machine, for Vista's recipes: an arm64 Debian root file system (mmdebstrap, from
Debian's packages: python3, Lmod, Open MPI, gcc), its programs run by qemu-user-static through binfmt_misc, entered
with chroot in a private mount namespace with /proc, /sys, /dev and the test's directories bound in. Inside it
``platform.machine()`` is ``aarch64``: envbuilder runs there on the arm64 python3, so create builds as on a GH200
node and its x86_64 refusal does not apply.

What it costs once per machine, and which the tests never fetch (they reach loopback only), is made by
``python tests/armtwin.py`` (.ci/run runs it) under ``ENVBUILDER_TEST_CACHE`` (/var/cache/envbuilder-tests):
the root file system with envbuilder's own dependencies in a venv at /opt/envbuilder-deps, and PyPI's aarch64
wheels of torch 2.10.0 (a CPU build: PyPI's aarch64 torch carries no CUDA), torchvision, torchaudio, their
dependencies and mpi4py's source (with the C its Cython makes, added once here). A test uses them through
tests/armnode.py and skips, saying what is missing, where they are not there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

CACHE = Path(os.environ.get("ENVBUILDER_TEST_CACHE", "/var/cache/envbuilder-tests"))
ROOT = CACHE / "arm64-root"
WHEELS = CACHE / "arm64-wheels"
#: uv's cache for the node's builds (mpi4py from source takes minutes under qemu): kept, as a site keeps its own.
UV_CACHE = CACHE / "arm64-uv-cache"
#: The arm64 root's Debian packages: the node's python (3.11, as Vista's python3/3.11.8), Lmod, Open MPI with
#: its mpicc (the recipe builds mpi4py from source), and what builds a C extension.
PACKAGES = (
    "python3",
    "python3-venv",
    "python3-dev",
    "lmod",
    "openmpi-bin",
    "libopenmpi-dev",
    "gcc",
    "libc6-dev",
)
SUITE = "bookworm"
#: What the Vista recipes install, as PyPI has it for aarch64 (the torch family pinned as the recipes pin it).
TORCH = {"torch": "2.10.0", "torchvision": "0.25.0", "torchaudio": "2.10.0"}
#: mpi4py's source (the MPI recipe builds it with no_binary against the node's MPI) and what its build needs.
MPI4PY = "mpi4py==4.1.2"
MPI4PY_BUILD = ("setuptools>=42", "build", "cython")
#: The C that Cython makes of mpi4py's MPI.pyx, which :func:`_add_cython_output` adds to the cached sdist.
CYTHON_OUTPUT = "src/mpi4py/MPI.c"
#: The stamp of a finished cache: what it was made from, so a change here makes it again.
STAMP = ROOT / ".envbuilder-twin"
DEPS = "/opt/envbuilder-deps"
#: Where the checkout is seen inside the root (PYTHONPATH for ``python -m envbuilder``).
SRC = "/src"
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_17_aarch64",
             "manylinux2014_aarch64", "linux_aarch64")  # fmt: skip

#: Where the root's shared libraries are, the linker's default path, in which :func:`enter` can hide some.
LIBDIR = "/usr/lib/aarch64-linux-gnu"

#: The part every node root shares (computetwin's too): /proc, /dev, /sys, a tmpfs /tmp and this machine's
#: /etc/hosts in ``$root``, the (outside, inside) binds up to ``--``, then the command chrooted there.
ENTER_ROOT = r"""
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t tmpfs tmpfs "$root/tmp"
mount --bind /etc/hosts "$root/etc/hosts"
while [ "$1" != -- ]; do
    mkdir -p "$root$2"
    mount --rbind "$1" "$root$2"
    shift 2
done
shift
exec /usr/sbin/chroot "$root" "$@"
"""


#: Enters the root in the mount namespace ``unshare`` made: $1 the root, $2 the names of files in LIBDIR to hide
#: (space-separated, maybe none), then pairs of (outside, inside) paths to bind, then ``--`` and the command. The
#: hidden files are whited out by an overlay on LIBDIR whose upper layer is a tmpfs on the root's /mnt, so the cache
#: keeps them. The root's /tmp is a tmpfs, so binds under /tmp leave nothing in the cache; its /etc/hosts is this
#: machine's (localhost and this host's name resolve, as torchrun's rendezvous needs).
ENTER = (
    r"""
set -eu
root=$1; hide=$2; shift 2
if [ -n "$hide" ]; then
    mount -t tmpfs tmpfs "$root/mnt"
    mkdir "$root/mnt/upper" "$root/mnt/work"
    for name in $hide; do mknod "$root/mnt/upper/$name" c 0 0; done
    lib="$root/usr/lib/aarch64-linux-gnu"
    mount -t overlay overlay -o "lowerdir=$lib,upperdir=$root/mnt/upper,workdir=$root/mnt/work" "$lib"
fi
"""
    + ENTER_ROOT
)


def stamp_text() -> str:
    return (
        "\n".join([SUITE, *PACKAGES, *(f"{k}=={v}" for k, v in TORCH.items()), MPI4PY, *MPI4PY_BUILD]) + "\n"
    )


def binfmt() -> Optional[str]:
    """Why arm64 programs cannot run here (None: they can): binfmt_misc mounted, qemu-aarch64 registered and
    enabled (Debian's qemu-user-static registers it with the F flag, so it also runs inside the root)."""
    misc = Path("/proc/sys/fs/binfmt_misc")
    if not (misc / "register").exists():
        if os.geteuid() != 0:
            return "binfmt_misc is not mounted, and only root can mount it"
        res = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(misc)], capture_output=True)
        if res.returncode != 0:
            return f"binfmt_misc cannot be mounted here: {res.stderr.decode().strip()}"
    entry = misc / "qemu-aarch64"
    if not entry.exists() and shutil.which("update-binfmts"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    if not entry.exists():
        return "no qemu-aarch64 binfmt entry (.ci/run installs qemu-user-static and binfmt-support)"
    if entry.read_text().splitlines()[0] != "enabled":
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    return None


def missing() -> Optional[str]:
    """Why the aarch64 node cannot be entered (None: it can)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "the aarch64 node is entered with unshare and chroot, as root"
    if not STAMP.is_file() or STAMP.read_text() != stamp_text():
        return f"no aarch64 root file system at {ROOT} for this list of packages: `python tests/armtwin.py` makes it"
    return binfmt()


def enter(argv: Sequence[str], env: dict[str, str], binds: Sequence[Path], timeout: float, *,
          cwd: str = "/", hide: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``argv`` run on the aarch64 node with exactly ``env``, each of ``binds`` seen inside at its own path and
    the checkout at /src; the files of LIBDIR named in ``hide`` are not there (a library a module provides)."""
    repo = Path(__file__).resolve().parent.parent
    pairs = [str(repo), SRC, str(WHEELS), "/wheels"]
    for path in binds:
        pairs += [str(path), str(path)]
    inner = ["/usr/bin/env", "-C", cwd, *argv]
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", ENTER, "enter", str(ROOT),
           " ".join(hide), *pairs, "--", *inner]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _pins(requirements: Sequence[str], source: str = "-") -> list[str]:
    """``requirements`` (or those of the file ``source``) and everything they need, resolved for CPython 3.11 on manylinux_2_28 aarch64 (uv's
    resolver: pip's evaluates the markers for this machine, and torch's CUDA dependencies are x86_64-only)."""
    argv = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--no-header", "--no-annotate",
            "--python-platform", "aarch64-manylinux_2_28", "--python-version", "3.11", source]  # fmt: skip
    res = subprocess.run(argv, input="\n".join(requirements), capture_output=True, text=True, check=True)
    return [line for line in res.stdout.splitlines() if line and not line.startswith("#")]


def _download(dest: Path, specs: Sequence[str], binary: bool = True) -> None:
    """PyPI's files for CPython 3.11 on aarch64 (the root's python), exactly ``specs``, with pip's own client."""
    only = ["--only-binary=:all:"] if binary else ["--no-binary=:all:"]
    platforms = [a for p in PLATFORMS for a in ("--platform", p)] if binary else []
    argv = [sys.executable, "-m", "pip", "download", "-qq", "--no-deps", "--python-version", "3.11",
            *platforms, *only, "--dest", str(dest), *specs]  # fmt: skip
    subprocess.run(argv, check=True)


def prepare() -> None:
    """Make the cache (network: Debian's mirror and PyPI): the arm64 root, its envbuilder-deps venv, the wheels.
    Quiet, and idempotent: a finished cache with this stamp is left as it is."""
    if not (STAMP.is_file() and STAMP.read_text() == stamp_text()):
        _make()
    _add_cython_output()


def _make() -> None:
    """The arm64 root, its envbuilder-deps venv and the wheels, from nothing."""
    problem = binfmt()
    if problem:
        raise SystemExit(f"armtwin: {problem}")
    CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WHEELS, ignore_errors=True)
    WHEELS.mkdir()
    repo = Path(__file__).resolve().parent.parent
    tool = _pins([], str(repo / "pyproject.toml"))  # envbuilder's own dependencies
    _download(WHEELS, sorted({*tool, *_pins([f"{k}=={v}" for k, v in TORCH.items()]), *_pins(MPI4PY_BUILD)}))
    _download(WHEELS, [MPI4PY], binary=False)
    (WHEELS / "envbuilder-deps.txt").write_text("\n".join(tool) + "\n")
    tmp = CACHE / "arm64-root.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(ROOT, ignore_errors=True)
    subprocess.run(["mmdebstrap", "--quiet", "--arch=arm64", "--variant=apt", "--include=" + ",".join(PACKAGES),
                    SUITE, str(tmp), "http://deb.debian.org/debian"], check=True)  # fmt: skip
    tmp.rename(ROOT)
    for inside in (SRC, "/wheels"):
        (ROOT / inside.lstrip("/")).mkdir(exist_ok=True)
    (ROOT / "etc" / "hosts").touch()  # the mount point of this machine's
    install = f"python3 -m venv {DEPS} && {DEPS}/bin/pip install --quiet --no-index --find-links /wheels -r /wheels/envbuilder-deps.txt"
    res = enter(["/bin/sh", "-c", install], {"PATH": "/usr/bin:/bin"}, [], timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"armtwin: {install} failed in the arm64 root:\n{res.stdout}{res.stderr}")
    STAMP.write_text(stamp_text())


def _add_cython_output() -> None:
    """The node's mpi4py sdist with its Cython output (:func:`add_cython_output`), by the release of the Cython
    wheel cached beside it, which the node's build installs (read from its name: nothing is resolved again)."""
    version = next(WHEELS.glob("[Cc]ython-*.whl")).name.split("-")[1]
    add_cython_output(next(WHEELS.glob("mpi4py-*.tar.gz")), [f"cython=={version}"])


def add_cython_output(sdist: Path, cython: Sequence[str]) -> None:
    """Add MPI.c to a cached mpi4py sdist, once. PyPI's sdist carries no C, so each build of it runs Cython on
    MPI.pyx first (23 s of CPU natively, about two minutes under qemu) in every test that builds it (uv never
    reuses a no_binary build). What Cython writes does not depend on the machine, so it is made here, natively,
    by the Cython that ``pip install CYTHON`` gets, and appended as the sdist's last member: newer than its sources
    however the sdist is unpacked, so mpi4py's build (conf/mpidistutils.py) skips Cython and only compiles and
    links the C against the MPI it is given, as before."""
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        if f"{top}/{CYTHON_OUTPUT}" in tar.getnames():
            return
    with tempfile.TemporaryDirectory(dir=sdist.parent.parent) as tmp:
        work = Path(tmp)
        argv = [sys.executable, "-m", "pip", "install", "-qq", "--no-deps", "--only-binary=:all:",
                "--target", str(work / "cython"), *cython]  # fmt: skip
        subprocess.run(argv, check=True)  # for this machine's python
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        env = {**os.environ, "PYTHONPATH": str(work / "cython")}
        subprocess.run([sys.executable, "conf/cythonize.py"], cwd=work / top, env=env, check=True)
        partial = work / sdist.name
        with tarfile.open(sdist) as src, tarfile.open(partial, "w:gz") as dst:
            for member in src.getmembers():
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
            dst.add(work / top / CYTHON_OUTPUT, arcname=f"{top}/{CYTHON_OUTPUT}")
        os.replace(partial, sdist)


if __name__ == "__main__":
    prepare()
