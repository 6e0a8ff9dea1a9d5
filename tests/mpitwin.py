"""A site-built MPI for the emulated sites: a real MPICH laid out under its module's prefix, its ``libmpi`` outside
the linker's default path and found only through the module's LD_LIBRARY_PATH, as a site's MPI module provides it
(tests/data/modules/site/mpich/5.0.2.lua). Its ``mpicc`` compiles and links against that libmpi and, like an MPICH
configured ``--with-wrapper-dl-type=none`` (or Cray's wrappers), records no RUNPATH to it: mpi4py built from
source with it (``no_binary``, ``MPICC=mpicc``) imports only where the module is loaded; a venv whose activation
skips the module fails with the loader's "error while loading shared libraries: libmpi.so.12".

Made from PyPI's ``mpich`` wheel (a complete MPICH: the compiler wrappers, Hydra's mpiexec, the headers and the
libraries, relocatable: its wrappers find their prefix from where they lie), which the tests' torch files hold
(conftest's ``torch_files``): its data tree unpacked under the prefix, the wrappers' dynamic-linking type set to
none. Laid out once per test run (conftest's ``site_mpi``), and checked: a program linked by its mpicc must not
start without the module's LD_LIBRARY_PATH (no libmpi of that name on the linker's default path) and must run
with it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Optional

#: The MPICH release of the tests' torch files, and the fixture tree's module of it.
VERSION = "5.0.2"
MODULE = f"mpich/{VERSION}"
#: Where the module finds it under ENVBUILDER_TEST_SOFT.
DIRNAME = f"mpich-{VERSION}"
#: What the dynamic loader says when a program's libmpi is on no path it searches.
NO_LIBMPI = "error while loading shared libraries: libmpi.so.12"
#: The compiler wrappers whose dynamic-linking type is set as the site configured it.
WRAPPERS = ("mpicc", "mpicxx", "mpic++", "mpicc_abi", "mpicxx_abi", "mpic++_abi")

HELLO = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, len;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_library_version(version, &len);
    printf("rank %d of %d: %.5s\n", rank, size, version);
    MPI_Finalize();
    return 0;
}
"""


def wheel(files: Path) -> Optional[Path]:
    """PyPI's mpich wheel of ``VERSION`` among ``files`` (None: not there)."""
    found = sorted(files.glob(f"mpich-{VERSION}-*.whl"))
    return found[0] if found else None


def why_not() -> Optional[str]:
    """Why the site MPI cannot be made here (None: it can): its wrappers need a C compiler."""
    if shutil.which("cc") is None:
        return "no C compiler (cc) for the MPI's mpicc"
    return None


def lay_out(whl: Path, tree: Path) -> None:
    """MPICH from ``whl`` at ``tree`` (``bin``, ``include``, ``lib``), its wrappers adding no RUNPATH. Raises
    where a program its mpicc links starts without ``tree/lib`` on LD_LIBRARY_PATH, or does not run with it."""
    data = re.compile(r"^mpich-[^/]+\.data/data/(.+)$")
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            m = data.match(info.filename)
            if not m or info.is_dir():
                continue
            dest = tree / m.group(1)
            dest.parent.mkdir(parents=True, exist_ok=True)
            mode = (info.external_attr >> 16) & 0o7777
            if (info.external_attr >> 16) & 0o170000 == 0o120000:  # a symlink: its target is its content
                dest.symlink_to(z.read(info).decode())
                continue
            dest.write_bytes(z.read(info))
            dest.chmod(mode or 0o644)
    for name in WRAPPERS:
        script = tree / "bin" / name
        text = script.read_text()
        if "with_wrapper_dl_type=runpath\n" not in text:
            raise RuntimeError(f"{script}: no with_wrapper_dl_type=runpath to set to none")
        script.write_text(text.replace("with_wrapper_dl_type=runpath\n", "with_wrapper_dl_type=none\n"))
    _check(tree)


def _check(tree: Path) -> None:
    """A program linked by the tree's mpicc runs only with the module's LD_LIBRARY_PATH."""
    work = tree.parent / f"{tree.name}-check"
    work.mkdir(exist_ok=True)
    (work / "hello.c").write_text(HELLO)
    env = {"PATH": f"{tree / 'bin'}:/usr/bin:/bin"}
    built = subprocess.run(["mpicc", "-o", "hello", "hello.c"], cwd=work, env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    if built.returncode != 0:
        raise RuntimeError(f"{tree}/bin/mpicc cannot build a program: {built.stderr[-500:]}")
    bare = subprocess.run([str(work / "hello")], env=env, capture_output=True, text=True, timeout=60)
    if bare.returncode == 0 or NO_LIBMPI not in bare.stderr:
        raise RuntimeError(
            f"a program linked by {tree}/bin/mpicc starts without the module's LD_LIBRARY_PATH "
            f"(a libmpi.so.12 in the linker's default path, or a RUNPATH): {bare.stderr[-300:]}"
        )
    env["LD_LIBRARY_PATH"] = str(tree / "lib")
    moduled = subprocess.run(["mpiexec", "-n", "2", str(work / "hello")], env={**env, "HOME": str(work)},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    ranks = sorted(line for line in moduled.stdout.splitlines() if line.startswith("rank "))
    if moduled.returncode != 0 or ranks != ["rank 0 of 2: MPICH", "rank 1 of 2: MPICH"]:
        raise RuntimeError(
            f"{tree}: mpiexec -n 2 of an MPI program failed: {moduled.stdout}{moduled.stderr}"[-800:]
        )
    shutil.rmtree(work)


if __name__ == "__main__":  # lay out at argv[2] from the wheel argv[1], by hand
    import sys

    lay_out(Path(sys.argv[1]), Path(sys.argv[2]))
    print(os.path.join(sys.argv[2], "bin", "mpicc"))
