"""PyPI's files that the tests install (the CPU torch world's numpy, mpi4py and MPICH, mpi4py's source, with the C
its Cython makes added, and its build requirements, a setuptools wheel), fetched once per machine before the tests
run, under /var/cache/envbuilder-tests (``ENVBUILDER_TEST_CACHE``): ``python tests/testwheels.py`` (.ci/run does
it). The tests' fixtures then copy from this cache with pip's ``--no-index``, so the tests themselves reach loopback only.
torch itself comes from the machine's find-links (/opt/wheels), as pip finds it here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import armtwin

CACHE = armtwin.CACHE / "pypi-wheels"
#: What each fixture asks pip for: (name, pip's arguments). The cache holds them and every dependency.
SETS: dict[str, tuple[str, ...]] = {
    "torch-files": ("torch==2.13.0", "numpy", "mpi4py", "mpich"),
    "mpi4py-source": ("--no-deps", "--no-binary", "mpi4py", armtwin.MPI4PY),
    "mpi4py-build": ("--only-binary", ":all:", "setuptools>=42", "build", "cython>=3.0.1"),
    "setuptools": ("--no-deps", "setuptools"),
}
STAMP = CACHE / "stamp.json"


def download(dest: Path, args: Sequence[str], offline: bool) -> subprocess.CompletedProcess[str]:
    """``pip download`` of ``args`` into ``dest``; ``offline`` reads this cache only (no index at all)."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest)]
    if offline:
        argv += ["--no-index", "--find-links", str(CACHE)]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=900)


def missing() -> str:
    """Why the cache cannot serve the tests ("" where it can)."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return f"PyPI's test files are not cached in {CACHE}: run `python tests/testwheels.py` (.ci/run does)"
    if stamp != _stamp():
        return f"{CACHE} was filled for other files or another Python: run `python tests/testwheels.py` again"
    return ""


def fetch(dest: Path, name: str) -> subprocess.CompletedProcess[str]:
    """Copy the files of set ``name`` (and what they need) from the cache into ``dest``, without a network."""
    return download(dest, SETS[name], offline=True)


def _add_cython_output() -> None:
    """mpi4py's sdist with the C of its Cython (armtwin.add_cython_output), by the cached Cython its builds use."""
    cython = ["--no-index", "--find-links", str(CACHE), "cython"]
    armtwin.add_cython_output(next(CACHE.glob("mpi4py-*.tar.gz")), cython)


def _stamp() -> object:
    """What the cache was filled for, as its stamp file holds it."""
    return json.loads(json.dumps({"python": sys.version_info[:2], "sets": SETS}))


def main() -> int:
    if not missing():
        _add_cython_output()
        print(f"testwheels: {CACHE} is up to date")
        return 0
    CACHE.mkdir(parents=True, exist_ok=True)
    STAMP.unlink(missing_ok=True)
    for name, args in SETS.items():
        res = download(CACHE, args, offline=False)
        if res.returncode != 0:
            print(f"testwheels: {name} could not be fetched:\n{res.stderr[-2000:]}", file=sys.stderr)
            return 1
    _add_cython_output()
    STAMP.write_text(json.dumps(_stamp()))
    print(f"testwheels: {CACHE} filled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
