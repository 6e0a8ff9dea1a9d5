"""Fixtures shared by the test modules; what tests share besides fixtures is in helpers.py."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import containers
import mpitwin
import pytest
import sitepython
import testwheels
from backupworld import backup_files
from condaworld import Wheels, build_channel, wheel_files
from helpers import ENVMODULES_INIT_DIR, TRAIN, CpuTorchWorld, ValidateWorld, share_bytecode
from slurm import ConfinedCluster, MiniCluster, MultiNodeCluster, available, multinode_available
from wheelindex import serve
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

TESTS = Path(__file__).resolve().parent

#: The test files that keep a worker longest, longest first (each 40 s or more in a full run, 2026-11-28), the
#: rootfs lane's three (the aarch64 node's two, then the bullseye nodes') ahead of the main run's. xdist hands out
#: whole files in collection order (--dist loadfile, --no-loadscope-reorder in pyproject.toml), each to the first worker
#: that runs out (FileWhenIdle), and these go first: its own order, by number of tests, sent these few-test long
#: files last, so the suite ended with one worker running one of them while the others sat idle.
LONGEST_FIRST = (
    "integration/test_aarch64_mpi.py",
    "integration/test_aarch64_node.py",
    "integration/test_compute_nodes.py",
    "integration/test_seed_twins.py",
    "integration/test_stage.py",
    "integration/test_backup_torch.py",
    "integration/test_conda_torch.py",
    "integration/test_multinode.py",
    "integration/test_site_mpi.py",
    "integration/test_create.py",
    "integration/test_validate_kill.py",
    "integration/test_validate.py",
    "integration/test_container_world.py",
    "integration/test_lock.py",
    "integration/test_activation_shells.py",
    "integration/test_activation.py",
    "integration/test_backup.py",
    "integration/test_launch_contexts.py",
    "integration/test_create_torch.py",
    "integration/test_registry.py",
    "integration/test_conda.py",
    "integration/test_diskfull.py",
    "integration/test_progress.py",
    "unit/test_proc.py",  # mostly sleeps (8 s timeouts): collected last, it ended the run alone
    "integration/test_run_slurm.py",
    "integration/test_validate_submit.py",
    "integration/test_offline_validate.py",
    "integration/test_offline_node.py",
    "integration/test_run.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of LONGEST_FIRST first, in its order; the rest after them as collected (a stable sort)."""
    gone = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    if gone:  # a renamed file would quietly lose its place
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no file at: {', '.join(gone)}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(TESTS).as_posix(), len(rank)))


class FileWhenIdle(LoadFileScheduling):
    """xdist's ``--dist loadfile``, except that a worker gets its next file only when it is about to run out of
    tests (its last one waits for the next, xdist's lookahead), not when two are left: xdist's default had queued
    a file behind a long last test or two (the aarch64 node's MPI build, a Slurm job), while the other workers
    went idle with nothing left to take."""

    def _reschedule(self, node: WorkerController) -> None:
        if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
            return
        super()._reschedule(node)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    """:class:`FileWhenIdle` for ``--dist loadfile`` (pyproject.toml's addopts); another ``--dist`` is xdist's."""
    return FileWhenIdle(config, log) if config.getvalue("dist") == "loadfile" else None


#: A test module all of whose tests are integration tests says so on one line of its own.
_ALL_INTEGRATION = re.compile(r"^pytestmark = \[?pytest\.mark\.integration\b", re.MULTILINE)


def _fast_lane(config: pytest.Config) -> bool:
    """Whether this is the fast lane, ``-m "not integration"`` as the README writes it."""
    return bool(config.getoption("markexpr") == "not integration")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast lane leaves out every test of a module marked integration as a whole: such a module is not
    imported at all (a second a worker of collecting what would only be deselected)."""
    if not _fast_lane(config) or collection_path.suffix != ".py":
        return None
    return True if _ALL_INTEGRATION.search(collection_path.read_text(encoding="utf-8")) else None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Two workers per core for ``-n auto`` (addopts caps it at 4): much of the suite waits on real tools (Slurm's
    scheduler, torchrun's rendezvous, a timeout running out) rather than computing, and a second worker per core
    fills those waits. The fast lane computes: there a second worker per core only collects the suite again (36 s
    against 32 s on 2 cores, 2026-11-29)."""
    cores = os.cpu_count() or 1
    return cores if _fast_lane(config) else 2 * cores


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One real single-node Slurm cluster (tests/slurm.py) shared by the session; skips where it cannot run."""
    reason = available()
    if reason is not None:
        pytest.skip(f"no test Slurm cluster: {reason}")
    with MiniCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_confined(tmp_path_factory: pytest.TempPathFactory):
    """A real single-node Slurm cluster whose steps run only on the CPUs they were allocated, as sites run
    Slurm (tests/slurm.py ConfinedCluster: cgroups where this machine allows, else CPU binding; its
    ``confinement`` says which); skips where no Slurm can run."""
    reason = available()
    if reason is not None:
        pytest.skip(f"no test Slurm cluster: {reason}")
    with ConfinedCluster(tmp_path_factory.mktemp("slurm-confined")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_nodes(tmp_path_factory: pytest.TempPathFactory):
    """A real two-node Slurm cluster on this machine (tests/slurm.py: nodes n1 and n2, each slurmd a host of its
    own) shared by the session; skips, saying why, where it cannot run."""
    reason = multinode_available()
    if reason is not None:
        pytest.skip(f"no multi-node test Slurm cluster: {reason}")
    with MultiNodeCluster(tmp_path_factory.mktemp("slurm-nodes"), nodes=2) as cluster:
        yield cluster


@pytest.fixture
def envmodules_init() -> Path:
    """The init directory (bash, zsh, ...) of the private Tcl Environment Modules; skips where it is missing."""
    if not (ENVMODULES_INIT_DIR / "bash").is_file():
        pytest.skip(f"Tcl Environment Modules not unpacked in {ENVMODULES_INIT_DIR} (.ci/run does it)")
    return ENVMODULES_INIT_DIR


@pytest.fixture(scope="session")
def torch_files(tmp_path_factory):
    """torch 2.13.0 (CPU) and what it needs, plus mpi4py and MPICH, from the machine's cache of PyPI's files
    (tests/testwheels.py; pip's find-links holds the torch file). Copied once per run: xdist's workers share it."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the machine image's torch file is for CPython 3.11")
    return made_once(shared_dir(tmp_path_factory, "torch-files"), _fetch_torch_files)


def _fetch_torch_files(d: Path) -> None:
    _from_cache(d, "torch-files")
    if not list(d.glob("torch-2.13.0*cpu*.whl")):
        pytest.skip("the CPU torch 2.13.0 file is not on this machine (pip find-links)")


def _from_cache(d: Path, name: str) -> None:
    """The files of ``testwheels.SETS[name]`` copied from the machine's cache (no network), or a skip saying how
    to fill it."""
    why = testwheels.missing()
    if why:
        pytest.skip(why)
    res = testwheels.fetch(d, name)
    if res.returncode != 0:
        pytest.skip(
            f"{name}: not in {testwheels.CACHE} ({res.stderr[-300:]}); run `python tests/testwheels.py`"
        )


#: Where the controlling pytest process tells its xdist workers the address of the session's torch index.
TORCH_INDEX_URL = "ENVBUILDER_TEST_TORCH_INDEX"


@pytest.hookimpl(trylast=True)  # after pytest's own configure has made the temporary-directory factory
def pytest_configure(config: pytest.Config) -> None:
    """The session's torch index, served by the controlling process (the only one without xdist) for as long as
    the session runs, so every worker reaches the same address: uv's cache keys what it unpacked by index, and one
    address lets ``torch_uv_cache`` hold torch once for the session. It serves ``torch_files``' directory, which
    the first worker to need it fills."""
    _hear_ctrl_c()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    files = config._tmp_path_factory.getbasetemp() / "torch-files"  # shared_dir's "torch-files"
    files.mkdir(exist_ok=True)
    served = contextlib.ExitStack()
    os.environ[TORCH_INDEX_URL] = served.enter_context(serve(files)).url
    config.add_cleanup(served.close)


def _hear_ctrl_c() -> None:
    """SIGINT as an interactive run has it. A run started in the background of a non-interactive shell (``cmd &``,
    nohup) inherits it ignored, and so would every process the tests start (an ignored signal stays ignored across
    exec): the tests that stop a create, a validate, a swap or a child with Ctrl-C then failed, 9 of them, for what
    the run was started from. Restored before xdist starts its workers, which then begin with Python's own."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def shared_dir(factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory shared by every xdist worker of this run (the run's own basetemp without xdist)."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (root / name).mkdir(exist_ok=True)
    return root / name


def made_once(d: Path, make: Callable[[Path], object]) -> Path:
    """``d`` (a ``shared_dir``) after ``make(d)`` ran in it once for the run: the first worker to get here makes
    it, the others wait for it and then find it made."""
    with open(d.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = d.with_suffix(".complete")
        if not done.exists():
            make(d)
            done.touch()
    return d


@pytest.fixture(scope="session")
def site_python(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The site-built CPython of a version ("3.9") that tests/sitepython.py lays out, once per run (xdist's
    workers share it): its tree, which starts only with ``tree/lib`` on LD_LIBRARY_PATH. Skips, saying why, where
    it cannot be made here."""

    def get(version: str) -> Path:
        reason = sitepython.why_not(version)
        if reason is not None:
            pytest.skip(f"no site-built python {version}: {reason}")
        # No dot in the name: made_once's lock and mark replace what follows the last one.
        d = shared_dir(tmp_path_factory, f"site-python-{version.replace('.', '')}")
        failed = d.with_suffix(".failed")
        if not failed.exists():
            made_once(d, lambda d: _lay_out(lambda: sitepython.lay_out(version, d / "tree"), failed))
        if failed.exists():
            pytest.skip(f"no site-built python {version}: {failed.read_text()}")
        return d / "tree"

    return get


def _lay_out(make: Callable[[], None], failed: Path) -> None:
    """``make()`` (a site-built python or MPI laid out), or why it could not be done in ``failed`` (read by every
    worker after)."""
    try:
        make()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        failed.write_text(str(exc))


@pytest.fixture(scope="session")
def site_mpi(tmp_path_factory: pytest.TempPathFactory, torch_files: Path) -> Path:
    """The site-built MPICH that tests/mpitwin.py lays out from the torch files' mpich wheel, once per run (xdist's
    workers share it): its tree, whose libmpi only ``tree/lib`` on LD_LIBRARY_PATH finds. Skips, saying why,
    where it cannot be made here."""
    reason = mpitwin.why_not()
    whl = mpitwin.wheel(torch_files)
    if reason is None and whl is None:
        reason = f"no mpich {mpitwin.VERSION} wheel among the torch files"
    if reason is not None or whl is None:
        pytest.skip(f"no site-built MPI: {reason}")
    d = shared_dir(tmp_path_factory, "site-mpich")
    failed = d.with_suffix(".failed")
    if not failed.exists():
        made_once(d, lambda d: _lay_out(lambda: mpitwin.lay_out(whl, d / "tree"), failed))
    if failed.exists():
        pytest.skip(f"no site-built MPI: {failed.read_text()}")
    return d / "tree"


@pytest.fixture(scope="session")
def mpi4py_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mpi4py's source distribution (the release tests/armtwin.py builds on the aarch64 node) and the wheels its
    build needs on this machine (setuptools, build, Cython), from the machine's cache (tests/testwheels.py)."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the build requirements are fetched for this CPython, and the torch file is for 3.11")
    return made_once(shared_dir(tmp_path_factory, "mpi4py-source"), _fetch_mpi4py_source)


def _fetch_mpi4py_source(d: Path) -> None:
    _from_cache(d, "mpi4py-source")
    _from_cache(d, "mpi4py-build")


@pytest.fixture(scope="session")
def torch_index(torch_files) -> SimpleNamespace:
    """``torch_files`` served on 127.0.0.1 for the whole session, at one address for every worker (see
    ``pytest_configure``). A test that watches an index's requests serves its own."""
    return SimpleNamespace(url=os.environ[TORCH_INDEX_URL])


@pytest.fixture(scope="session")
def bare_torch_uv_cache(tmp_path_factory) -> Path:
    """uv's cache shared by the torch envs of the session, across workers (uv locks its cache for concurrent
    use): the first env unpacks torch from ``torch_index``, later ones link it. Tests take ``torch_uv_cache``."""
    return shared_dir(tmp_path_factory, "torch-uv-cache")


@pytest.fixture(scope="session")
def cpu_torch_template(torch_index, bare_torch_uv_cache, tmp_path_factory) -> Path:
    """The world of one real env, built once for the run: torch 2.13.0 CPU, numpy, mpi4py and MPICH (the
    validation suite's recipe, tests/data/validate-recipes/vcpu.toml), its bytecode written. No test uses it;
    they use copies."""
    template = shared_dir(tmp_path_factory, "cpu-torch-template")
    return made_once(template, lambda d: CpuTorchWorld(d, torch_index, bare_torch_uv_cache))


@pytest.fixture(scope="session")
def torch_uv_cache(cpu_torch_template, bare_torch_uv_cache, tmp_path_factory) -> Path:
    """The session's uv cache, holding beside torch's, numpy's and mpi4py's files the bytecode that the
    template's validation steps wrote (``share_bytecode``): an env uv links from it starts as a validated env
    does, instead of each first import compiling what it loads again (measured here: about 4 s of CPU for
    ``import torch``, 9 s with dynamo and torchrun's agent, in every rank of a fresh env's first run). Bytecode
    written by a create, a smoke check or ranks is tested where a cache of its own has none
    (test_create_torch)."""

    def share(d: Path) -> None:
        site = next(cpu_torch_template.glob("scratch/envbuilder/envs/vcpu/lib/python3*/site-packages"))
        (d / "linked").write_text(str(share_bytecode(site, bare_torch_uv_cache)))

    made_once(shared_dir(tmp_path_factory, "torch-uv-bytecode"), share)
    return bare_torch_uv_cache


@pytest.fixture(scope="session")
def cpu_torch_world(cpu_torch_template, torch_index, torch_uv_cache, tmp_path_factory) -> CpuTorchWorld:
    """This worker's copy of the session's CPU torch env and its world (``CpuTorchWorld.copy_of``), the env at
    ``world.prefix``. Tests only use it (validate, show); a test that changes an env makes its own."""
    root = tmp_path_factory.mktemp("cpu-torch")
    return CpuTorchWorld.copy_of(cpu_torch_template, root, torch_index, torch_uv_cache)


@pytest.fixture
def validate_world(cpu_torch_world: CpuTorchWorld) -> Iterator[ValidateWorld]:
    """The session's CPU torch env, validated in its user's world; the variants a test recorded are dropped after
    it."""
    world = ValidateWorld(cpu_torch_world)
    yield world
    world.forget_variants()


@pytest.fixture(scope="module")
def backup_index(tmp_path_factory, torch_files):
    """The backup tests' index (tests/backupworld.py): the torch files and small test wheels, served per module."""
    with serve(backup_files(tmp_path_factory.mktemp("backup-files"), torch_files)) as index:
        yield index


@pytest.fixture(scope="module")
def conda_channel(tmp_path_factory) -> Path:
    """The conda tests' channel (tests/condaworld.py), built per module."""
    return build_channel(tmp_path_factory.mktemp("conda-channel"))


@pytest.fixture(scope="module")
def conda_wheels(tmp_path_factory, torch_files, torch_index) -> Iterator[Wheels]:
    """The conda tests' wheel index (the torch files and condademo), served per module as PyPI, with the
    session's torch index as download.pytorch.org (condaworld.Wheels)."""
    with serve(wheel_files(tmp_path_factory.mktemp("conda-wheels"), torch_files)) as index:
        yield Wheels(index.url, torch_index.url)


@pytest.fixture(scope="module")
def conda_uv_cache(torch_uv_cache: Path) -> Path:
    """uv's cache for the conda modules' envs: the session's torch cache (``torch_uv_cache``), so torch, from the
    session's torch index, is linked from where the session unpacked it once, not unpacked again per module (it
    was, at about 10 s of CPU each time)."""
    return torch_uv_cache


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[containers.Registry]:
    """Debian's OCI registry serving the container world's tags (tests/containers.py: TAGS) over plain HTTP on
    127.0.0.1, for the session: ``.url``, ``.host`` (127.0.0.1:PORT), ``.ref(tag)`` and ``.docker(tag)`` (the
    reference as Apptainer takes it), ``.digests`` (tag -> digest), ``.tags``, ``.inspect(tag, raw=, config=)``
    (skopeo's view) and ``.push(source, tag)``. Skips, saying why, where the world cannot be had here."""
    reason = containers.missing()
    if reason is not None:
        pytest.skip(f"no container world: {reason}")
    with containers.Registry(tmp_path_factory.mktemp("oci-registry"), seeded=True) as registry:
        yield registry


@pytest.fixture(scope="session")
def apptainer() -> SimpleNamespace:
    """The Apptainer stand-in (tests/shims/apptainer/apptainer, over Charliecloud): ``.exe`` its path, ``.bin``
    its directory, ``.env`` this environment with it first on PATH and APPTAINER_NOHTTPS=1 (the test registry is
    plain HTTP). Skips, saying why, where its tools are missing."""
    reason = containers.missing_tools()
    if reason is not None:
        pytest.skip(f"no Apptainer stand-in: {reason}")
    bin_dir = TESTS / "shims" / "apptainer"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "APPTAINER_NOHTTPS": "1"}
    return SimpleNamespace(exe=bin_dir / "apptainer", bin=bin_dir, env=env)


@pytest.fixture(scope="session")
def cpu_sif(tmp_path_factory: pytest.TempPathFactory, oci_registry, apptainer) -> Path:
    """The container world's CPU tag pulled once per run by the Apptainer stand-in (xdist's workers share it):
    the image file (a SquashFS, as tests/shims/apptainer/apptainer writes it). Tests only read and run it."""
    tag = containers.TAGS[0].name

    def pull(d: Path) -> None:
        argv = [str(apptainer.exe), "-q", "pull", str(d / "cpu.sif"), oci_registry.docker(tag)]
        res = subprocess.run(argv, env=apptainer.env, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            pytest.fail(f"apptainer pull of {tag} failed: {res.stderr[-2000:]}")

    return made_once(shared_dir(tmp_path_factory, "cpu-sif"), pull) / "cpu.sif"


@pytest.fixture
def train(tmp_path: Path) -> Path:
    """helpers.TRAIN at tmp_path/train.py."""
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path
