"""Vista's recipes created and validated on an aarch64 node: the arm64 Debian root of tests/armtwin.py, run by
qemu-user-static, where envbuilder itself runs on the node's arm64 python3 (so ``platform.machine()`` is
aarch64 and create builds, as on a GH200 node, rather than refusing as on this x86_64 machine).

The node's software: Vista's module names from the fixture tree (tests/data/modules/site), run by the root's
own Lmod, its python3/3.11.8 module putting the root's arm64 CPython 3.11 on PATH; the GH200's facts from
tests/data/facts/gh200-aarch64.json (its GPU, driver, glibc), given with ``--facts``.

The torch: PyPI's real aarch64 torch 2.10.0, which is a CPU build (``2.10.0+cpu``, no CUDA), with its real
torchvision and torchaudio, served from a loopback index as download.pytorch.org's ``whl/cpu`` (whose aarch64
files carry no local label, as PyPI's). No CUDA torch can run here and none is pretended: the recipe is
created through a layer that changes ONLY ``[torch] variant`` to ``cpu``, so the plan asks for the build that
is installed and the torch build guard checks the real one. Everything else (modules, python, prefix, the
site's arch and scheduler) is the shipped recipe's; a test below checks that the as-shipped plan on this node
differs from the layer's in the torch variant only. With the GH200's facts the smoke check of create expects a
GPU and says this torch is a CPU build (create exits 8, the env in place); the CPU validation follows.

vista-venv-mpi-cu126 builds mpi4py from source (no_binary) with the node's Open MPI, under Vista's module
names (node-local modulefiles: the fixture tree's point at /opt/fake), whose openmpi/5.0.5 provides the libmpi (the
node's, hidden from the linker's default path), unoptimised (CFLAGS=-O0): about 3 minutes under qemu, in every
run (a no_binary package is never taken from uv's cache). uv's cache is kept per machine for the rest; the
indexes are the cached files as a wheelhouse (so that cache keys them by a path that does not change between runs).

Times on this 2-core machine, shared: the plan test ~3 s; create ~35 s and validate (torchrun, 2 ranks) ~45 s;
the MPI env ~4-6 min (mpi4py's build). The root file system and the wheels (tests/armtwin.py, run by .ci/run)
take ~4 minutes once per machine."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import armtwin
import pytest
from helpers import FACTS, UserWorld
from torchindex import TorchIndex, serve, torch_mirror

pytestmark = [pytest.mark.integration, pytest.mark.rootfs, pytest.mark.aarch64]

#: The node's python for the python3/3.11.8 module: the root's arm64 CPython 3.11.
NODE_PYTHON = "/usr/bin/python3.11"
SHIPPED = f"{armtwin.SRC}/recipes/tacc/vista/vista-venv-cu124.toml"
LAYER = "vista-venv-cu124-cpu-twin"
GH200 = f"{armtwin.SRC}/tests/data/facts/{(FACTS / 'gh200-aarch64.json').name}"


@pytest.fixture(scope="module")
def node() -> None:
    why = armtwin.missing()
    if why:
        pytest.skip(f"no aarch64 node: {why}")


@pytest.fixture(scope="module")
def arm_mirror(node: None) -> Iterator[str]:
    """download.pytorch.org's whl/cpu with PyPI's aarch64 torch family and their dependencies (the real root
    carries those too: an install from it alone must resolve), and PyPI with the dependencies."""
    index = TorchIndex()
    for wheel in sorted(armtwin.WHEELS.glob("*.whl")):
        index.add("whl/cpu", wheel)
        if wheel.name.split("-", 1)[0] not in armtwin.TORCH:
            index.add("simple", wheel)
    with serve(index) as served:
        yield torch_mirror(served)


class Node(UserWorld):
    """A user of the aarch64 node: the world's directories (under ``root``, bound in at their own paths), the
    fixture module tree from the checkout, and the CLI run there by the node's python."""

    def __init__(self, root: Path, mirror: str) -> None:
        soft = root / "soft" / "python-3.11.8" / "bin"
        soft.mkdir(parents=True)
        for name in ("python3", "python", "python3.11"):
            (soft / name).symlink_to(NODE_PYTHON)  # resolved inside the node
        super().__init__(
            root,
            mirror,
            PATH="/usr/local/bin:/usr/bin:/bin",
            MODULEPATH=f"{armtwin.SRC}/tests/data/modules/site",
            ENVBUILDER_TEST_SOFT=str(root / "soft"),
            PYTHONPATH=armtwin.SRC,
            USER="tester",
            WORK=str(root / "work"),
        )
        self.timings: dict[str, float] = {}
        #: What the node sees at its own path besides the world: the world's root, and what a test adds.
        self.binds = [root]
        #: The node's libraries a test hides from the linker's default path (armtwin.enter).
        self.hide: list[str] = []

    def on_node(self, *args: str, timeout: float = 1500) -> tuple[int, dict[str, Any]]:
        """``envbuilder ARGS --json`` on the node: its exit code and envelope (the time it took in ``timings``)."""
        started = time.monotonic()
        argv = [f"{armtwin.DEPS}/bin/python", "-m", "envbuilder", *args, "--json"]
        res = armtwin.enter(argv, self.env, self.binds, timeout=timeout, hide=self.hide)
        self.timings[args[0]] = round(time.monotonic() - started, 1)
        try:
            envelope: dict[str, Any] = json.loads(res.stdout)
        except ValueError:
            raise AssertionError(
                f"{args}: exit {res.returncode}, no JSON\n{res.stdout}\n{res.stderr}"
            ) from None
        return res.returncode, envelope

    def ok(self, *args: str) -> Any:
        """The ``data`` of a successful ``envbuilder ARGS --json`` on the node."""
        code, envelope = self.on_node(*args)
        assert code == 0, json.dumps(envelope, indent=1)[-6000:]
        return envelope["data"]


@pytest.fixture
def arm_node(tmp_path: Path, arm_mirror: str) -> Node:
    world = Node(tmp_path, arm_mirror)
    world.write_recipe(
        LAYER,
        f'schema_version = 1\nextends = "{SHIPPED}"\n[recipe]\nname = "{LAYER}"\n'
        '[torch]\nvariant = "cpu"  # PyPI\'s aarch64 torch: no CUDA build can run on this node\n',
    )
    return world


def test_vista_plan_on_the_node_differs_from_the_shipped_one_in_the_torch_variant_only(arm_node):
    # From the shipped table (--offline): the twin's index holds no cu126 files, only the CPU ones it can run.
    shipped = arm_node.ok("plan", "vista-venv-cu124", "--facts", GH200, "--offline")
    layer = arm_node.ok("plan", LAYER, "--facts", GH200)
    ours, theirs = layer["torch"], shipped["torch"]
    assert (theirs["variant"], theirs["cuda"], theirs["index_url"]) == (
        "cu126",
        "12.6",
        "https://download.pytorch.org/whl/cu126",
    )
    assert (ours["variant"], ours["cuda"], ours["index_url"]) == (
        "cpu",
        None,
        "https://download.pytorch.org/whl/cpu",
    )
    assert (
        ours["requirements"]
        == theirs["requirements"]
        == [
            "torch==2.10.0",
            "torchvision==0.25.0",
            "torchaudio==2.10.0",
        ]
    )
    # The plan says the build is not the GPU one the GH200 facts call for.
    assert "the target has 1 GPU(s) (NVIDIA GH200 480GB) but the CPU wheel was chosen" in ours["warnings"]
    for key in ("modules", "python", "kind"):
        assert layer[key] == shipped[key], key


def test_vista_venv_is_created_and_validated_on_an_aarch64_node(arm_node):
    """Created on the node with the GH200's facts: the build is the node's own (its python, PyPI's aarch64
    torch), and its smoke check says plainly that this torch cannot use the GPU the facts describe (create exits
    8, the env in place). Then validated as a CPU run: import and gloo DDP over two ranks through torchrun."""
    code, envelope = arm_node.on_node("create", LAYER, "--facts", GH200)
    assert code == 8, json.dumps(envelope, indent=1)[-6000:]
    env = envelope["data"]["env"]
    prefix = Path(env["prefix"])
    assert prefix == arm_node.scratch / "envbuilder" / "envs" / LAYER
    assert env["modules"]["delta_set"]["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8"
    versions = {p["name"]: p["version"] for p in env["packages"] if p["in_env"]}
    assert (versions["torch"], versions["torchvision"], versions["torchaudio"]) == (
        "2.10.0",
        "0.25.0",
        "2.10.0",
    )
    # The validation that follows the build (issue 36: it replaces the smoke check where it runs here) or, where it
    # cannot run here, the smoke check: either way the create's record holds what the import found.
    smoke = env["validation"]["checks"]
    assert smoke["import"]["status"] == "pass", smoke["import"]
    found = smoke["import"] if "torch" in smoke["import"] else smoke["import"]["per_rank"]["0"]
    assert (found["torch"], found["cuda"]) == ("2.10.0+cpu", None)
    assert found["python"].startswith("3.11.")  # the node's python3.11, through the module
    assert smoke["gpu"]["status"] == "fail"
    assert "this torch (2.10.0+cpu) is a CPU build" in smoke["gpu"]["cause"]
    # The env's python is the module's, which is the node's arm64 CPython (ELF machine 183: EM_AARCH64).
    assert f"home = {arm_node.root}/soft/python-3.11.8/bin\n" in (prefix / "pyvenv.cfg").read_text()
    header = (armtwin.ROOT / NODE_PYTHON.lstrip("/")).read_bytes()[:20]
    assert int.from_bytes(header[18:20], "little") == 183

    found = arm_node.ok(
        "validate",
        LAYER,
        "--cpu",
        "--checks",
        "import,ddp",
        "--launcher",
        "torchrun",
        "--nproc-per-node",
        "2",
    )
    print("timings on the node (s):", arm_node.timings)
    assert (found["device"], found["world"]) == ("cpu", 2)
    checks = found["checks"]
    for rank in ("0", "1"):
        imported = checks["import"]["per_rank"][rank]
        assert (imported["torch"], imported["cuda"]) == ("2.10.0+cpu", None)
    assert checks["ddp"]["status"] == "pass" and checks["ddp"]["ranks"] == [0, 1], checks["ddp"]
    losses = checks["ddp"]["per_rank"]["0"]["losses"]
    assert losses[-1] < losses[0] and checks["ddp"]["per_rank"]["1"]["param_spread"] == 0.0


MPI_LAYER = "vista-venv-mpi-cu126-cpu-twin"
#: Vista's MPI module names on the node, for the root's own Open MPI (Debian's 4.1, under Vista's 5.0.5 name: the
#: fixture tree's modules point at /opt/fake) and its python. As a site's MPI module, openmpi/5.0.5 provides the
#: libmpi: the node's is hidden from the linker's default path (armtwin.enter) and a copy of it lies in the
#: module's lib under ENVBUILDER_TEST_SOFT, found only through the module's LD_LIBRARY_PATH (and LIBRARY_PATH,
#: where mpicc's link finds it). The twin runs as root, which Open MPI refuses unless told.
NODE_MODULES = {
    "openmpi/5.0.5.lua": 'conflict("mvapich2")\nsetenv("MPI_FLAVOR", "openmpi")\nsetenv("MPICC", "/usr/bin/mpicc")\n'
    'local lib = pathJoin(os.getenv("ENVBUILDER_TEST_SOFT"), "openmpi-5.0.5/lib")\n'
    'prepend_path("LD_LIBRARY_PATH", lib)\nprepend_path("LIBRARY_PATH", lib)\n'
    'setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")\nsetenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")\n',
    "python3_mpi/3.11.8.lua": 'prereq("gcc", "openmpi")\nsetenv("TACC_PYTHON_VER", "3.11.8")\n'
    'prepend_path("PATH", pathJoin(os.getenv("ENVBUILDER_TEST_SOFT"), "python-3.11.8/bin"))\n',
}


@pytest.fixture(scope="module")
def mpi_mirror(node: None) -> str:
    """download.pytorch.org and PyPI as a wheelhouse: the cached files, seen in the node at /wheels. uv's cache,
    kept per machine for mpi4py's build, keys what it holds by where it came from: a local path is the same on
    every run, where a loopback index's address changes (and torch would be cached once more each run)."""
    return "https://download.pytorch.org/whl/=/wheels pypi=/wheels"


def test_vista_mpi_venv_builds_mpi4py_against_the_nodes_mpi_and_validates(tmp_path, mpi_mirror):
    """vista-venv-mpi-cu126 on the node: mpi4py built from source (no_binary) with the node's mpicc under Vista's
    module names, against the libmpi that only the openmpi/5.0.5 module provides, then mpi4py's send/recv and
    allreduce through the node's mpirun, and gloo DDP, over two ranks; without the module the env's python cannot
    import mpi4py (the loader finds no libmpi)."""
    world = Node(tmp_path, mpi_mirror)
    modules = tmp_path / "node-modules"
    for rel, text in NODE_MODULES.items():
        (modules / rel).parent.mkdir(parents=True, exist_ok=True)
        (modules / rel).write_text(text)
    world.env["MODULEPATH"] = f"{modules}:{world.env['MODULEPATH']}"
    # The module's libmpi: the node's, moved out of the linker's default path into the module's lib.
    node_lib = armtwin.ROOT / armtwin.LIBDIR.lstrip("/")
    world.hide = sorted(p.name for p in node_lib.glob("libmpi.so.40*"))
    module_lib = tmp_path / "soft" / "openmpi-5.0.5" / "lib"
    module_lib.mkdir(parents=True)
    shutil.copy2(node_lib / "libmpi.so.40", module_lib / "libmpi.so.40")
    (module_lib / "libmpi.so").symlink_to("libmpi.so.40")
    # mpi4py's build under qemu takes minutes (no_binary: built again in every create); uv's cache, kept per
    # machine as a site's would be, holds the rest, and its C compiles unoptimised (-O2 under emulation would take
    # most of an hour; what it links against is the same).
    world.env["CFLAGS"] = "-O0 -g0"
    armtwin.UV_CACHE.mkdir(exist_ok=True)
    world.env["UV_CACHE_DIR"] = str(armtwin.UV_CACHE)
    world.binds.append(armtwin.UV_CACHE)
    world.write_recipe(
        MPI_LAYER,
        f'schema_version = 1\nextends = "{armtwin.SRC}/recipes/tacc/vista/vista-venv-mpi-cu126.toml"\n'
        f'[recipe]\nname = "{MPI_LAYER}"\n[torch]\nvariant = "cpu"\n',
    )
    code, envelope = world.on_node("create", MPI_LAYER, "--facts", GH200, timeout=3000)
    assert code == 8, json.dumps(envelope, indent=1)[-6000:]  # the GPU check, as above
    env = envelope["data"]["env"]
    assert env["modules"]["delta_set"]["LOADEDMODULES"] == "gcc/13.2.0:openmpi/5.0.5:python3_mpi/3.11.8"
    versions = {p["name"]: p["version"] for p in env["packages"] if p["in_env"]}
    assert (versions["torch"], versions["mpi4py"]) == ("2.10.0", "4.1.2")
    # mpi4py's extension links to the module's libmpi, which the node's python finds only through the module.
    prefix = env["prefix"]
    probe = (
        f'ldd {prefix}/lib/python3.11/site-packages/mpi4py/MPI.*.so | grep libmpi.so; echo "--"; '
        f"LD_LIBRARY_PATH={module_lib} ldd {prefix}/lib/python3.11/site-packages/mpi4py/MPI.*.so | grep libmpi.so; "
        f'echo "--"; {prefix}/bin/python -c "from mpi4py import MPI"'
    )
    res = armtwin.enter(
        ["/bin/sh", "-c", probe], {"PATH": "/usr/bin:/bin"}, world.binds, timeout=300, hide=world.hide
    )
    bare, moduled, _ = res.stdout.split("--\n")
    assert bare.split() == ["libmpi.so.40", "=>", "not", "found"], res.stdout
    assert moduled.split()[:3] == ["libmpi.so.40", "=>", str(module_lib / "libmpi.so.40")], res.stdout
    assert res.returncode != 0 and "libmpi.so.40: cannot open shared object file" in res.stderr, res.stderr

    found = world.ok(
        "validate", MPI_LAYER, "--cpu", "--checks", "import,mpi,ddp", "--launcher", "mpirun",
        "--nodes", "1", "--nproc-per-node", "2",
    )  # fmt: skip
    print("timings on the node (s):", world.timings)
    assert (found["device"], found["world"]) == ("cpu", 2)
    checks = found["checks"]
    assert checks["mpi"]["status"] == "pass" and checks["mpi"]["ranks"] == [0, 1], checks["mpi"]
    assert checks["ddp"]["status"] == "pass" and checks["ddp"]["ranks"] == [0, 1], checks["ddp"]
