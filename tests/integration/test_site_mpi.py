"""mpi4py against a site's MPI module: a real MPICH laid out as a site installs it (tests/mpitwin.py), its libmpi
found only through its module's LD_LIBRARY_PATH (tests/data/modules/site/mpich/5.0.2.lua) and its mpicc recording
no RUNPATH. A recipe loads the module and builds mpi4py from source with it, as vista-venv-mpi-cu126 does
(``no_binary = true``, ``build_env = { MPICC = "mpicc" }``): mpi4py's extension links to the module's libmpi, a
new shell's activation must load the module for ``from mpi4py import MPI`` to work, validation's ranks must get it
too, and the env's python without the module fails with the loader's error, which shows that the twin is real.

The files: the session's torch files (torch 2.13.0 CPU, and PyPI's mpich wheel, which the site MPI is made from),
mpi4py's source (with the C its Cython makes, added once per machine by tests/testwheels.py, so a build compiles
and links only) and its build requirements (conftest's ``mpi4py_source``), as one wheelhouse standing for PyPI;
download.pytorch.org is the session's torch index. mpi4py's C compiles unoptimised (CFLAGS=-O0): ~50 s on this
2-core machine, where -O2 takes ~2.5 minutes; what it links against is the same. The env is built once for the
module's tests."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import mpitwin
import pytest
from helpers import DATA, UserWorld, lmod_vars
from wheelindex import serve

pytestmark = pytest.mark.integration

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
NAME = "site-mpi"
RECIPE = f"""schema_version = 1

[recipe]
name = "{NAME}"
description = "mpi4py built from source against the site's MPI module"

[modules]
load = ["{mpitwin.MODULE}"]

[python]
command = "python3"

[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envbuilder/envs/{{name}}"

[torch]
version = "2.13.0"
variant = "cpu"
packages = ["torch"]

[[packages]]
name = "mpi4py"
no_binary = true
build_env = {{ MPICC = "mpicc" }}

[launcher]
default = "mpiexec"
"""


class MpiWorld(UserWorld):
    """A user of a site whose MPI comes from its module: the fixture module tree, the site's software tree
    (ENVBUILDER_TEST_SOFT) holding the MPI, and the indexes of ``index_mirror``; the env built in it at ``prefix``."""

    def __init__(self, root: Path, index_mirror: str, soft: Path, uv_cache: Path) -> None:
        super().__init__(
            root,
            index_mirror,
            MODULEPATH=str(DATA / "modules" / "site"),
            UV_CACHE_DIR=str(uv_cache),
            ENVBUILDER_TEST_SOFT=str(soft),
            CFLAGS="-O0 -g0",
            USER="tester",
            **lmod_vars(),
        )
        self.soft = soft
        self.prefix = self.scratch / "envbuilder" / "envs" / NAME
        self.write_recipe(NAME, RECIPE)

    def extension(self) -> Path:
        """mpi4py's MPI extension in the env."""
        (found,) = self.prefix.glob("lib/python3.*/site-packages/mpi4py/MPI.*.so")
        return found

    def new_shell(self, script: str) -> subprocess.CompletedProcess[str]:
        """``script`` in a new login-like bash: Lmod's init, then ``source PREFIX/bin/activate``, with the user's
        environment and no module loaded (no LD_LIBRARY_PATH)."""
        env = {k: v for k, v in self.env.items() if k != "LD_LIBRARY_PATH"}
        text = f'. {LMOD_INIT}\n. "{self.prefix}/bin/activate" || exit 9\n{script}'
        return subprocess.run(["bash", "--norc", "--noprofile", "-c", text], env=env, capture_output=True,
                              text=True, timeout=300, cwd=self.root)  # fmt: skip


@pytest.fixture(scope="module")
def mpi_mirror(tmp_path_factory, mpi4py_source, torch_files, torch_index) -> Iterator[str]:
    """ENVBUILDER_INDEX_MIRROR for the module: download.pytorch.org is the session's torch index, whose torch
    the session's uv cache holds unpacked; PyPI is the wheelhouse (the torch files, mpi4py's source and its build
    requirements), served on loopback."""
    wheelhouse = tmp_path_factory.mktemp("site-mpi-wheelhouse")
    for d in (torch_files, mpi4py_source):
        for f in d.iterdir():
            if not (wheelhouse / f.name).exists():  # setuptools is in both
                (wheelhouse / f.name).symlink_to(f)
    with serve(wheelhouse) as pypi:
        yield f"https://download.pytorch.org/whl/={torch_index.url}/whl/ pypi={pypi.url}/simple/"


@pytest.fixture(scope="module")
def mpi_world(tmp_path_factory, site_mpi, mpi_mirror, torch_uv_cache) -> MpiWorld:
    """The module's env, built once, with uv's cache the session's: torch is linked from where the session
    unpacked it, not unpacked again for this module."""
    if not LMOD_INIT.is_file():
        pytest.skip("Lmod not installed (.ci/run installs it)")
    root = tmp_path_factory.mktemp("site-mpi")
    soft = root / "soft"
    soft.mkdir()
    (soft / mpitwin.DIRNAME).symlink_to(site_mpi)
    world = MpiWorld(root, mpi_mirror, soft, torch_uv_cache)
    res = world.cli("create", NAME, "--no-validate", "--json", timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return world


def test_mpi4py_built_by_the_recipe_links_the_modules_libmpi_and_a_new_shell_runs_it(mpi_world):
    """ldd of mpi4py's extension, with the module loaded by a new shell's activation, shows the module's libmpi;
    ``from mpi4py import MPI`` works there; and a validation with two ranks through the module's mpiexec passes
    the MPI check, each rank on the module's MPICH."""
    world = mpi_world
    # Built here from the source, not PyPI's wheel (whose tag is manylinux).
    (wheel,) = world.prefix.glob("lib/python3.*/site-packages/mpi4py-*.dist-info/WHEEL")
    assert "Tag: cp311-cp311-linux_x86_64\n" in wheel.read_text()
    libmpi = world.soft / mpitwin.DIRNAME / "lib" / "libmpi.so.12"
    shown = world.new_shell(
        f'ldd "{world.extension()}"\n'
        "python -c 'from mpi4py import MPI; print(\"library:\", MPI.Get_library_version().splitlines()[0])' || exit 3\n"
        'echo "modules: $LOADEDMODULES"\n'
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert f"\tlibmpi.so.12 => {libmpi} " in [line.split("(")[0] for line in lines], shown.stdout
    assert any(line.startswith("library: MPICH Version:") for line in lines), shown.stdout
    assert f"modules: {mpitwin.MODULE}" in lines

    res = world.cli("validate", NAME, "--cpu", "--checks", "import,mpi", "--launcher", "mpiexec",
                    "--nproc-per-node", "2", "--json", timeout=600)  # fmt: skip
    try:
        envelope = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"no JSON (rc {res.returncode}): {res.stderr[-3000:]}")
    assert res.returncode == 0, json.dumps(envelope, indent=1)[-4000:]
    found = envelope["data"]
    assert (found["device"], found["world"]) == ("cpu", 2)
    assert found["command"][:3] == ["mpiexec", "-n", "2"]
    mpi = found["checks"]["mpi"]
    assert mpi["status"] == "pass" and mpi["ranks"] == [0, 1], mpi
    assert mpi["per_rank"]["0"]["library"].startswith("MPICH Version:")


def test_without_the_module_the_envs_python_cannot_import_mpi4py(mpi_world):
    """The env's python with no module loaded (a venv whose activation skipped it): the loader finds no libmpi,
    so the MPI twin is real (a libmpi on the default path, or a RUNPATH from the wrapper, would hide that)."""
    world = mpi_world
    bare = {"PATH": "/usr/bin:/bin", "HOME": world.env["HOME"]}
    res = subprocess.run([str(world.prefix / "bin" / "python"), "-c", "from mpi4py import MPI"], env=bare,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode != 0
    assert "ImportError: libmpi.so.12: cannot open shared object file" in res.stderr, res.stderr
    ldd = subprocess.run(
        ["ldd", str(world.extension())], env=bare, capture_output=True, text=True, timeout=60
    )
    assert "\tlibmpi.so.12 => not found" in ldd.stdout.splitlines(), ldd.stdout
    # The same python starts and imports the rest: only the module's library is missing.
    ok = subprocess.run([str(world.prefix / "bin" / "python"), "-c", "import mpi4py, torch"], env=bare,
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_an_env_without_the_mpi_module_gets_no_mpi4py_built_for_another_env(mpi_world):
    """``no_binary`` builds against the modules this build loads: the installer's cache, which the user's envs
    share, holds the mpi4py built for the env above, against the module's MPI, and must not hand it to an env that
    loads no MPI. Its build finds no MPI, and create says so; before, create installed the other env's build,
    which links to a libmpi this env never loads."""
    world = mpi_world
    name = "no-mpi-module"
    world.write_recipe(
        name,
        RECIPE.replace(f'name = "{NAME}"', f'name = "{name}"').replace(
            f'load = ["{mpitwin.MODULE}"]', "load = []"
        ),
    )
    res = world.cli("create", name, "--no-validate", "--json", timeout=1200)
    assert res.returncode == 11, f"exit {res.returncode}: " + res.stdout[-2000:] + res.stderr[-2000:]
    # mpi4py's own build ran, with the recipe's MPICC, and found no MPI.
    assert "installing mpi4py" in res.stderr and "mpicc='mpicc' not found" in res.stderr, res.stderr
    assert not (world.scratch / "envbuilder" / "envs" / name).exists()


def test_run_starts_mpi_ranks_that_import_mpi4py_through_the_module(mpi_world):
    """``envbuilder run`` through the module's mpiexec: its two ranks get the module's LD_LIBRARY_PATH and are one
    MPI world (each a singleton would mean another MPI)."""
    program = (
        "from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print(f'rank {c.Get_rank()} of {c.Get_size()} sum {c.allreduce(c.Get_rank() + 1)}', flush=True)"
    )
    res = mpi_world.cli("run", NAME, "--launcher", "mpiexec", "--gpus-per-node", "2", "--", "python", "-c", program,
                        timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    ranks = sorted(line for line in res.stdout.splitlines() if line.startswith("rank "))
    assert ranks == ["rank 0 of 2 sum 3", "rank 1 of 2 sum 3"], res.stdout + res.stderr
