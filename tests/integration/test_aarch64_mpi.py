"""Vista's MPI recipe (vista-venv-mpi-cu126) created and validated on the aarch64 node of tests/armtwin.py (the
node and its user: tests/armnode.py; the torch layer as in test_aarch64_node.py: only ``[torch] variant`` set to
``cpu``). A file of its own so that this build and the plain Vista venv's run on two workers at once.

mpi4py is built from source (no_binary) with the node's Open MPI, under Vista's module names (node-local
modulefiles: the fixture tree's point at /opt/fake), whose openmpi/5.0.5 provides the libmpi (the node's, hidden from
the linker's default path), unoptimised (CFLAGS=-O0): about 3 minutes under qemu, in every run (a no_binary package
is never taken from uv's cache). uv's cache is kept per machine for the rest; the indexes are the cached files as a
wheelhouse (so that cache keys them by a path that does not change between runs). About 4-6 minutes on this 2-core
machine, shared."""

from __future__ import annotations

import json
import shutil

import armtwin
import pytest
from armnode import GH200, Node, require_node

pytestmark = [pytest.mark.integration, pytest.mark.rootfs, pytest.mark.aarch64]


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
def mpi_mirror() -> str:
    """download.pytorch.org and PyPI as a wheelhouse: the cached files, seen in the node at /wheels. uv's cache,
    kept per machine for mpi4py's build, keys what it holds by where it came from: a local path is the same on
    every run, where a loopback index's address changes (and torch would be cached once more each run)."""
    require_node()
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
