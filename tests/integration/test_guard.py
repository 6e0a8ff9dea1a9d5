"""The torch build guard for real: uv installs stand-in torch wheels from a local HTTP index, and create (or lock)
refuses a build that is not the planned one, with no env at the prefix and a previous env untouched.

A CUDA torch wheel cannot exist on this CPU machine: the wheels here are STAND-INS (tests/torchindex.py), each with
what the guard reads from a real torch (the dist-info version and its local label, ``torch/version.py`` with the
CUDA version, ``torch._C._cuda_getArchFlags()``) and nothing else. The planner runs offline
(ENVBUILDER_OFFLINE=1): it plans from the shipped table and never sees the index the install reads."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import FACTS, UserWorld, ok, refused, run_cli, user_env
from sharedfs import give_to, other_user
from torchindex import TorchIndex, build_torch_wheel
from torchindex import serve as serve_roots
from wheelindex import build_wheel, mirror_env, serve

pytestmark = pytest.mark.integration

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
PIN = "2.13.0"
#: The cu126 wheels' code list (sm_90 included) and one built without Hopper.
CU126_ARCH = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"
NO_HOPPER = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86"

RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "{kind}"
installer = "{installer}"
[python]
command = "{python}"
version = "{py}"
[torch]
version = "{pin}"
variant = "{variant}"
packages = ["torch"]
"""


def stand_in_torch(out: Path, version: str, cuda: Optional[str], arch_flags: str = "") -> Path:
    """A STAND-IN torch wheel (tests/torchindex.py): ``version`` with its local label, torch/version.py and,
    for CUDA builds, torch._C._cuda_getArchFlags()."""
    public, _, local = version.partition("+")
    return build_torch_wheel(out, public, local, cuda, arch_flags, tag="py3-none-any")


class World(UserWorld):
    """A user with a recipe directory, throwaway homes, and a local index whose torch files a test chooses."""

    def __init__(self, root: Path, index: Any, files: Path) -> None:
        super().__init__(root, mirror_env(index), ENVBUILDER_OFFLINE="1")
        self.index = index
        self.files = files
        self.envs = root / "envs"
        self.cpu_facts = self.facts("cpu", {"gpus": []})
        base = json.loads((FACTS / "h100.json").read_text())
        self.h100_facts = self.facts("h100", {**base, "gpus": base["gpus"][:1]})

    def facts(self, name: str, data: dict[str, Any]) -> Path:
        """Facts of a node like this one (its arch and Python: the env is really built here)."""
        path = self.root / f"{name}.json"
        path.write_text(json.dumps({"glibc": "2.36", **data, "arch": platform.machine(), "python": PY}))
        return path

    def serve_only(self, *wheels: Path) -> None:
        """The index now holds exactly these torch files."""
        for old in self.files.glob("torch-*.whl"):
            old.unlink()
        for w in wheels:
            shutil.copy2(w, self.files / w.name)

    def recipe(
        self, name: str, variant: str, kind: str = "venv", installer: str = "uv", python: str = sys.executable
    ) -> str:
        text = RECIPE.format(
            name=name, kind=kind, installer=installer, python=python, py=PY, pin=PIN, variant=variant
        )
        return self.write_recipe(name, text)

    def prefix(self, name: str) -> Path:
        return self.envs / name

    def create(self, name: str, facts: Path, *more: str) -> subprocess.CompletedProcess[str]:
        return self.cli(
            "create", name, "--prefix", str(self.prefix(name)), "--facts", str(facts), "--no-validate", *more
        )

    def leftovers(self, name: str) -> list[str]:
        return sorted(p.name for p in self.envs.glob(f".{name}.*")) if self.envs.exists() else []

    def installed(self, name: str) -> str:
        """The torch version in the env (its dist-info), read as files."""
        found = sorted(self.prefix(name).glob("lib/python*/site-packages/torch-*.dist-info"))
        return found[0].name[len("torch-") : -len(".dist-info")] if found else ""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("stand-in-torch")
    return {
        "cpu": stand_in_torch(d / "cpu", f"{PIN}+cpu", None),
        "cu126": stand_in_torch(d / "cu126", f"{PIN}+cu126", "12.6", CU126_ARCH),
        "cu126-no-hopper": stand_in_torch(d / "cu126-no-hopper", f"{PIN}+cu126", "12.6", NO_HOPPER),
        # PyPI's default build: no local label, a CUDA 13.0 build.
        "pypi": stand_in_torch(d / "pypi", PIN, "13.0", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"),
    }


@pytest.fixture
def world(tmp_path: Path) -> Any:
    files = tmp_path / "index-files"
    files.mkdir()
    with serve(files) as index:
        yield World(tmp_path, index, files)


# ---------------------------------------------------------------------------------------------------------------


def test_a_cpu_wheel_behind_a_cu126_recipe_is_refused(world, wheels):
    world.recipe("g126", "cu126")
    world.serve_only(wheels["cpu"])
    res = world.create("g126", world.cpu_facts)
    refused(res, 7, "torch build mismatch")
    first = res.stderr[res.stderr.index("torch build mismatch") :]
    assert "planned torch 2.13.0 cu126 (CUDA 12.6) from https://download.pytorch.org/whl/cu126" in first
    assert "the installer brought 2.13.0+cpu (no CUDA)" in first
    assert f"served by {world.index.url}/whl/cu126" in first
    assert "ENVBUILDER_INDEX_MIRROR" in res.stderr and "envbuilder plan g126" in res.stderr
    assert not world.prefix("g126").exists()
    assert world.leftovers("g126") == []
    assert not (world.home / "envs" / "g126.json").exists()
    # The build log says it too.
    logs = list((world.home / "logs").glob("g126-*.log"))
    assert len(logs) == 1 and "torch build mismatch" in logs[0].read_text()


def test_force_over_a_good_env_leaves_it_untouched(world, wheels):
    world.recipe("g126", "cu126")
    world.serve_only(wheels["cu126"])
    ok(world.create("g126", world.cpu_facts))
    assert world.installed("g126") == "2.13.0+cu126"
    record = (world.home / "envs" / "g126.json").read_bytes()
    inside = (world.prefix("g126") / "envbuilder" / "record.json").read_bytes()

    world.serve_only(wheels["cpu"])  # the mirror now holds only the CPU build
    res = world.create("g126", world.cpu_facts, "--force")
    refused(res, 7, "the installer brought 2.13.0+cpu (no CUDA)")
    assert world.installed("g126") == "2.13.0+cu126"
    assert (world.home / "envs" / "g126.json").read_bytes() == record
    assert (world.prefix("g126") / "envbuilder" / "record.json").read_bytes() == inside
    assert world.leftovers("g126") == []


def test_pypis_unlabeled_cuda_build_for_a_cpu_plan_is_refused(world, wheels):
    world.recipe("gcpu", "cpu")
    world.serve_only(wheels["pypi"])  # the mirror re-hosts PyPI's file: 2.13.0, no label, CUDA 13.0
    res = world.create("gcpu", world.cpu_facts)
    refused(res, 7, "torch build mismatch")
    assert "planned torch 2.13.0 cpu (no CUDA) from https://download.pytorch.org/whl/cpu" in res.stderr
    assert "the installer brought 2.13.0 (CUDA 13.0)" in res.stderr
    assert "built for CUDA 13.0, planned a CPU build (cpu)" in res.stderr
    assert not world.prefix("gcpu").exists()
    assert world.leftovers("gcpu") == []


def test_an_extra_index_in_the_mirror_never_puts_its_build_in_place(tmp_path, wheels):
    """The README's mirror form with a second target (``...whl/=MIRROR,EXTRA``): the install reads EXTRA as an
    extra index, which uv searches first, and EXTRA holds PyPI's unlabeled CUDA build. Either torch is pinned to
    its planned index (the +cpu build arrives) or the guard refuses; the wrong build is never put in place."""
    index = TorchIndex()
    index.add("whl/cpu", wheels["cpu"])
    index.add("pypi-like/cpu", wheels["pypi"])
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    name = "gcpu"
    (recipes / f"{name}.toml").write_text(
        RECIPE.format(
            name=name, kind="venv", installer="uv", python=sys.executable, py=PY, pin=PIN, variant="cpu"
        )
    )
    facts = tmp_path / "cpu.json"
    facts.write_text(json.dumps({"arch": platform.machine(), "glibc": "2.36", "python": PY, "gpus": []}))
    prefix = tmp_path / "envs" / name
    with serve_roots(index):
        mirror = f"https://download.pytorch.org/whl/={index.url}/whl/,{index.url}/pypi-like/"
        env = user_env(tmp_path, mirror, ENVBUILDER_RECIPE_PATH=str(recipes), ENVBUILDER_OFFLINE="1")
        res = run_cli(
            "create", name, "--prefix", str(prefix), "--facts", str(facts), "--no-validate", env=env
        )
    if res.returncode == 0:
        assert [p.name for p in prefix.glob("lib/python*/site-packages/torch-*.dist-info")] == [
            "torch-2.13.0+cpu.dist-info"
        ]
    else:
        refused(res, 7, "the installer brought 2.13.0 (CUDA 13.0)")
        assert f"{index.url}/pypi-like/cpu" in res.stderr  # among the indexes that may have served it
        assert not prefix.exists()


def test_the_planned_builds_pass(world, wheels):
    world.recipe("gcpu", "cpu")
    world.serve_only(wheels["cpu"])
    ok(world.create("gcpu", world.cpu_facts))
    assert world.installed("gcpu") == "2.13.0+cpu"

    # A GPU target: the guard also reads the compiled arch list through the env's python (sm_90 is in it).
    world.recipe("g126", "cu126")
    world.serve_only(wheels["cu126"])
    data = json.loads(ok(world.create("g126", world.h100_facts, "--json")).stdout)["data"]
    log = Path(data["log"]).read_text()
    line = next(x for x in log.splitlines() if x.startswith("torch build: "))
    assert line.startswith("torch build: 2.13.0+cu126 (CUDA 12.6, arch list ") and " sm_90" in line, line
    assert "is the planned torch 2.13.0 cu126 (CUDA 12.6)" in line
    assert "--arch-flags" in log and "could not read torch's arch list" not in log
    assert world.installed("g126") == "2.13.0+cu126"


def test_a_gpu_target_missing_from_the_arch_list_is_refused(world, wheels):
    world.recipe("g126", "cu126")
    world.serve_only(wheels["cu126-no-hopper"])
    res = world.create("g126", world.h100_facts)
    refused(res, 7, "torch build mismatch")
    assert "the installer brought 2.13.0+cu126 (CUDA 12.6, arch list " in res.stderr
    assert "no code for the target GPU's sm_90 (compute capability 9.0)" in res.stderr
    assert NO_HOPPER in res.stderr
    assert "the build is the planned variant but lacks the target's GPU code" in res.stderr
    assert not world.prefix("g126").exists()
    assert world.leftovers("g126") == []


def test_lock_refuses_a_wrong_label_and_writes_no_lock(world, wheels):
    world.recipe("g126", "cu126")
    world.serve_only(wheels["cpu"])
    path = world.home / "lockfiles" / "g126.lock.toml"
    res = world.cli("lock", "g126", "--platform", platform.machine(), "--facts", str(world.cpu_facts))
    refused(res, 13, "torch build mismatch in the lock")
    assert "planned torch 2.13.0 cu126 (CUDA 12.6)" in res.stderr
    assert f"the resolver picked torch-2.13.0+cpu-py3-none-any.whl from {world.index.url}/files" in res.stderr
    assert "local label +cpu, planned +cu126" in res.stderr
    assert not path.exists()

    world.serve_only(wheels["cu126"])
    ok(world.cli("lock", "g126", "--platform", platform.machine(), "--facts", str(world.cpu_facts)))
    assert path.is_file()


def test_restore_refuses_a_backup_whose_torch_is_not_its_plans(world, wheels):
    """An env built before the guard existed, with the CPU build where its plan says cu126 (the record is
    rewritten to say so): its backup restores nothing."""
    world.recipe("gcpu", "cpu")
    world.serve_only(wheels["cpu"])
    ok(world.create("gcpu", world.cpu_facts))
    ok(world.cli("backup", "gcpu"))
    good = world.envs / "good"
    ok(world.cli("restore", "gcpu", "--prefix", str(good), "--name", "good", "--no-validate"))
    assert world.installed("good") == "2.13.0+cpu"
    path = world.home / "envs" / "gcpu.json"
    record = json.loads(path.read_text())
    record["plan"]["torch"].update(
        variant="cu126", cuda="12.6", local="cu126", index_url="https://download.pytorch.org/whl/cu126"
    )
    path.write_text(json.dumps(record))
    made = json.loads(ok(world.cli("backup", "gcpu", "--json")).stdout)["data"]
    elsewhere = world.envs / "restored"
    res = world.cli("restore", "gcpu", "--prefix", str(elsewhere), "--name", "gcpu2", "--no-validate")
    refused(res, 7, "torch build mismatch: planned torch 2.13.0 cu126 (CUDA 12.6)")
    assert f"served by backup {made['id']}" in res.stderr
    assert not elsewhere.exists()
    assert world.leftovers("restored") == []


#: A user-prefix env runs the site python itself (pip --user refuses inside a venv); an overlay sits on it.
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


@pytest.mark.parametrize(
    ("kind", "installer"), [("user-prefix", "uv"), ("user-prefix", "pip"), ("overlay", "uv")]
)
def test_other_env_kinds_are_guarded_too(world, wheels, kind, installer):
    python = BASE_PYTHON if kind == "user-prefix" else sys.executable
    world.recipe("g126", "cu126", kind=kind, installer=installer, python=python)
    world.serve_only(wheels["cpu"])
    refused(world.create("g126", world.cpu_facts), 7, "the installer brought 2.13.0+cpu (no CUDA)")
    assert not world.prefix("g126").exists()
    assert world.leftovers("g126") == []
    # The right build passes, its arch list read through the env's python (for user-prefix: the site python
    # with the env as its user base).
    world.serve_only(wheels["cu126"])
    data = json.loads(ok(world.create("g126", world.h100_facts, "--json")).stdout)["data"]
    log = Path(data["log"]).read_text()
    line = next(x for x in log.splitlines() if x.startswith("torch build: "))
    assert line.startswith("torch build: 2.13.0+cu126 (CUDA 12.6, arch list ") and " sm_90" in line, line
    assert "is the planned" in line
    assert "--arch-flags" in log and "could not read torch's arch list" not in log
    assert world.installed("g126") == "2.13.0+cu126"


# ---------------------------------------------------------------------------------------------------------------
# The arch list is read once per wheel (issue 36): remembered in the home, keyed by the wheel's RECORD


def counted_torch(out: Path, arch_flags: str, reads: Path, library: Sequence[str] = ()) -> Path:
    """A STAND-IN cu126 torch wheel of version PIN+cu126 whose ``torch._C._cuda_getArchFlags()`` appends a line to
    ``reads`` each time it runs: the count of arch reads, seen from outside envbuilder. ``library``: the C strings
    of its ``torch/lib/libtorch_python.so`` (a real CUDA build's holds the arch list as one), between other bytes;
    none: the wheel has no such library."""
    full = f"{PIN}+cu126"
    modules = {
        "torch/__init__.py": "from torch import _C, cuda, version\n\n__version__ = version.__version__\n",
        "torch/cuda/__init__.py": "def is_available():\n    return False\n",
        "torch/version.py": f"__version__ = {full!r}\ncuda = '12.6'\n",
        "torch/_C.py": (
            "def _cuda_getArchFlags():\n"
            f"    with open({str(reads)!r}, 'a') as fh:\n"
            "        fh.write('read\\n')\n"
            f"    return {arch_flags!r}\n"
        ),
    }
    if library:
        strings = ["\x7fELF\x02\x01\x01", "sm_ is not a list", *library, "CUDA_ARCH_FLAGS", "sm_90a-ish"]
        modules["torch/lib/libtorch_python.so"] = "\x00".join(strings) + "\x00"
    return build_wheel(out, "torch", full, modules)


def arch_reads(reads: Path) -> int:
    return len(reads.read_text().splitlines()) if reads.exists() else 0


def guard_log(res: subprocess.CompletedProcess[str]) -> str:
    return Path(json.loads(ok(res).stdout)["data"]["log"]).read_text()


def cache_entries(world: World) -> list[Path]:
    return sorted((world.home / "cache" / "torch-builds").glob("*.json"))


def test_a_second_create_of_the_same_wheel_does_not_import_torch(world, tmp_path):
    reads = tmp_path / "arch-reads"
    good = counted_torch(tmp_path / "good", CU126_ARCH, reads)
    world.serve_only(good)
    world.recipe("first", "cu126")
    log = guard_log(world.create("first", world.h100_facts, "--json"))
    assert arch_reads(reads) == 1 and "--arch-flags" in log
    [entry] = cache_entries(world)
    assert json.loads(entry.read_text())["arch_flags"] == CU126_ARCH.split()
    assert entry.stat().st_mode & 0o022 == 0

    # Another env of the same wheel (another prefix: its RECORD's script rows differ): remembered, not imported.
    world.recipe("second", "cu126")
    log = guard_log(world.create("second", world.h100_facts, "--json"))
    assert arch_reads(reads) == 1, "the arch list was read again for the same wheel"
    assert "--arch-flags" not in log
    assert f"torch arch list: remembered for this wheel ({entry})" in log
    line = next(x for x in log.splitlines() if x.startswith("torch build: "))
    assert " sm_90" in line and "is the planned torch 2.13.0 cu126 (CUDA 12.6)" in line, line
    # restore's guard (the recorded plan's GPU target) takes it from there too.
    ok(world.cli("backup", "second"))
    restored = world.data(
        "restore", "second", "--prefix", str(world.prefix("back")), "--name", "back", "--no-validate"
    )
    assert world.installed("back") == "2.13.0+cu126"
    assert arch_reads(reads) == 1, "restore read the arch list again"
    assert f"torch arch list: remembered for this wheel ({entry})" in Path(restored["log"]).read_text()


def test_another_file_of_the_same_name_and_version_is_read_again_and_refused(world, tmp_path):
    reads = tmp_path / "arch-reads"
    world.serve_only(counted_torch(tmp_path / "good", CU126_ARCH, reads))
    world.recipe("g126", "cu126")
    ok(world.create("g126", world.h100_facts))
    assert arch_reads(reads) == 1
    # The same file name, torch-2.13.0+cu126, rebuilt without Hopper: its RECORD differs, so it is read again.
    world.serve_only(counted_torch(tmp_path / "repacked", NO_HOPPER, reads))
    res = world.create("g126", world.h100_facts, "--force")
    refused(res, 7, "no code for the target GPU's sm_90 (compute capability 9.0)")
    assert arch_reads(reads) == 2
    assert world.installed("g126") == "2.13.0+cu126"  # the good env stays
    assert len(cache_entries(world)) == 2  # each wheel's own list


def test_a_corrupt_or_foreign_cache_entry_is_ignored_and_never_passes_a_wrong_build(world, tmp_path):
    reads = tmp_path / "arch-reads"
    world.serve_only(counted_torch(tmp_path / "no-hopper", NO_HOPPER, reads))
    world.recipe("g126", "cu126")
    refused(world.create("g126", world.h100_facts), 7, "no code for the target GPU's sm_90")
    [entry] = cache_entries(world)
    assert arch_reads(reads) == 1
    # Refused again from the remembered list, torch not imported.
    refused(world.create("g126", world.h100_facts), 7, "no code for the target GPU's sm_90")
    assert arch_reads(reads) == 1
    lie = json.loads(entry.read_text())
    lie["arch_flags"] = CU126_ARCH.split()  # an entry that would let this wheel pass

    def planted(content: str, mode: int = 0o644, gid: int = -1) -> None:
        entry.write_text(content)
        os.chown(entry, -1, gid)
        entry.chmod(mode)

    other = other_user()
    for why, plant in [
        ("garbage", lambda: planted("{not json")),
        ("another user's", lambda: (planted(json.dumps(lie)), give_to(entry, other))),
        ("writable by another's group", lambda: planted(json.dumps(lie), 0o664, other.gid)),
    ]:
        before = arch_reads(reads)
        plant()
        res = world.create("g126", world.h100_facts)
        refused(res, 7, "no code for the target GPU's sm_90")
        assert f"warning: ignoring the torch build cache entry {entry}" in res.stderr, why
        assert arch_reads(reads) == before + 1, why
        # Rewritten from the read: the user's, private, the wheel's true list.
        st = entry.stat()
        assert (st.st_uid, st.st_mode & 0o022) == (os.geteuid(), 0), why
        assert json.loads(entry.read_text())["arch_flags"] == NO_HOPPER.split(), why


def _pylock(path: Path, wheel: Path, version: str) -> Path:
    """A PEP 751 file from elsewhere (no [tool.envbuilder] table) naming one torch wheel."""
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    path.write_text(
        'lock-version = "1.0"\ncreated-by = "a colleague"\n\n[[packages]]\nname = "torch"\n'
        f'version = "{version}"\nwheels = [{{ url = "{wheel.as_uri()}", hashes = {{ sha256 = "{sha}" }} }}]\n'
    )
    return path


def test_a_pylock_naming_another_torch_build_is_refused_before_anything_is_put_in_place(world, wheels):
    world.recipe("gcpu", "cpu")
    # Another release: refused by the plan, before anything is installed.
    other = stand_in_torch(world.root / "other", "2.14.1+cpu", None)
    res = world.create(
        "gcpu", world.cpu_facts, "--lock", str(_pylock(world.root / "pylock.toml", other, "2.14.1+cpu"))
    )
    refused(res, 13, "has torch 2.14.1+cpu, but the plan installs torch==2.13.0")
    assert not world.prefix("gcpu").exists() and world.leftovers("gcpu") == []

    # The planned release in another build (cu126 for a CPU plan): the build guard refuses what it installed.
    world.serve_only(wheels["cu126"])
    lock = _pylock(world.root / "pylock.toml", wheels["cu126"], f"{PIN}+cu126")
    res = world.create("gcpu", world.cpu_facts, "--lock", str(lock))
    refused(res, 7, "torch build mismatch")
    assert "the installer brought 2.13.0+cu126" in res.stderr
    assert not world.prefix("gcpu").exists() and world.leftovers("gcpu") == []

    # The planned build: the pylock's file is what is installed.
    world.serve_only(wheels["cpu"])
    lock = _pylock(world.root / "pylock.toml", wheels["cpu"], f"{PIN}+cpu")
    ok(world.create("gcpu", world.cpu_facts, "--lock", str(lock), "--locked"))
    assert world.installed("gcpu") == f"{PIN}+cpu"


def test_the_arch_list_is_read_from_the_bindings_library_without_importing_torch(world, tmp_path):
    """A real CUDA torch holds its arch list as a C string in libtorch_python.so (measured on 2.11.0+cu130): the
    guard reads it there, even for a wheel it has never seen, and imports torch only where the bytes cannot tell."""
    reads = tmp_path / "arch-reads"
    world.serve_only(counted_torch(tmp_path / "good", CU126_ARCH, reads, library=[CU126_ARCH]))
    world.recipe("g126", "cu126")
    log = guard_log(world.create("g126", world.h100_facts, "--json"))
    assert arch_reads(reads) == 0 and "--arch-flags" not in log
    [said] = [x for x in log.splitlines() if x.startswith("torch arch list: read from ")]
    assert said.endswith("/site-packages/torch/lib/libtorch_python.so"), said
    line = next(x for x in log.splitlines() if x.startswith("torch build: "))
    assert " sm_90" in line and "is the planned" in line, line

    # Built without Hopper: refused from the library's own bytes, torch still not imported.
    world.serve_only(counted_torch(tmp_path / "no-hopper", NO_HOPPER, reads, library=[NO_HOPPER]))
    refused(world.create("g126", world.h100_facts, "--force"), 7, "no code for the target GPU's sm_90")
    assert arch_reads(reads) == 0
    assert world.installed("g126") == "2.13.0+cu126"

    # Two different lists in the library: the bytes cannot tell, so torch is asked (and its answer kept).
    world.serve_only(counted_torch(tmp_path / "two", CU126_ARCH, reads, library=[CU126_ARCH, "sm_80 sm_86"]))
    log = guard_log(world.create("g126", world.h100_facts, "--force", "--json"))
    assert arch_reads(reads) == 1 and "--arch-flags" in log


# ---------------------------------------------------------------------------------------------------------------
# ROCm and XPU builds (issue 41): STAND-IN wheels labelled +rocm7.2 and +xpu, created into real venvs. No AMD or
# Intel GPU exists here, and the stand-ins carry no HIP or SYCL code: what runs is the plan, the install from the
# variant's index page and the guard's check of the label.


def test_stand_in_rocm_and_xpu_builds_are_created_and_a_cpu_wheel_in_their_place_is_refused(world, tmp_path):
    mi300a = world.facts(
        "mi300a",
        {
            "amdgpu_version": "30.30.2",
            "gpus": [{"name": "AMD Instinct MI300A", "vendor": "amd", "arch": "gfx942"}],
        },
    )
    pvc = world.facts(
        "pvc",
        {"level_zero": "1.17.6", "gpus": [{"name": "Intel(R) Data Center GPU Max 1550", "vendor": "intel"}]},
    )
    rocm = stand_in_torch(tmp_path / "rocm", f"{PIN}+rocm7.2", None)
    xpu = stand_in_torch(tmp_path / "xpu", f"{PIN}+xpu", None)
    cpu = stand_in_torch(tmp_path / "cpu", f"{PIN}+cpu", None)
    for name, variant, facts, wheel in (("grocm", "rocm7.2", mi300a, rocm), ("gxpu", "xpu", pvc, xpu)):
        world.recipe(name, variant)
        world.serve_only(wheel)
        created = ok(world.create(name, facts))
        assert world.installed(name) == f"{PIN}+{variant}"
        assert "support for ROCm/XPU is new and has not run on such hardware here" in created.stderr
        world.serve_only(cpu)
        res = world.create(name, facts, "--force")
        refused(res, 7, "torch build mismatch")
        assert world.installed(name) == f"{PIN}+{variant}"  # the good env stays
