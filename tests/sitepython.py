"""Site-built pythons for the emulated sites: a real CPython whose shared libpython lives in its module's own lib
directory, outside the linker's default path, and whose executable carries no RUNPATH to it. Like TACC's python3
modules, it starts only where its module's LD_LIBRARY_PATH names that directory: a venv over it whose activation
skips the module cannot start python ("error while loading shared libraries: libpython3.9.so.1.0").

Made from one of this machine's CPythons built with --enable-shared (pyenv's are): the executable copied and its
RUNPATH removed with patchelf (Debian's package, which .ci/run installs), the libpython copied beside the
standard library, which is linked, not copied (the tree is laid out once per test run: ``site_python``). Where
the system has a libpython of the same name in the linker's default path (Debian's libpython3.11 beside pyenv's
3.11), the copy gets a name of its own (``libpython-site3.11.so.1.0``, the executable patched to need it), so
that the system's cannot stand in for the module's."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

#: What the dynamic loader says when an executable's shared library is on no path it searches.
NO_LIBPYTHON = "error while loading shared libraries: libpython"


def shared_cpython(version: str) -> Optional[Path]:
    """One of this machine's CPythons ``version`` ("3.9") built with a shared libpython: pythonX.Y on PATH where
    it runs (a pyenv shim may not), else one of pyenv's versions."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = [
        shutil.which(f"python{version}"),
        *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}")),
    ]
    probe = (
        "import sys, sysconfig; v = sysconfig.get_config_var; "
        f"ok = sys.version_info[:2] == {tuple(int(p) for p in version.split('.'))} and v('Py_ENABLE_SHARED'); "
        "print(v('LIBDIR') + '/' + v('INSTSONAME') if ok else '')"
    )
    for candidate in filter(None, found):
        res = subprocess.run([candidate, "-c", probe], capture_output=True, text=True, timeout=30)
        lib = Path(res.stdout.strip())
        if res.returncode == 0 and res.stdout.strip() and lib.is_file() and _needs(Path(candidate), lib.name):
            return Path(candidate).resolve()
    return None


def _needs(exe: Path, soname: str) -> bool:
    """Whether ``exe`` loads ``soname`` (Debian's and Ubuntu's pythonX.Y carry their libpython inside, although
    sysconfig says Py_ENABLE_SHARED: such an executable cannot be made to depend on a module)."""
    res = subprocess.run(
        ["patchelf", "--print-needed", str(exe.resolve())], capture_output=True, text=True, timeout=30
    )
    return res.returncode == 0 and soname in res.stdout.split()


def why_not(version: str) -> Optional[str]:
    """Why a site-built python ``version`` cannot be made here (None: it can)."""
    if shutil.which("patchelf") is None:
        return "patchelf is not installed (.ci/run installs Debian's)"
    if shared_cpython(version) is None:
        return f"no CPython {version} whose executable loads a shared libpython here (python{version} or pyenv's)"
    return None


def lay_out(version: str, tree: Path) -> None:
    """The site's python ``version`` at ``tree``: ``bin/pythonX.Y`` (and python3, python) without a RUNPATH,
    ``lib/libpythonX.Y.so.1.0``, ``lib/pythonX.Y`` (the standard library). Raises where it could still start
    without ``tree/lib`` on LD_LIBRARY_PATH (a libpython of that name in the linker's default path)."""
    real = shared_cpython(version)
    if real is None:
        raise RuntimeError(f"no shared-libpython CPython {version} here")
    info = subprocess.run(
        [str(real), "-c", "import sysconfig as s; print(s.get_config_var('LIBDIR')); print(s.get_config_var('INSTSONAME'))"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    libdir, soname = info.stdout.split()
    (tree / "bin").mkdir(parents=True)
    (tree / "lib").mkdir()
    exe = tree / "bin" / f"python{version}"
    shutil.copy2(real, exe)
    subprocess.run(["patchelf", "--remove-rpath", str(exe)], check=True, timeout=60)
    shutil.copy2(Path(libdir) / soname, tree / "lib" / soname)
    (tree / "lib" / f"python{version}").symlink_to(Path(libdir) / f"python{version}")
    for name in ("python3", "python"):
        (tree / "bin" / name).symlink_to(exe.name)
    env = {"PATH": "/usr/bin:/bin"}
    if _starts_bare(exe, env):
        # A libpython of that name the loader finds by itself (Debian's libpython3.11 in its cache, a node's
        # libpython3.12 in a default directory) would stand in for the module's: the tree's own gets a name of its
        # own, which only the module's LD_LIBRARY_PATH finds.
        own = soname.replace("libpython", "libpython-site", 1)
        (tree / "lib" / soname).rename(tree / "lib" / own)
        subprocess.run(["patchelf", "--set-soname", own, str(tree / "lib" / own)], check=True, timeout=60)
        subprocess.run(["patchelf", "--replace-needed", soname, own, str(exe)], check=True, timeout=60)
    if _starts_bare(exe, env):
        raise RuntimeError(
            f"{exe} starts without its module's LD_LIBRARY_PATH, even with a libpython of its own"
        )
    probe = "import sys, ssl; print(sys.prefix)"
    env["LD_LIBRARY_PATH"] = str(tree / "lib")
    moduled = subprocess.run([str(exe), "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    if moduled.returncode != 0 or moduled.stdout.strip() != str(tree):
        raise RuntimeError(f"{exe} does not run from {tree} with its lib: {moduled.stderr[-300:]}")


def _starts_bare(exe: Path, env: dict[str, str]) -> bool:
    """Whether ``exe`` starts without its module (no LD_LIBRARY_PATH), or fails for want of its libpython."""
    bare = subprocess.run([str(exe), "-c", "pass"], env=env, capture_output=True, text=True, timeout=60)
    if bare.returncode != 0 and NO_LIBPYTHON not in bare.stderr:
        raise RuntimeError(f"{exe} fails otherwise than for its libpython: {bare.stderr[-300:]}")
    return bare.returncode == 0
