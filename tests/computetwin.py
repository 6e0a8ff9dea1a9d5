"""Compute nodes that are not the login host: a Debian bullseye root file system (glibc 2.31, CPython 3.9, made by
mmdebstrap from Debian's packages) in which each node of :class:`ComputeCluster` runs, while this machine (Debian
bookworm: glibc 2.36, its own Python) plays the login host that plans.

Each node is a host of its own as in tests/slurm.py's MultiNodeCluster (its UTS and mount namespaces, its name,
its /etc/hosts), and there its slurmd is bullseye's own (Slurm 20.11, two releases older than this machine's
22.05 slurmctld and clients), started with chroot into the root. slurmctld takes the older slurmd (as during a
site's rolling upgrade), and sbatch from the login host works; the login host's 22.05 srun cannot read a 20.11
slurmstepd's I/O message, so tests submit jobs with sbatch, and steps inside a job use the node's own 20.11 srun
(bullseye's slurm-client). Every job step and batch script on a node runs on the node's libc, Python and tools;
nothing of the login host's userland is there but the paths bound in at their own places: the cluster's
directory (config, sockets, logs), the checkout (envbuilder's source, the PYTHONPATH of ``python -m
envbuilder`` on the node) and those a test names. The nodes have GPUs (Slurm's gres on fake devices, and a
stand-in ``nvidia-smi`` on the node's PATH describing them from a JSON file); the login host has no
``nvidia-smi``.

What costs network, once per machine, is made by ``python tests/computetwin.py`` (.ci/run runs it) under
``ENVBUILDER_TEST_CACHE`` (/var/cache/envbuilder-tests): the root, with envbuilder's own dependencies installed
from PyPI's files for CPython 3.9 into a venv at /opt/envbuilder-deps. A test uses it through :func:`missing`
(a skip saying what is absent) and :class:`ComputeCluster`; the tests reach loopback only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import armtwin
from slurm import MultiNodeCluster, Node, multinode_available

CACHE = Path(os.environ.get("ENVBUILDER_TEST_CACHE", "/var/cache/envbuilder-tests"))
ROOT = CACHE / "bullseye-root"
WHEELS = CACHE / "bullseye-wheels"
SUITE = "bullseye"
#: The root's Debian packages: the node's python3 (3.9) and venv, and the node's slurmd (20.11) with munge's
#: library (the cluster's munged runs on this machine; its socket is bound in).
PACKAGES = ("python3", "python3-venv", "slurmd", "slurm-client", "libmunge2")
#: What the node reports, as Debian's bullseye packages make it: what the tests' site file states.
GLIBC = "2.31"
PYTHON = "3.9"
DEPS = "/opt/envbuilder-deps"
#: The stamp of a finished cache: what it was made from, so a change here makes it again.
STAMP = ROOT / ".envbuilder-twin"
#: The GPUs each node has, as its nvidia-smi describes them (tests/shims/nvidia-smi's format).
GPUS = {
    "driver": "570.124.06",
    "cuda": "12.8",
    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "mem": 81559}] * 2,
}
PLATFORMS = (
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
REPO = Path(__file__).resolve().parent.parent

#: Enters the root in the node's mount namespace: $1 the root, then pairs of (outside, inside) paths to bind,
#: then ``--`` and the command. The node's /etc/hosts (bound on this machine's by the node's supervisor) is
#: bound on the root's; its /tmp is a tmpfs of its own.
ENTER = "\nset -eu\nroot=$1; shift\n" + armtwin.ENTER_ROOT


def stamp_text() -> str:
    """What the cache is made from: a change to it (or to envbuilder's own dependencies) makes it again."""
    return "\n".join([SUITE, *PACKAGES, *PLATFORMS, *_dependencies()]) + "\n"


def _dependencies() -> list[str]:
    """envbuilder's own dependencies, as pyproject.toml lists them (the node's deps venv installs them)."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11 (the 3.9 lane imports this module too)
        import tomli as tomllib
    return [str(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]


def missing() -> Optional[str]:
    """Why the compute nodes cannot run (None: they can)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "the compute nodes are entered with unshare and chroot, as root"
    if not STAMP.is_file() or STAMP.read_text() != stamp_text():
        return f"no bullseye root file system at {ROOT} for this list of packages: `python tests/computetwin.py` makes it"
    return multinode_available()


def enter(
    argv: Sequence[str], binds: Sequence[Path] = (), timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``argv`` run in the root (no Slurm), with the checkout and ``binds`` seen inside at their own paths."""
    pairs = [a for path in (REPO, *binds) for a in (str(path), str(path))]
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", ENTER, "enter", str(ROOT),
           *pairs, "--", *argv]  # fmt: skip
    return subprocess.run(cmd, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=timeout)


class ComputeCluster(MultiNodeCluster):
    """MultiNodeCluster whose nodes run bullseye's slurmd in the root (module docstring), each with two GPUs.
    ``binds``: more paths every node sees at their own places (a test's directories)."""

    def __init__(
        self, root: Path, *, nodes: int = 2, binds: Sequence[Path] = (), timeout: float = 60.0
    ) -> None:
        super().__init__(root, nodes=nodes, timeout=timeout)
        self.nodes = tuple(
            Node(n.name, gpus=len(GPUS["gpus"]), own_host=True, addr=n.addr) for n in self.nodes
        )
        self.binds = (self.root, REPO, *binds)
        #: The node's own programs (its nvidia-smi), at /usr/local/bin inside the root.
        self.node_bin = self.root / "node-bin"

    def _write_files(self) -> None:
        super()._write_files()
        self.node_bin.mkdir(exist_ok=True)
        (self.root / "gpus.json").write_text(json.dumps(GPUS))
        smi = self.node_bin / "nvidia-smi"
        smi.write_text(
            f"#!/bin/sh\nNVIDIA_SMI_SHIM={self.root / 'gpus.json'} exec /usr/bin/python3 "
            f'{REPO / "tests" / "shims" / "nvidia-smi"} "$@"\n'
        )
        smi.chmod(0o755)

    def _argv(self, name: str, exe: str, args: Sequence[str]) -> list[str]:
        if name != "slurmd":
            return super()._argv(name, exe, args)
        pairs = [a for path in self.binds for a in (str(path), str(path))]
        return ["/bin/sh", "-c", ENTER, "enter", str(ROOT), *pairs, str(self.node_bin), "/usr/local/bin",
                "--", "/usr/sbin/slurmd", *args]  # fmt: skip


def _pins(source: str) -> list[str]:
    """The requirements of ``source`` and everything they need, for CPython 3.9 on x86_64 manylinux_2_31."""
    argv = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--no-header", "--no-annotate",
            "--python-platform", "x86_64-manylinux_2_31", "--python-version", PYTHON, source]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, check=True)
    return [line for line in res.stdout.splitlines() if line and not line.startswith("#")]


def prepare() -> None:
    """Make the cache (network: Debian's mirror and PyPI): the bullseye root and its envbuilder-deps venv.
    Quiet, and idempotent: a finished cache with this stamp is left as it is."""
    if STAMP.is_file() and STAMP.read_text() == stamp_text():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WHEELS, ignore_errors=True)
    WHEELS.mkdir()
    tool = _pins(str(REPO / "pyproject.toml"))  # envbuilder's own dependencies
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-qq", "--no-deps", "--python-version", PYTHON,
                    *platforms, "--only-binary=:all:", "--dest", str(WHEELS), *tool], check=True)  # fmt: skip
    (WHEELS / "envbuilder-deps.txt").write_text("\n".join(tool) + "\n")
    tmp = CACHE / "bullseye-root.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(ROOT, ignore_errors=True)
    subprocess.run(["mmdebstrap", "--quiet", "--variant=apt", "--include=" + ",".join(PACKAGES),
                    SUITE, str(tmp), "http://deb.debian.org/debian"], check=True)  # fmt: skip
    tmp.rename(ROOT)
    (ROOT / "etc" / "hosts").touch()  # the mount point of the node's
    install = (
        f"python3 -m venv {DEPS} && {DEPS}/bin/pip install --quiet --no-index --find-links {WHEELS} "
        f"-r {WHEELS}/envbuilder-deps.txt"
    )
    res = enter(["/bin/sh", "-c", install], [WHEELS])
    if res.returncode != 0:
        raise SystemExit(f"computetwin: {install} failed in the bullseye root:\n{res.stdout}{res.stderr}")
    STAMP.write_text(stamp_text())


if __name__ == "__main__":
    prepare()
