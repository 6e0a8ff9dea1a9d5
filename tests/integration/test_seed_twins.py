"""The seven seed systems, each created and validated with REAL torch on the CPU in its twin (Vista's twin is the
aarch64 node of test_aarch64_node.py; the six x86_64 systems are here).

What is the site's in each twin: the shipped recipe and its site.toml (everything but the keys below), the
site's module system and module names (tests/data/modules/site: TACC's and Zurada's Lmod, Cirrus's Tcl
Environment Modules, Polaris's conda module with its ``conda`` shell function), TACC's site-built pythons whose
libpython only the module's LD_LIBRARY_PATH finds (tests/sitepython.py), the prefix (but where noted below), the
activation (the env's ``bin/activate`` in a new bash with the site's module system) and the launcher the site
uses: torchrun on the TACC systems (their default), srun inside a job step of the tests' real Slurm
(tests/slurm.py) on Zurada, Open MPI's ``mpirun`` argv on Cirrus (run by MPICH's hydra, which takes it), and
Polaris's ``mpiexec`` (PALS's argv, through the PALS stand-in tests/shims/alcf/mpiexec over MPICH's hydra).

What is the twin's: the only x86_64 torch this machine has offline is the CPU wheel torch 2.13.0+cpu for CPython
3.11 (tests/conftest.py ``torch_files``, served from loopback as download.pytorch.org's whl/cpu and PyPI). So each
recipe is created through a layer that extends the shipped file and changes ONLY:

- ``[torch] version = "2.13.0"``, ``variant = "cpu"``, ``packages = ["torch"]`` (no torchvision or torchaudio
  wheel here);
- where the shipped python is not 3.11: ``[python] version = "3.11"`` and the python module for one of the same
  site's naming scheme (tests/data/modules/twin: TACC's ``python3/3.11.7`` and ``python/3.11.7``, site-built as
  TACC's; Cirrus's Miniconda ``python/3.11.7-gpu``, also in ``[activate] modules``); Zurada's conda python;
- where the shipped value is this machine's or GitHub's: Cirrus's prefix (the real /work) and Horovod spec (a
  commit on GitHub: the stand-in source package of test_seed_sites.py, built with the shipped build settings),
  Polaris's ``[modules] use`` (/soft/modulefiles, for the fixture conda module's tree), Zurada's prefix (/work);
- Cirrus's MPI: the recipe lists the mpi check but no mpi4py, which on Cirrus the python module's Miniconda
  brings (the env sees it through system site packages); here mpi4py and MPICH from PyPI are two packages of
  the layer, since the machine's CPython has none. Cirrus's other PyPI packages are stand-ins with the shipped
  pins (no real wheels here).

Besides the layer, the twins' own parts: Polaris's site conda env (built here with the CPU torch, mpi4py and
MPICH; MPICH's launchers taken out, its library on the module's LD_LIBRARY_PATH as Cray PE's modules put Cray
MPICH's) and the PALS stand-in, which checks PALS's options but binds no CPUs (hydra has no --depth); Zurada's
job step asks for the test cluster's partition and cores instead of gpu2h100's 32.

Each test asserts that the layer's effective recipe (``recipes show``) differs from the shipped one in exactly
those keys (the ``[recipe]`` table, the layer's name, aside), and that the plan's site, env kind, installer,
module system, launcher, interactive command, partition and file system are the shipped plan's. Validation runs
``validate --cpu`` with import and gloo DDP over 2 ranks, plus MPI where the recipe lists it (Cirrus, Polaris);
Frontera's twin is also validated as a batch job of the real Slurm (``validate --submit``), submitted from an
environment without bash's exported ``module`` function (a tcsh, zsh or fish user's), and runs the help's own
``envbuilder sbatch ENV -- python train.py`` as a job there: both failed before envbuilder's job scripts sourced
the module system's init and put the env's bin on PATH.

Times on this shared 2-core machine, the whole file: ~2.5 min (each test 15-35 s: torch is linked from the
session's uv cache, the conda sites' from their module's)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from condachannel import conda_function_module
from condaworld import PY
from condaworld import World as CondaWorld
from helpers import DATA, REPO, UserWorld, cli_argv, cli_env, ok, run_cli
from slurm import ENDED, job_record
from test_seed_sites import CIRRUS_EXTRAS, HOROVOD, horovod_sdist, toml_value
from wheelindex import build_wheel, mirror_env
from wheelindex import serve as serve_files

from envbuilder.core import settings
from envbuilder.core._toml import loads
from envbuilder.recipe.catalog import builtin_dir
from envbuilder.system import host

pytestmark = pytest.mark.integration

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
needs_lmod = pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (.ci/run installs it)")
#: The twin's python modules (of each site's naming scheme), before the site's own tree.
MODULEPATH = f"{DATA / 'modules' / 'twin'}:{DATA / 'modules' / 'site'}"
TWIN_PYTHON = "3.11.7"
TORCH_LAYER = '[torch]\nversion = "2.13.0"\nvariant = "cpu"\npackages = ["torch"]\n'
#: What the layer changes in every recipe that installs torch, as ``changed`` gives it.
TORCH_KEYS = {"torch.version": "2.13.0", "torch.variant": "cpu", "torch.packages": ["torch"]}
IMPORT_DDP = "import,ddp"

#: The seed systems and the test that creates and validates each in its twin (file::function).
SEED_SYSTEMS = {
    "frontera": "test_seed_twins.py::test_tacc_system_in_its_twin",
    "stampede3": "test_seed_twins.py::test_tacc_system_in_its_twin",
    "lonestar6": "test_seed_twins.py::test_tacc_system_in_its_twin",
    "vista": "test_aarch64_node.py::test_vista_venv_is_created_and_validated_on_an_aarch64_node",
    "zurada": "test_seed_twins.py::test_zurada_in_its_twin",
    "cirrus": "test_seed_twins.py::test_cirrus_in_its_twin",
    "polaris": "test_seed_twins.py::test_polaris_in_its_twin",
}


def _examples_only(site: Path) -> bool:
    """A site directory whose every recipe is marked ``recipe.example`` (published as an example of a site that
    is no seed system, e.g. LUMI's ROCm recipe): it has no twin to test."""
    recipes = [p for p in site.glob("*.toml") if p.name != "site.toml"]
    return bool(recipes) and all(
        loads(p.read_text()).get("recipe", {}).get("example") is True for p in recipes
    )


def test_every_seed_system_has_its_twin_test():
    """Every site shipped under recipes/ is a seed system above, and each named test exists (a seed system added
    without a twin fails here)."""
    shipped = {p.parent.name for p in builtin_dir().rglob("site.toml") if not _examples_only(p.parent)}
    assert shipped == set(SEED_SYSTEMS)
    here = Path(__file__).parent
    for system, test in SEED_SYSTEMS.items():
        path, func = test.split("::")
        tree = ast.parse((here / path).read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert func in defined, (system, test)
    # The parametrized TACC test covers exactly the systems that name it.
    tacc = sorted(s for s, test in SEED_SYSTEMS.items() if test.endswith("::test_tacc_system_in_its_twin"))
    assert sorted(site.system for site in TACC) == tacc


# --- what the layer changed ------------------------------------------------------------------------------------


def flat(node: Any, path: str = "") -> dict[str, Any]:
    """A recipe's values as dotted keys; a list of tables with names (packages) as ``packages[NAME].key``."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flat(value, f"{path}.{key}" if path else key))
        return out
    if isinstance(node, list) and node and all(isinstance(v, dict) and "name" in v for v in node):
        out = {}
        for item in node:
            out.update(flat(item, f"{path}[{item['name']}]"))
        return out
    return {path: node}


def changed(world: UserWorld, shipped: str, layer: str) -> dict[str, Any]:
    """The layer's effective values that differ from the shipped recipe's (``recipes show``): key -> layer's.
    The ``[recipe]`` table (the layer's name; a description is never inherited) is the layer's own."""
    theirs = flat(world.data("recipes", "show", shipped, "--offline")["values"])
    ours = flat(world.data("recipes", "show", layer, "--offline")["values"])
    keys = sorted(k for k in set(theirs) | set(ours) if not k.startswith("recipe."))
    return {k: ours.get(k) for k in keys if theirs.get(k) != ours.get(k)}


#: What the plan decides from the site that a layer must not touch.
SITE_PLAN_KEYS = (
    "site",
    "kind",
    "installer",
    "module_system",
    "launcher",
    "interactive_command",
    "partition",
)


def same_site_plan(
    world: UserWorld, shipped: str, layer: str, **extra: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shipped plan and the layer's, after checking that what the layer's takes from the site is the
    shipped plan's."""
    theirs = world.data("plan", shipped, "--offline", **extra)
    ours: dict[str, Any] = world.data("plan", layer, **extra)
    for key in SITE_PLAN_KEYS:
        assert ours[key] == theirs[key], key
    assert ours["filesystem"]["name"] == theirs["filesystem"]["name"]
    assert ours["module_use"] == theirs["module_use"] or "modules.use" in changed(world, shipped, layer)
    return theirs, ours


def write_layer(world: UserWorld, shipped: Path, name: str, body: str, replace: tuple[str, ...] = ()) -> None:
    """The layer ``name``: the shipped file extended by path, ``replace`` naming the lists it replaces."""
    rel = os.path.relpath(shipped, world.recipes)
    world.write_recipe(name, f'schema_version = 1\nextends = "{rel}"\nreplace = {json.dumps(list(replace))}\n'
                       f'[recipe]\nname = "{name}"\n{body}')  # fmt: skip


# --- validation --------------------------------------------------------------------------------------------------


def passed(data: dict[str, Any], checks: str, world: int = 2) -> dict[str, Any]:
    """The checks of a validation report, each named one passed on every rank of a CPU run of ``world``."""
    assert (data["device"], data["world"]) == ("cpu", world), data
    found: dict[str, Any] = data["checks"]
    for name in checks.split(","):
        assert found[name]["status"] == "pass", (name, found[name])
        assert found[name]["ranks"] == list(range(world)), (name, found[name])
    imported = found["import"]["per_rank"]
    assert {imported[r]["torch"] for r in imported} == {"2.13.0+cpu"}
    ddp = found["ddp"]["per_rank"]
    assert ddp["0"]["losses"][-1] < ddp["0"]["losses"][0] and ddp["1"]["param_spread"] == 0.0
    return found


def activated(prefix: Path, env: dict[str, str], init: str, activate: str = "") -> list[str]:
    """In a new bash with the site's module system and no module loaded: source the env's activate, then what
    its python is and imports (sys.prefix, torch, LOADEDMODULES), then deactivate."""
    script = (
        f". {init}\n. '{prefix}/bin/activate'\n{activate}"
        "python -c 'import sys, torch; print(sys.prefix); print(torch.__version__)' || exit 3\n"
        'echo "$LOADEDMODULES"\ndeactivate\n'
    )
    res = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], env=env, capture_output=True,
                         text=True, timeout=180)  # fmt: skip
    assert "libpython" not in res.stderr, res.stderr
    return ok(res).stdout.split()


# --- TACC ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tacc:
    system: str
    recipe: str
    shipped_module: str
    twin_module: str

    @property
    def path(self) -> Path:
        return builtin_dir() / "tacc" / self.system / f"{self.recipe}.toml"


TACC = (
    Tacc("frontera", "frontera-venv-cu124", "python3/3.9.2", f"python3/{TWIN_PYTHON}"),
    Tacc("stampede3", "stampede3-venv-cu126", "python/3.9.18", f"python/{TWIN_PYTHON}"),
    Tacc("lonestar6", "lonestar6-venv-cu128", "python3/3.9.7", f"python3/{TWIN_PYTHON}"),
)


class World(UserWorld):
    """A user of an emulated site: the site's module trees (the twin's first), its software under ``soft``, the
    machine's CPU torch from the loopback index, uv's cache shared by the session's torch envs."""

    def __init__(self, root: Path, mirror: str, soft: Path, uv_cache: Path, **extra: str) -> None:
        super().__init__(
            root,
            mirror,
            MODULEPATH=MODULEPATH,
            ENVBUILDER_TEST_SOFT=str(soft),
            UV_CACHE_DIR=str(uv_cache),
            USER="tester",
            PROJECT="p01",
            WORK=str(root / "work"),
            **extra,
        )


@pytest.fixture(scope="module")
def soft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The twins' software tree (ENVBUILDER_TEST_SOFT)."""
    return tmp_path_factory.mktemp("twin-soft")


@pytest.fixture(scope="module")
def tacc_python(soft: Path, site_python: Callable[[str], Path]) -> Path:
    """The site-built CPython 3.11 behind the twin's python3/3.11.7 and python/3.11.7 modules."""
    home = soft / f"python-{TWIN_PYTHON}"
    home.symlink_to(site_python("3.11"))
    return home


def tacc_layer(world: UserWorld, site: Tacc) -> str:
    """The TACC recipe's layer: the twin's python module of the site's scheme, Python 3.11, the CPU torch."""
    layer = f"{site.recipe}-cpu-twin"
    body = f'[modules]\nload = ["{site.twin_module}"]\n[python]\nversion = "3.11"\n{TORCH_LAYER}'
    write_layer(world, site.path, layer, body, replace=("modules.load",))
    return layer


@pytest.fixture
def tacc_world(
    tmp_path: Path, torch_index: Any, torch_uv_cache: Path, soft: Path, tacc_python: Path
) -> World:
    """A TACC user's world, the site-built python 3.11 under the twin's python modules."""
    return World(tmp_path, mirror_env(torch_index), soft, torch_uv_cache)


@needs_lmod
@pytest.mark.parametrize("site", TACC, ids=lambda s: s.system)
def test_tacc_system_in_its_twin(tacc_world, site):
    """The shipped TACC recipe through its layer (torch and the python module only), created over the site-built
    python module, activated in a new shell, and validated through torchrun (TACC's launcher) with gloo."""
    world = tacc_world
    layer = tacc_layer(world, site)
    assert changed(world, site.recipe, layer) == {
        "modules.load": [site.twin_module],
        "python.version": "3.11",
        **TORCH_KEYS,
    }
    theirs, plan = same_site_plan(world, site.recipe, layer)
    assert theirs["modules"] == [site.shipped_module]
    assert plan["modules"] == plan["activate"]["from_build"] == [site.twin_module]
    assert plan["launcher"] == "torchrun"

    # One of the three has uv write all the bytecode as it installs (as on a node's many CPUs); the others as on
    # this machine's few (the validation's ranks compile what they import).
    compiled = site.system == "frontera" or host.usable_cpus() >= settings.COMPILE_MIN_CPUS
    data = world.data(
        "create", layer, **({"ENVBUILDER_COMPILE_BYTECODE": "1"} if site.system == "frontera" else {})
    )
    prefix = Path(data["env"]["prefix"])
    assert prefix == world.scratch / "envbuilder" / "envs" / layer
    assert data["env"]["modules"]["delta_set"]["LOADEDMODULES"] == site.twin_module
    assert f"bytecode at install: {'yes' if compiled else 'no'} (" in Path(data["log"]).read_text()
    site_packages = next(prefix.glob("lib/python3*/site-packages"))
    # A module neither `import torch` nor the checks load: compiled only where uv compiled everything.
    assert (
        bool(list((site_packages / "torch" / "utils" / "hipify").glob("__pycache__/hipify_python.*.pyc")))
        == compiled
    )
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    # A new shell: activation loads the module, without which the site-built python cannot start.
    assert activated(prefix, world.env, str(LMOD_INIT)) == [str(prefix), "2.13.0+cpu", site.twin_module]

    found = world.data("validate", layer, "--cpu", "--checks", IMPORT_DDP, "--launcher", "torchrun",
                       "--nproc-per-node", "2")  # fmt: skip
    assert found["launcher"] == "torchrun"
    checks = passed(found, IMPORT_DDP)
    assert checks["import"]["per_rank"]["0"]["python"].startswith("3.11.")
    assert checks["import"]["per_rank"]["0"]["file"].startswith(str(prefix))


@needs_lmod
@pytest.mark.slurm
def test_a_tacc_twin_validates_as_a_batch_job_submitted_from_a_shell_without_bash_module(
    tacc_world, slurm_cluster
):
    """Frontera's twin validated as a job of the real Slurm (``validate --submit``), submitted from a user's
    environment without bash's exported ``module`` function: a tcsh, zsh or fish login shell's (Lmod exports it
    from bash only), or a site's ``--export=NONE``. The job script, a bash that reads no profile, must source the
    module system's init before ``module load``: without the module the site-built python cannot start."""
    world = tacc_world
    layer = tacc_layer(world, TACC[0])
    world.data("create", layer, "--no-validate")
    env = {k: v for k, v in world.env.items() if not k.startswith("BASH_FUNC_")}
    res = run_cli("validate", layer, "--cpu", "--checks", IMPORT_DDP, "--nproc-per-node", "2", "--submit",
                  "--partition", slurm_cluster.partition, "--json", env={**env, **slurm_cluster.env})  # fmt: skip
    data = json.loads(res.stdout)["data"]
    runs = world.scratch / "envbuilder" / "envs" / layer / "envbuilder" / "validation"
    job = "".join(p.read_text() for p in runs.glob("run-*/job.sh"))
    said = "".join(p.read_text() for p in runs.glob("run-*/job.out"))
    assert res.returncode == 0, f"{res.stderr[-2000:]}\n{job}\n{said[-2000:]}"
    assert data["where"].isdigit()  # a job id: it ran as a job
    passed(data, IMPORT_DDP)
    init = f"{LMOD_INIT}"
    assert f"if ! type module >/dev/null 2>&1 && [ -f {init} ]; then set +u; . {init}; set -u; fi\n" in job
    assert job.index(init) < job.index(f"module load {TACC[0].twin_module}")
    # The user's own program's job script (envbuilder sbatch) is made the same way.
    res = run_cli("sbatch", layer, "--dry-run", "--partition", slurm_cluster.partition, "--json", "--",
                  "python", "train.py", env={**env, **slurm_cluster.env})  # fmt: skip
    script = json.loads(ok(res).stdout)["data"]["script"]
    assert script.index(init) < script.index(f"module load {TACC[0].twin_module}")


@needs_lmod
@pytest.mark.slurm
def test_a_tacc_twin_job_of_python_train_py_runs_the_envs_python(tacc_world, slurm_cluster):
    """``envbuilder sbatch ENV -- python train.py`` (the help's own example) as a job of the real Slurm: the
    ``python`` it starts is the env's, as in ``envbuilder run``, not the python module's (the site's python,
    first on PATH once the module is loaded, has no torch)."""
    world = tacc_world
    layer = tacc_layer(world, TACC[0])
    prefix = Path(world.data("create", layer, "--no-validate")["env"]["prefix"])
    train = world.root / "train.py"
    train.write_text("import os, sys, torch\nprint(os.environ['RANK'], sys.prefix, torch.__version__)\n")
    env = {**world.env, **slurm_cluster.env}
    res = run_cli("sbatch", layer, "--partition", slurm_cluster.partition, "--output", str(world.root), "--json",
                  "--", "python", str(train), env=env)  # fmt: skip
    data = json.loads(ok(res).stdout)["data"]
    deadline = time.monotonic() + 240
    while job_record(data["job"], env).get("JobState") not in ENDED:
        assert time.monotonic() < deadline, slurm_cluster.log_tails()
        time.sleep(0.5)
    said = Path(data["output"]).read_text()
    assert f"0 {prefix} 2.13.0+cpu" in said.splitlines(), said[-3000:]


# --- Zurada and Polaris: conda ---------------------------------------------------------------------------------


@pytest.fixture
def conda_world(tmp_path: Path, conda_channel: Path, conda_wheels: Any, conda_uv_cache: Path) -> CondaWorld:
    """A user of a conda site: conda-forge as the local channel (its python wraps this machine's CPython 3.11),
    the CPU torch from the wheel index; uv's cache shared by the module's conda envs (torch unpacked once)."""
    return CondaWorld(tmp_path, conda_channel, conda_wheels, conda_uv_cache)


@needs_lmod
@pytest.mark.slurm
def test_zurada_in_its_twin(conda_world, slurm_cluster):
    """zurada-conda-cu126 through its layer (torch, the conda python, the prefix off the real /work), over
    Zurada's miniforge3 module (no conda binary there: envbuilder's embedded engine builds), activated in a new
    shell, and validated inside a job step of the real Slurm as the site's page runs it: an ``srun`` step with
    one task and the node's CPUs (the shape of Zurada's interactive step, with the twin's partition and core
    count), inside which envbuilder's srun launcher starts torchrun as a step that overlaps it."""
    world = conda_world
    shipped = builtin_dir() / "zurada" / "zurada-conda-cu126.toml"
    layer = "zurada-conda-cu126-cpu-twin"
    write_layer(world, shipped, layer, f'[env]\nprefix = "${{SCRATCH}}/envs/{{name}}"\n[python]\nversion = "{PY}"\n'
                + TORCH_LAYER)  # fmt: skip
    assert changed(world, "zurada-conda-cu126", layer) == {
        "env.prefix": "${SCRATCH}/envs/{name}",
        "python.version": PY,
        **TORCH_KEYS,
    }
    theirs, plan = same_site_plan(world, "zurada-conda-cu126", layer)
    assert plan["modules"] == theirs["modules"] == ["miniforge3/25.3.1-gcc-11.4.1"]
    assert plan["activate"]["modules"] == theirs["activate"]["modules"]
    assert plan["launcher"] == "srun"

    data = world.data("create", layer, USER="tester")
    prefix = Path(data["env"]["prefix"])
    assert prefix == world.scratch / "envs" / layer
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    assert activated(prefix, world.env, str(LMOD_INIT)) == [str(prefix), "2.13.0+cpu", plan["modules"][0]]

    argv = cli_argv("validate", layer, "--cpu", "--checks", IMPORT_DDP, "--json")
    step = ["srun", "--nodes=1", "--ntasks-per-node=1", f"--cpus-per-task={slurm_cluster.cpus}", *argv]
    res = subprocess.run(step, env=cli_env({**world.env, **slurm_cluster.env, "USER": "tester"}),
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    found = json.loads(res.stdout)["data"]
    assert found["launcher"] == "srun"
    command = found["command"]
    assert command[0] == "srun" and "--overlap" in command, command
    assert command[command.index("--cpus-per-task") + 1] == str(slurm_cluster.cpus)
    checks = passed(found, IMPORT_DDP)
    assert checks["import"]["per_rank"]["0"]["file"].startswith(str(prefix))


#: Cray PALS's mpiexec as Polaris has it, stood in for over MPICH's hydra.
ALCF_SHIMS = REPO / "tests" / "shims" / "alcf"


@pytest.fixture(scope="module")
def polaris_conda_module(tmp_path_factory, conda_channel, conda_wheels, conda_uv_cache) -> tuple[Path, Path]:
    """ALCF's conda module: a site conda env with torch and MPI (mpi4py over MPICH, as ALCF's carries mpi4py
    over Cray MPICH; here MPICH from PyPI, without its launchers), built once for the module by the embedded engine, and a ``conda/2026-10-01`` module that
    puts it on PATH and defines the ``conda`` shell function whose ``conda activate base`` enters it: (the env,
    the module tree). The overlay only reads it."""
    root = tmp_path_factory.mktemp("polaris-site")
    world = CondaWorld(root / "w", conda_channel, conda_wheels, conda_uv_cache)
    world.recipe(name="site-conda", conda=())
    text = (world.recipes / "site-conda.toml").read_text()
    text = text.replace("install = false", TORCH_LAYER.split("\n", 1)[1].strip())
    text = text.replace(
        'name = "condademo"\nspec = "condademo==1.0"', 'name = "mpi4py"\n[[packages]]\nname = "mpich"'
    )
    (world.recipes / "site-conda.toml").write_text(text)
    site_env = root / "soft" / "datascience" / "conda" / "2026-10-01"
    ok(world.cli("create", "site-conda", "--prefix", str(site_env), "--no-validate"))
    # ALCF's env holds no MPI launcher (its mpi4py is over Cray MPICH, started by PALS's mpiexec, outside the
    # env): MPICH's mpiexec and mpirun go, its hydra (mpiexec.hydra) stays for the PALS stand-in.
    for launcher in ("mpiexec", "mpirun"):
        (site_env / "bin" / launcher).unlink()
    modules = root / "modulefiles"
    module = conda_function_module(modules / "conda" / "2026-10-01.lua", site_env)
    # The MPI library on LD_LIBRARY_PATH, as Polaris's Cray PE modules put Cray MPICH's (a real conda python's
    # mpi4py would also find it under its base prefix; the test channel's python wraps this machine's).
    with module.open("a") as f:
        f.write(f'prepend_path("LD_LIBRARY_PATH", {json.dumps(str(site_env / "lib"))})\n')
    return site_env, modules


@needs_lmod
@pytest.mark.mpi
def test_polaris_in_its_twin(conda_world, polaris_conda_module):
    """polaris-overlay-conda as shipped but for ``[modules] use`` (the fixture module tree for /soft/modulefiles):
    a venv over the conda module's base env, which holds the site's torch and MPI, activated in a new shell (the
    module loaded, ``conda activate base`` run), and validated through the site's mpiexec (PALS's argv) with
    import, gloo DDP and MPI over 2 ranks."""
    world = conda_world
    site_env, modules = polaris_conda_module
    shipped = builtin_dir() / "alcf" / "polaris" / "polaris-overlay-conda.toml"
    layer = "polaris-overlay-conda-twin"
    write_layer(world, shipped, layer, f'[modules]\nuse = ["{modules}"]\n', replace=("modules.use",))
    assert changed(world, "polaris-overlay-conda", layer) == {"modules.use": [str(modules)]}
    theirs, plan = same_site_plan(world, "polaris-overlay-conda", layer)
    assert plan["modules"] == theirs["modules"] == ["conda/2026-10-01"]
    assert plan["activate"]["conda_env"] == "base"
    assert plan["launcher"] == "mpiexec"

    data = world.data("create", layer, PROJECT="p")
    prefix = Path(data["env"]["prefix"])
    assert prefix == world.root / "home" / "envbuilder" / "envs" / layer
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    sys_prefix, torch, loaded = activated(prefix, world.env, str(LMOD_INIT))
    assert (sys_prefix, torch, loaded) == (str(prefix), "2.13.0+cpu", "conda/2026-10-01")

    checks = IMPORT_DDP + ",mpi"
    path = f"{ALCF_SHIMS}:{world.env['PATH']}"
    found = world.data("validate", layer, "--cpu", "--checks", checks, "--nproc-per-node", "2", PATH=path,
                       PROJECT="p")  # fmt: skip
    assert found["launcher"] == "mpiexec"
    assert found["command"][:8] == ["mpiexec", "-n", "2", "--ppn", "2", "--depth", "8", "--cpu-bind"], found
    found_checks = passed(found, checks)
    assert found_checks["import"]["per_rank"]["0"]["file"].startswith(str(site_env))  # the site's torch
    assert found_checks["mpi"]["per_rank"]["0"]["library"].startswith("MPICH")


# --- Cirrus --------------------------------------------------------------------------------------------------------

CIRRUS = "cirrus-venv-cu121-horovod"
CIRRUS_MODULE = f"python/{TWIN_PYTHON}-gpu"


@pytest.fixture(scope="module")
def cirrus_mirror(tmp_path_factory, torch_index, torch_files) -> Iterator[str]:
    """download.pytorch.org's whl/cpu as the session's torch index (uv's cache holds its torch already), and PyPI
    with torch's dependencies, MPI (mpi4py, MPICH), stand-ins of Cirrus's other packages with the shipped pins
    and the stand-in Horovod source package."""
    pypi = tmp_path_factory.mktemp("cirrus-pypi")
    for f in torch_files.iterdir():
        os.link(f, pypi / f.name)
    for name, version in CIRRUS_EXTRAS.items():
        build_wheel(pypi, name, version, {f"{name.replace('-', '_')}/__init__.py": ""})
    horovod_sdist(pypi)
    with serve_files(pypi) as served:
        yield f"https://download.pytorch.org/whl/={torch_index.url}/whl/ pypi={served.url}/simple/"


def cirrus_python(soft: Path) -> None:
    """Cirrus's Miniconda python for the twin's python/3.11.7-gpu module: this machine's CPython 3.11 (whose
    libraries its own RUNPATH finds, as Miniconda's do) as python, python3 and python3.11."""
    real = Path(sys.base_prefix) / "bin" / "python3.11"
    if not real.is_file():
        pytest.skip(f"no CPython 3.11 at {real} for {CIRRUS_MODULE}")
    home = soft / f"miniconda3-{TWIN_PYTHON}" / "bin"
    home.mkdir(parents=True)
    for name in ("python3", "python", "python3.11"):
        (home / name).symlink_to(real)


def cirrus_layer(world: UserWorld) -> str:
    """The shipped Cirrus recipe with the twin's python module (loaded and activated), the prefix under the
    user's $WORK (the shipped one is this machine's real /work), Horovod from the index (the shipped spec is a
    commit on GitHub; every build setting is the shipped one, copied from the shipped file), and mpi4py and MPICH
    for the MPI that Cirrus's python module brings."""
    shipped = builtin_dir() / "epcc" / "cirrus" / f"{CIRRUS}.toml"
    horovod = next(p for p in loads(shipped.read_text())["packages"] if p["name"] == "horovod")
    horovod = {**horovod, "spec": f"horovod=={HOROVOD}"}
    body = (
        f'[modules]\nload = ["{CIRRUS_MODULE}"]\n[activate]\nmodules = ["{CIRRUS_MODULE}"]\n'
        f'[python]\nversion = "3.11"\n{TORCH_LAYER}'
        '[filesystems.work]\npath = "${WORK}"\n[env]\nprefix = "${WORK}/envbuilder/envs/{name}"\n'
        "[[packages]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in horovod.items()) +
        '[[packages]]\nname = "mpi4py"\n[[packages]]\nname = "mpich"\n'
    )  # fmt: skip
    layer = f"{CIRRUS}-cpu-twin"
    write_layer(world, shipped, layer, body, replace=("modules.load", "activate.modules"))
    return layer


@needs_lmod
@pytest.mark.mpi
def test_cirrus_in_its_twin(tmp_path, cirrus_mirror, torch_uv_cache, soft, envmodules_init):
    """cirrus-venv-cu121-horovod through its layer, on Tcl Environment Modules: Horovod built with the shipped
    build settings (the module's NVHPC, cmake loaded for the build only), activated in a new shell (the activate
    extension loads the python module and sets the Horovod profile), and validated through mpirun (Cirrus's
    launcher, Open MPI's argv, run by MPICH's hydra here) with import, gloo DDP and MPI over 2 ranks."""
    cirrus_python(soft)
    # Cirrus runs Tcl Environment Modules: the private copy, found as a login shell finds it. The user's own
    # LIBRARY_PATH comes after the stubs directory in Horovod's build.
    world = World(tmp_path, cirrus_mirror, soft, torch_uv_cache, MODULESHOME=str(envmodules_init.parent),
                  LIBRARY_PATH="/opt/user/lib")  # fmt: skip
    layer = cirrus_layer(world)
    diff = changed(world, CIRRUS, layer)
    mpi = {k: diff.pop(k) for k in list(diff) if k.startswith(("packages[mpi4py]", "packages[mpich]"))}
    assert mpi["packages[mpi4py].name"] == "mpi4py" and mpi["packages[mpich].name"] == "mpich"
    assert diff == {
        "modules.load": [CIRRUS_MODULE],
        "activate.modules": [CIRRUS_MODULE],
        "python.version": "3.11",
        **TORCH_KEYS,
        "filesystems.work.path": "${WORK}",
        "env.prefix": "${WORK}/envbuilder/envs/{name}",
        "packages[horovod].spec": f"horovod=={HOROVOD}",
    }
    theirs, plan = same_site_plan(world, CIRRUS, layer)
    assert plan["module_system"] == "environment-modules"
    assert plan["build_modules"] == theirs["build_modules"] == ["cmake/3.25.2"]
    assert plan["launcher"] == "mpirun"

    data = world.data("create", layer)
    prefix = Path(data["env"]["prefix"])
    assert prefix == world.root / "work" / "envbuilder" / "envs" / layer
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    built = json.loads(
        (prefix / "lib" / "python3.11" / "site-packages" / "horovod" / "build_env.json").read_text()
    )
    assert (built["CMAKE_VERSION"], built["CC"]) == ("3.25.2", "mpicc")
    profile = 'echo "$HOROVOD_MPI$HOROVOD_MPI_THREADS_DISABLE"\n'
    said = activated(prefix, world.env, str(envmodules_init / "bash"), profile)
    assert said == ["11", str(prefix), "2.13.0+cpu", CIRRUS_MODULE]

    checks = IMPORT_DDP + ",mpi"
    found = world.data("validate", layer, "--cpu", "--checks", checks, "--nproc-per-node", "2")
    assert found["launcher"] == "mpirun"
    assert found["command"][:7] == ["mpirun", "-n", "2", "--map-by", "ppr:2:node", "--bind-to", "none"]
    found_checks = passed(found, checks)
    assert found_checks["import"]["per_rank"]["0"]["file"].startswith(str(prefix))
    assert found_checks["mpi"]["per_rank"]["0"]["library"].startswith("MPICH")
