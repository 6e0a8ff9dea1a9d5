"""Every shipped seed recipe built for real on its emulated site (Zurada and Polaris are in test_conda.py).

A site here is: its module names in the fixture tree (tests/data/modules/site), whose python modules put a REAL
CPython of the module's version on PATH (laid out under ENVBUILDER_TEST_SOFT as the site's software tree; TACC's
are site-built, their libpython found only through the module's LD_LIBRARY_PATH: tests/sitepython.py); download.pytorch.org and PyPI as a local index (tests/torchindex.py) serving STAND-IN torch,
torchvision and torchaudio wheels named as the real ones, with the recipe's build label, for the module's Python,
so the torch build guard checks them as the planned build; Cirrus's packages, among them a stand-in Horovod
source package whose build backend checks the variables it is built with. The TACC recipes are created as
shipped (only the environment sends them here); Cirrus through a layer that moves its prefix off the real /work
and takes Horovod from the index (the shipped spec is a GitHub commit). Each env is then activated and
deactivated in bash with the site's module system, and validated on the CPU: the import check only, through
the local launcher, because a stand-in torch has no torch.distributed for torchrun, mpirun's ranks or DDP."""

from __future__ import annotations

import glob
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import DATA, MODULE_BOOKKEEPING, UserWorld, ok, refused, run_cli
from torchindex import TorchIndex, build_torch_wheel, serve
from wheelindex import build_wheel
from wheelindex import serve as serve_files

from envbuilder.core._toml import loads
from envbuilder.recipe.catalog import builtin_dir

pytestmark = pytest.mark.integration

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
needs_lmod = pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (.ci/run installs it)")
HERE = platform.machine()
#: What download.pytorch.org's builds of these variants carry (torch.version.cuda, the compiled arch list).
CUDA = {"cu121": "12.1", "cu124": "12.4", "cu126": "12.6", "cu128": "12.8"}
ARCH_FLAGS = {
    "cu121": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
    "cu124": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
    "cu126": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
    "cu128": "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
}
#: Shell bookkeeping: not the env's to restore.
NOISE = {"_", "PWD", "OLDPWD", "SHLVL", "PS1"}


@dataclass(frozen=True)
class Site:
    """A shipped recipe and what its emulated site needs: the module that brings its python, where that module
    puts the interpreter (under the soft tree), the Python and the torch family the recipe plans."""

    recipe: str
    module: str
    soft: str
    python: str
    arch: str
    torch: str
    variant: str
    vision: str
    audio: str

    @property
    def tag(self) -> str:
        py = "cp" + self.python.replace(".", "")
        return f"{py}-{py}-manylinux_2_28_{self.arch}"

    @property
    def requirements(self) -> list[str]:
        return [
            f"torch=={self.torch}+{self.variant}",
            f"torchvision=={self.vision}",
            f"torchaudio=={self.audio}",
        ]


FRONTERA_CU124 = Site(
    "frontera-venv-cu124",
    "python3/3.9.2",
    "python-3.9.2",
    "3.9",
    "x86_64",
    "2.6.0",
    "cu124",
    "0.21.0",
    "2.6.0",
)
FRONTERA_CU126 = Site(
    "frontera-venv-cu126",
    "python3/3.9.2",
    "python-3.9.2",
    "3.9",
    "x86_64",
    "2.8.0",
    "cu126",
    "0.23.0",
    "2.8.0",
)
LONESTAR6 = Site(
    "lonestar6-venv-cu128",
    "python3/3.9.7",
    "python-3.9.7",
    "3.9",
    "x86_64",
    "2.8.0",
    "cu128",
    "0.23.0",
    "2.8.0",
)
STAMPEDE3 = Site(
    "stampede3-venv-cu126",
    "python/3.9.18",
    "python-3.9.18",
    "3.9",
    "x86_64",
    "2.8.0",
    "cu126",
    "0.23.0",
    "2.8.0",
)
VISTA = Site(
    "vista-venv-cu124",
    "python3/3.11.8",
    "python-3.11.8",
    "3.11",
    "aarch64",
    "2.10.0",
    "cu126",
    "0.25.0",
    "2.10.0",
)
CIRRUS = Site(
    "cirrus-venv-cu121-horovod",
    "python/3.12.1-gpu",
    "miniconda3-3.12.1",
    "3.12",
    "x86_64",
    "2.3.1",
    "cu121",
    "0.18.1",
    "2.3.1",
)
SITES = (FRONTERA_CU124, FRONTERA_CU126, LONESTAR6, STAMPEDE3, VISTA, CIRRUS)
#: Cirrus's other packages, from PyPI: stand-ins with the recipe's pins.
CIRRUS_EXTRAS = {
    "torchmetrics": "1.0.3",
    "torchtext": "0.18.0",
    "tensorboard": "2.17.0",
    "torch-tb-profiler": "0.4.3",
}
HOROVOD = "0.28.1"

#: The stand-in Horovod's in-tree build backend (PEP 517): it checks the variables the recipe's build_env and
#: build_env_prepend set, as Horovod's setup reads them, and records them in the wheel it builds.
HOROVOD_BACKEND = r"""
import base64, hashlib, json, os, zipfile

WANTED = {
    "HOROVOD_GPU": "CUDA", "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CPU_OPERATIONS": "MPI",
    "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_TENSORFLOW": "0",
    "HOROVOD_WITH_MXNET": "0", "HOROVOD_BUILD_CUDA_CC_LIST": "70", "CC": "mpicc", "CXX": "mpicxx",
}
SEEN = sorted({*WANTED, "HOROVOD_CUDA_HOME", "HOROVOD_NCCL_HOME", "CUDA_PATH", "LIBRARY_PATH", "NVHPC_ROOT",
               "CMAKE_VERSION"})


def _problems():
    env = os.environ
    bad = [f"{k}={env.get(k)!r}, wanted {v!r}" for k, v in WANTED.items() if env.get(k) != v]
    root = env.get("NVHPC_ROOT", "")
    if not root:
        bad.append("NVHPC_ROOT is not set: the python module was not loaded for the build")
    if env.get("HOROVOD_CUDA_HOME") != root + "/cuda/12.4":
        bad.append(f"HOROVOD_CUDA_HOME={env.get('HOROVOD_CUDA_HOME')!r} is not NVHPC's CUDA 12.4")
    if not env.get("LIBRARY_PATH", "").startswith(root + "/cuda/lib64/stubs:"):
        bad.append(f"LIBRARY_PATH={env.get('LIBRARY_PATH')!r} does not begin with NVHPC's stubs directory")
    return bad


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    bad = _problems()
    if bad:
        raise SystemExit("stand-in horovod: wrong build environment:\n" + "\n".join(bad))
    name = "horovod-@VERSION@-py3-none-any.whl"
    files = {
        "horovod/__init__.py": "__version__ = '@VERSION@'\n",
        "horovod/build_env.json": json.dumps({k: os.environ.get(k) for k in SEEN}),
        "horovod-@VERSION@.dist-info/METADATA": "Metadata-Version: 2.1\nName: horovod\nVersion: @VERSION@\n",
        "horovod-@VERSION@.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: stand-in\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files["horovod-@VERSION@.dist-info/RECORD"] = "\n".join([*record, "horovod-@VERSION@.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return name
"""


def horovod_sdist(out: Path) -> Path:
    """The stand-in Horovod source package: its build backend in the tree, nothing to fetch for the build
    (the recipe builds Horovod without isolation, against the env's own packages)."""
    dist = f"horovod-{HOROVOD}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "standin_backend"\nbackend-path = ["."]\n',
        "standin_backend.py": HOROVOD_BACKEND.replace("@VERSION@", HOROVOD),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: horovod\nVersion: {HOROVOD}\n",
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{dist}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def torch_family(out: Path, site: Site) -> list[Path]:
    """Stand-in torch, torchvision and torchaudio as download.pytorch.org names them for ``site``
    (torch-2.8.0+cu126-cp39-cp39-manylinux_2_28_x86_64.whl), each torch add-on pinned to its torch."""
    torch = build_torch_wheel(
        out, site.torch, site.variant, CUDA[site.variant], ARCH_FLAGS[site.variant], tag=site.tag
    )
    addons = [
        build_wheel(
            out,
            name,
            f"{version}+{site.variant}",
            {f"{name}/__init__.py": f"__version__ = '{version}'\n"},
            requires=[f"torch=={site.torch}"],
            tag=site.tag,
        )
        for name, version in (("torchvision", site.vision), ("torchaudio", site.audio))
    ]
    return [torch, *addons]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """ENVBUILDER_INDEX_MIRROR for the emulated sites: download.pytorch.org's variant roots, each with its own
    files, and PyPI (a plain index: it serves the Horovod source package too)."""
    files = tmp_path_factory.mktemp("seed-site-wheels")
    torch_roots = TorchIndex()
    for site in SITES:
        for wheel in torch_family(files / site.variant, site):
            torch_roots.add(f"whl/{site.variant}", wheel)
    for name, version in CIRRUS_EXTRAS.items():
        build_wheel(files / "pypi", name, version, {f"{name.replace('-', '_')}/__init__.py": ""})
    horovod_sdist(files / "pypi")
    with serve(torch_roots) as torch_index, serve_files(files / "pypi") as pypi:
        yield f"https://download.pytorch.org/whl/={torch_index.url}/whl/ pypi={pypi.url}/simple/"


def cpython(version: str) -> Optional[Path]:
    """This machine's CPython ``version`` ("3.9"): pythonX.Y on PATH where it runs (a pyenv shim may not), else
    one of pyenv's versions."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = [
        shutil.which(f"python{version}"),
        *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}")),
    ]
    want = tuple(int(v) for v in version.split("."))
    for candidate in filter(None, found):
        res = subprocess.run([candidate, "-c", f"import sys; sys.exit(sys.version_info[:2] != {want})"],
                             capture_output=True, timeout=30)  # fmt: skip
        if res.returncode == 0:
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def soft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The emulated sites' software tree (ENVBUILDER_TEST_SOFT), filled by ``needs_python`` as tests need it."""
    return tmp_path_factory.mktemp("soft")


def needs_python(soft: Path, site: Site, site_python: Optional[Callable[[str], Path]] = None) -> None:
    """The site's python module's directory under ``soft``: for TACC's modules a site-built CPython of the
    module's version (tests/sitepython.py: its libpython found only through the module's LD_LIBRARY_PATH, as
    TACC builds theirs); for Cirrus's Miniconda python, whose libraries its own RUNPATH finds, this machine's
    CPython as python3, python and pythonX.Y. Skips where this machine has no such python."""
    home = soft / site.soft
    if home.exists():  # laid out for another recipe of the site
        return
    if site is not CIRRUS:
        assert site_python is not None, "TACC's modules need the site_python fixture"
        home.symlink_to(site_python(site.python))
        return
    real = cpython(site.python)
    if real is None:
        pytest.skip(
            f"no CPython {site.python} on this machine (python{site.python} or pyenv's) for {site.module}"
        )
    (home / "bin").mkdir(parents=True)
    for name in ("python3", "python", f"python{site.python}"):
        (home / "bin" / name).symlink_to(real)


class World(UserWorld):
    """A user of the emulated site: the fixture module tree, its software, the local index for PyPI and
    download.pytorch.org, and $WORK beside $SCRATCH."""

    def __init__(self, root: Path, mirror: str, soft: Path, uv_cache: Path, **extra: str) -> None:
        super().__init__(
            root,
            mirror,
            MODULEPATH=str(DATA / "modules" / "site"),
            ENVBUILDER_TEST_SOFT=str(soft),
            UV_CACHE_DIR=str(uv_cache),
            USER="tester",
            PROJECT="p01",
            WORK=str(root / "work"),
            **extra,
        )

    def round_trip(self, prefix: Path, init: str, **extra: str) -> tuple[dict[str, str], dict[str, str], str]:
        """Activate and deactivate the env in bash with the site's module system: the variables before and
        during (asserting that after equals before, but for the module system's bookkeeping), and what the
        activated python says."""
        work = self.root / "shell"
        work.mkdir(exist_ok=True)
        script = (
            f". {init}\n"
            'dump() { env -0 > "$1"; }\n'
            'dump "$2/before"\n'
            '. "$1/bin/activate"\n'
            'dump "$2/during"\n'
            "python -c 'import json, sys, torch; print(json.dumps([sys.executable, "
            '"%d.%d" % sys.version_info[:2], torch.__version__, torch.version.cuda]))\' || exit 3\n'
            "deactivate\n"
            'dump "$2/after"\n'
        )
        argv = ["bash", "--noprofile", "--norc", "-c", script, "driver", str(prefix), str(work)]
        res = ok(subprocess.run(argv, env={**self.env, **extra}, capture_output=True, text=True, timeout=120))
        before, during, after = (read_env(work / n) for n in ("before", "during", "after"))
        assert users(after) == users(before)
        return before, during, res.stdout.strip().splitlines()[-1]


def users(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(MODULE_BOOKKEEPING)}


def read_env(path: Path) -> dict[str, str]:
    data = path.read_bytes().decode()
    return {k: v for k, v in (kv.split("=", 1) for kv in data.split("\0") if "=" in kv) if k not in NOISE}


@pytest.fixture
def world(tmp_path: Path, mirror: str, soft: Path, torch_uv_cache: Path) -> World:
    return World(tmp_path, mirror, soft, torch_uv_cache)


def validated_import(world: World, name: str, **extra: str) -> dict[str, Any]:
    """``validate --cpu --checks import`` through the local launcher (one process of the env's python), passed:
    what its one rank found. The stand-in torch imports and tells its build, and has nothing for torchrun, MPI or
    DDP to run."""
    data = world.data("validate", name, "--cpu", "--checks", "import", "--launcher", "local", **extra)
    check: dict[str, Any] = data["checks"]["import"]
    assert check["status"] == "pass", check
    rank: dict[str, Any] = check["per_rank"]["0"]
    return rank


# ---------------------------------------------------------------------------------------------------------------


@needs_lmod
@pytest.mark.parametrize(
    "site", [FRONTERA_CU124, FRONTERA_CU126, LONESTAR6, STAMPEDE3, VISTA], ids=lambda s: s.recipe
)
def test_tacc_recipe_builds_as_shipped_on_its_emulated_site(world, soft, site, site_python):
    if site.arch != HERE:
        pytest.skip(
            f"{site.recipe} is for {site.arch} nodes and this machine is {HERE}: create builds with the node's "
            f"own python and installs {site.arch} wheels, so it refuses here "
            "(test_vista_recipes_are_refused_on_this_machine checks that refusal; test_aarch64_node.py builds "
            "Vista on the emulated aarch64 node)"
        )
    needs_python(soft, site, site_python)
    plan = world.data("plan", site.recipe)
    assert plan["modules"][-1] == site.module  # Vista loads gcc/15.1.0 first
    assert plan["python"] == {
        "command": "python3",
        "version": site.python,
        "source": "the recipe's [python] version",
        "origin": "module",
        "where": f"python3 on the PATH after loading {', '.join(plan['modules'])}",
    }
    assert plan["torch"]["requirements"] == site.requirements

    data = world.data("create", site.recipe)
    env = data["env"]
    prefix = Path(env["prefix"])
    assert prefix == world.scratch / "envbuilder" / "envs" / site.recipe
    assert env["modules"]["delta_set"]["LOADEDMODULES"] == ":".join(plan["modules"])
    versions = {p["name"]: p["version"] for p in env["packages"] if p["in_env"]}
    assert versions["torch"] == f"{site.torch}+{site.variant}"
    assert versions["torchvision"] == f"{site.vision}+{site.variant}"
    smoke = env["validation"]["checks"]
    assert smoke["import"]["status"] == "pass"
    smoke_python = smoke["import"]["python"]
    assert smoke_python.startswith(site.python + ".")  # the module's python, not this host's

    _, during, said = world.round_trip(prefix, str(LMOD_INIT))
    assert during["VIRTUAL_ENV"] == str(prefix)
    assert json.loads(said) == [
        str(prefix / "bin" / "python"),
        site.python,
        versions["torch"],
        CUDA[site.variant],
    ]

    found = validated_import(world, site.recipe)
    assert (found["torch"], found["cuda"], found["python"]) == (
        versions["torch"],
        CUDA[site.variant],
        smoke_python,
    )


#: A new shell of each kind that sources the env's activate, runs its python and deactivates: $1 the env, $2
#: where the environments before, during and after go. The shell has the site's module system, as a login shell
#: there does, and no module loaded (a job script's shell, a new terminal).
NEW_SHELLS = {
    "bash": (["bash", "--noprofile", "--norc", "-c"], "sh"),
    "zsh": (["zsh", "-f", "-c"], "sh"),
    "fish": (["fish", "--no-config", "-c"], "fish"),
    "tcsh": (["tcsh", "-f", "-c"], "csh"),
}
NEW_SHELL_SCRIPTS = {
    "sh": """. "$EB_TEST_LMOD/init/$(basename "$0")"
env -0 > "$2/before"
. "$1/bin/activate"
env -0 > "$2/during"
python -c 'import sys; print(sys.prefix)' || exit 3
deactivate
env -0 > "$2/after"
""",
    "fish": """source $EB_TEST_LMOD/init/fish
env -0 > $argv[2]/before
source $argv[1]/bin/activate.fish
env -0 > $argv[2]/during
python -c 'import sys; print(sys.prefix)'; or exit 3
deactivate
env -0 > $argv[2]/after
""",
    "csh": """source "$EB_TEST_LMOD/init/tcsh"
env -0 > "$argv[2]/before"
source "$argv[1]/bin/activate.csh"
env -0 > "$argv[2]/during"
python -c 'import sys; print(sys.prefix)' || exit 3
deactivate
env -0 > "$argv[2]/after"
""",
}


@needs_lmod
@pytest.mark.parametrize("shell", list(NEW_SHELLS))
def test_a_new_shell_runs_the_python_of_an_env_built_on_gcc_and_python3(world, soft, site_python, shell):
    """Vista's shape (``module load gcc python3``, then a venv) over a site-built python, whose libpython only
    its module's LD_LIBRARY_PATH finds: activation in a fresh shell must load the build's modules, or python
    cannot start there ("error while loading shared libraries")."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (.ci/run installs bash, zsh, fish and tcsh)")
    needs_python(soft, FRONTERA_CU124, site_python)
    shipped = builtin_dir() / "tacc" / "frontera" / f"{FRONTERA_CU124.recipe}.toml"
    world.write_recipe(
        "tacc-gcc-python3",
        f'schema_version = 1\nextends = "{os.path.relpath(shipped, world.recipes)}"\n'
        'replace = ["modules.load"]\n[recipe]\nname = "tacc-gcc-python3"\n'
        '[modules]\nload = ["gcc/15.1.0", "python3/3.9.2"]\n',
    )
    prefix = Path(world.data("create", "tacc-gcc-python3")["env"]["prefix"])

    work = world.root / f"new-{shell}"
    work.mkdir()
    argv, dialect = NEW_SHELLS[shell]
    # fish's and tcsh's -c take the words after the script as $argv; bash's and zsh's as $0, $1, ...
    args = [shell] if dialect == "sh" else []
    res = subprocess.run([*argv, NEW_SHELL_SCRIPTS[dialect], *args, str(prefix), str(work)],
                         env={**world.env, "EB_TEST_LMOD": str(LMOD_INIT.parent.parent)}, cwd=work,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "libpython" not in res.stderr, res.stderr
    ok(res)
    assert res.stdout.strip().splitlines()[-1] == str(prefix)
    before, during, after = (read_env(work / n) for n in ("before", "during", "after"))
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.9.2"
    assert during["LD_LIBRARY_PATH"].split(":")[0] == f"{soft}/python-3.9.2/lib"
    assert users(after) == users(before)
    # What the plan and show say activation loads.
    plan = world.data("plan", "tacc-gcc-python3")
    assert plan["activate"]["modules"] == ["gcc/15.1.0", "python3/3.9.2"]
    assert "activation loads gcc/15.1.0 python3/3.9.2 (the build's, [modules] load)" in "\n".join(
        plan["steps"]
    )
    shown = world.data("show", "tacc-gcc-python3")["activation"]
    assert shown["loads"] == ["gcc/15.1.0", "python3/3.9.2"]


@needs_lmod
def test_a_record_from_before_activation_loaded_the_build_modules_keeps_working(world, soft, site_python):
    """An env recorded before activation loaded ``[modules] load`` (its activation holds only what
    ``activate.modules`` named, and no ``from_build``): show says which of the build's modules its activation
    leaves out and how to get them, its modulefile loads what it did, and validation, whose job loads the
    build's modules, still runs its python."""
    needs_python(soft, FRONTERA_CU124, site_python)
    world.data("create", FRONTERA_CU124.recipe)
    path = world.home / "envs" / f"{FRONTERA_CU124.recipe}.json"
    record = json.loads(path.read_text())
    assert record["plan"]["activate"]["from_build"] == [FRONTERA_CU124.module]
    del record["plan"]["activate"]["from_build"]
    record["plan"]["activate"]["modules"] = []
    path.write_text(json.dumps(record))

    shown = world.data("show", FRONTERA_CU124.recipe)["activation"]
    assert shown["loads"] == []
    assert shown["said"] == (
        f"loads no module; not loaded: {FRONTERA_CU124.module}, which the env was built with (recorded before "
        "activation loaded the build's modules; `envbuilder create NAME --force` rewrites it)"
    )
    said = ok(world.cli("show", FRONTERA_CU124.recipe)).stdout
    assert f"built with: {FRONTERA_CU124.module}" in " ".join(said.split())
    assert "depends_on" not in world.data("modulefile", FRONTERA_CU124.recipe)["modulefile"]
    assert validated_import(world, FRONTERA_CU124.recipe)["python"].startswith("3.9.")


def cirrus_layer(world: World) -> None:
    """cirrus-venv-cu121-horovod as shipped but for two things: its prefix under the user's $WORK (the shipped
    /work/<project>/... is this machine's real /work), and Horovod from the index: the shipped spec is a commit
    on GitHub, this index serves the stand-in source package. Every package's build settings are the shipped
    ones, copied from the shipped file."""
    shipped = builtin_dir() / "epcc" / "cirrus" / "cirrus-venv-cu121-horovod.toml"
    packages = []
    for shipped_pkg in loads(shipped.read_text())["packages"]:
        pkg = (
            {**shipped_pkg, "spec": f"horovod=={HOROVOD}"}
            if shipped_pkg["name"] == "horovod"
            else shipped_pkg
        )
        packages.append("[[packages]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in pkg.items()))
    rel = os.path.relpath(shipped, world.recipes)
    world.write_recipe(
        CIRRUS.recipe,
        f'schema_version = 1\nextends = "{rel}"\n[recipe]\nname = "{CIRRUS.recipe}"\n'
        '[filesystems.work]\npath = "${WORK}"\n[env]\nprefix = "${WORK}/envbuilder/envs/{name}"\n'
        + "\n".join(packages),
    )


def toml_value(value: Any) -> str:
    """A string, boolean, list of strings or table of those as TOML (JSON's strings are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + " }"
    return json.dumps(value)


def test_cirrus_recipe_builds_horovod_with_its_build_environment(tmp_path, mirror, soft, torch_uv_cache,
                                                                 envmodules_init):  # fmt: skip
    needs_python(soft, CIRRUS)
    # Cirrus runs Tcl Environment Modules: the private copy, found as a login shell finds it.
    world = World(tmp_path, mirror, soft, torch_uv_cache, MODULESHOME=str(envmodules_init.parent),
                  LIBRARY_PATH="/opt/user/lib")  # fmt: skip
    cirrus_layer(world)
    plan = world.data("plan", CIRRUS.recipe)
    assert plan["module_system"] == "environment-modules"
    assert (plan["modules"], plan["build_modules"]) == ([CIRRUS.module], ["cmake/3.25.2"])
    assert plan["python"] == {
        "command": "python",
        "version": CIRRUS.python,
        "source": "the recipe's [python] version",
        "origin": "module",
        "where": f"python on the PATH after loading {CIRRUS.module}",
    }

    data = world.data("create", CIRRUS.recipe)
    env = data["env"]
    prefix = Path(env["prefix"])
    assert prefix == world.root / "work" / "envbuilder" / "envs" / CIRRUS.recipe
    versions = {p["name"]: p["version"] for p in env["packages"] if p["in_env"]}
    assert versions["torch"] == f"{CIRRUS.torch}+{CIRRUS.variant}"
    assert {k: versions[k] for k in CIRRUS_EXTRAS} == CIRRUS_EXTRAS
    assert versions["horovod"] == HOROVOD
    assert env["validation"]["checks"]["import"]["python"].startswith("3.12.")
    # What Horovod was built with: the module's NVHPC, the stubs before the user's LIBRARY_PATH, cmake loaded.
    site_packages = prefix / "lib" / "python3.12" / "site-packages"
    built = json.loads((site_packages / "horovod" / "build_env.json").read_text())
    nvhpc = f"{soft}/nvidia/hpc_sdk/Linux_x86_64/24.5"
    assert built["NVHPC_ROOT"] == nvhpc
    assert built["HOROVOD_NCCL_HOME"] == f"{nvhpc}/comm_libs/nccl"
    assert built["LIBRARY_PATH"] == f"{nvhpc}/cuda/lib64/stubs:/opt/user/lib"
    assert built["CMAKE_VERSION"] == "3.25.2"

    # The activate extension loads python/3.12.1-gpu and sets the horovod profile; deactivate undoes both.
    _, during, said = world.round_trip(prefix, str(envmodules_init / "bash"))
    assert during["LOADEDMODULES"] == CIRRUS.module
    assert (during["HOROVOD_MPI"], during["HOROVOD_MPI_THREADS_DISABLE"]) == ("1", "1")
    assert during["LIBRARY_PATH"] == "/opt/user/lib"  # the stubs were for the build only
    assert "CMAKE_VERSION" not in during  # a build-only module
    assert json.loads(said) == [str(prefix / "bin" / "python"), "3.12", versions["torch"], "12.1"]

    found = validated_import(world, CIRRUS.recipe)
    assert found["file"] == str(site_packages / "torch")


@pytest.mark.skipif(
    HERE != "x86_64", reason="checks what an x86_64 machine does with Vista's aarch64 recipes"
)
@pytest.mark.parametrize(
    "recipe", ["vista-venv-cu124", "vista-venv-mpi-cu126", "vista-overlay-system", "vista-apptainer"]
)
def test_vista_recipes_are_refused_on_this_machine(world, recipe):
    refused(world.cli("create", recipe), 4, f"{recipe} is for aarch64 nodes, and this machine is x86_64")
    assert not (world.scratch / "envbuilder" / "envs" / recipe).exists()


#: How each seed site's compute OS reads in a plan: "unknown, ..." where the site cannot say.
LOGIN_OS = {
    "frontera-venv-cu124": "compute os: unknown, the site does not know it: TACC has never named Frontera's OS",
    "stampede3-venv-cu126": "compute os: Rocky Linux (release not published), the site's (TACC/TACC-Docs@",
}


@pytest.mark.parametrize("recipe", sorted(LOGIN_OS))
def test_plan_on_a_login_node_marks_the_facts_it_took_from_this_host(recipe):
    """This machine plays the login node: its glibc is not the compute nodes', which TACC does not publish for
    Frontera, nor for Stampede3, whose Rocky release it leaves open."""
    res = ok(run_cli("plan", recipe))
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    assert f"glibc {glibc} (from this host)" in res.stdout, res.stdout
    assert LOGIN_OS[recipe] in res.stdout, res.stdout
    assert "compute python: 3.9, python.version in builtin:tacc/" in res.stdout, res.stdout
    assert f"the glibc gate (manylinux wheels) was decided on this host's glibc {glibc}" in res.stderr


#: The compute glibc each seed site states (read in its pages, or derived from the OS release they name), and
#: the sites that state no OS. Every other fact the site does not know is this host's, or unknown.
SITE_GLIBC = {"lonestar6": "2.28", "polaris": "2.38", "cirrus": "2.28", "zurada": "2.34"}
NO_SITE_OS = {"frontera", "vista", "lumi"}  # lumi: an example site whose OS its pages do not give
#: Each seed recipe and its site file; not a container env's, whose plan checks the image's facts (its own libc
#: and OS) instead of the node's glibc and OS.
SEED_SITES = {
    path.stem: path.parent / "site.toml"
    for path in builtin_dir().rglob("*.toml")
    if path.name not in {"site.toml", "center.toml", "local.toml"}
    and loads(path.read_text()).get("env", {}).get("kind") != "container"
}


@pytest.mark.parametrize("recipe", sorted(SEED_SITES))
def test_plan_json_reports_the_sites_glibc_and_os_with_origin_site(recipe):
    res = ok(run_cli("plan", recipe, "--json"))
    facts = {f["name"]: f for f in json.loads(res.stdout)["data"]["target_facts"]}
    site = recipe.split("-")[0]
    compute = loads(SEED_SITES[recipe].read_text())["compute"]
    glibc, osf = facts["glibc"], facts["os"]
    if site in SITE_GLIBC:
        assert (glibc["value"], glibc["origin"]) == (SITE_GLIBC[site], "site"), glibc
        assert compute["sources"]["glibc"]["source"] in glibc["detail"], glibc
        assert "checked 2026-11-28" in glibc["detail"], glibc
        assert "glibc gate" not in res.stderr, res.stderr
    else:
        assert glibc["origin"] in {"host", "unknown"}, glibc
        assert "the site does not know it: " in glibc["detail"], glibc
    if site in NO_SITE_OS:
        assert (osf["value"], osf["origin"]) == (None, "unknown"), osf
    else:
        assert (osf["value"], osf["origin"]) == (compute["os"], "site"), osf
