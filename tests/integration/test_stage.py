"""`envbuilder stage` and `run --stage` for real, on the two-node Slurm cluster of tests/slurm.py: the session's
torch env packed into a directory of the test's, copied to both nodes by real sbcast and unpacked there, and torch
imported from the node-local copies on both nodes. Each node sees its own storage at ``cluster.local`` (a bind
mount in its mount namespace), so the test can tell that both nodes got a copy: as this machine sees it, that
directory stays empty."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from helpers import CpuTorchWorld, cli_argv, cli_env, ok, refused, size_now
from slurm import ENDED, MultiNodeCluster, job_record

from envbuilder.scale import image
from envbuilder.system import state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slurm,
    pytest.mark.multinode,
    pytest.mark.skipif(
        not (shutil.which("mksquashfs") and shutil.which("unsquashfs") and shutil.which("sbcast")),
        reason="needs squashfs-tools and Slurm's sbcast (.ci/run installs them)",
    ),
]

#: Generous for packing torch and unpacking it twice on two busy cores.
BOUND_S = 600
NODES = ["n1", "n2"]
EXIT_USAGE, EXIT_STATE = 2, 9
SHOW = "import socket, torch; print('ran', socket.gethostname(), torch.__file__, flush=True)"


def _home(world: CpuTorchWorld, tmp_path: Path) -> dict[str, str]:
    """A copy of the world's records (the env itself is only read), its image going into the test's directory."""
    home = tmp_path / "eb-home"
    shutil.copytree(world.home, home)
    return {"ENVBUILDER_HOME": str(home)}


def _salloc(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", *cli_argv(*args)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=BOUND_S, cwd=cwd)


@dataclass(frozen=True)
class Packed:
    """The torch env packed once for this module's tests: their working directory, and the CLI's environment
    (TMPDIR at the nodes' local storage)."""

    root: Path
    env: dict[str, str]

    @property
    def home(self) -> Path:
        return Path(self.env["ENVBUILDER_HOME"])

    def key(self, name: str = "vcpu") -> str:
        return image.image_key(state.load(self.home, name))


@pytest.fixture(scope="module")
def packed(
    cpu_torch_world: CpuTorchWorld, slurm_nodes: MultiNodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Packed]:
    root = tmp_path_factory.mktemp("stage")
    extra = {**_home(cpu_torch_world, root), "TMPDIR": str(slurm_nodes.local)}
    ok(cpu_torch_world.cli("pack", "vcpu", "--to", str(root / "images"), timeout=BOUND_S, **extra))
    made = Packed(root, cli_env({**cpu_torch_world.env, **slurm_nodes.env, **extra}))
    yield made
    # The nodes share this machine's /tmp here: the alias they made to their copies is one link, left there.
    alias = image.default_base() / f"{made.key()}.unpacked"
    if alias.is_symlink():
        alias.unlink()


def _on_nodes(nodes: MultiNodeCluster, name: str) -> list[Path]:
    """``name`` in this user's node-local directory, as each node sees it."""
    return [nodes.node_local(node) / f"envbuilder-{os.getuid()}" / name for node in NODES]


def test_stage_puts_the_image_on_both_nodes_and_run_imports_from_there(
    packed: Packed, slurm_nodes: MultiNodeCluster
) -> None:
    env, tmp_path = packed.env, packed.root
    staged = json.loads(ok(_salloc(env, "stage", "vcpu", "--json", cwd=tmp_path)).stdout)["data"]
    assert (staged["nodes"], staged["copied"]) == (2, True), staged
    path = Path(staged["path"])
    relative = path.relative_to(slurm_nodes.local)
    for node in NODES:
        copy = slurm_nodes.node_local(node) / relative
        assert (copy / image.UNPACKED_MARK).is_file(), node
        assert (copy / "bin" / "python").exists(), node
        # The broadcast file is dropped once unpacked: the node keeps one copy.
        assert not list(copy.parent.glob(f"*{image.SUFFIX}")), node
    # As this machine sees the nodes' local directory, nothing is there: the copies went to the nodes.
    assert not (slurm_nodes.local / relative.parts[0]).exists()
    again = json.loads(ok(_salloc(env, "stage", "vcpu", "--json", cwd=tmp_path)).stdout)["data"]
    assert (again["path"], again["copied"]) == (str(path), False)

    (tmp_path / "show.py").write_text(SHOW + "\n")  # a .py: the env's own python runs it, from the copy
    res = ok(_salloc(env, "run", "vcpu", "--nodes", "2", "--stage", "--", "show.py", cwd=tmp_path))
    _ran_on_both_nodes_from(path, res.stdout + res.stderr)


def test_a_job_stages_where_its_nodes_keep_local_files_not_where_it_was_submitted(
    packed: Packed, slurm_nodes: MultiNodeCluster, cpu_torch_world: CpuTorchWorld
) -> None:
    """The submit host's TMPDIR is a directory the nodes lack (as a login node's own is): the script names none
    of it; the job's nodes use the TMPDIR the job gets (here set with SBATCH_EXPORT, as a user or site would),
    and its ranks reach their node's copy through the alias every node names alike. The env's copies of an
    older pack go; another env's stay."""
    key = packed.key()
    alias = image.default_base() / f"{key}.unpacked"
    older = "vcpu-0123456789abcdef.unpacked"
    for copy, old, other in zip(
        _on_nodes(slurm_nodes, f"{key}.unpacked"),
        _on_nodes(slurm_nodes, older),
        _on_nodes(slurm_nodes, "vcpu-extra-0123456789abcdef.unpacked"),
    ):
        shutil.rmtree(copy, ignore_errors=True)  # an earlier test's: the job's script must make them again
        for made in (old, other):
            made.mkdir(parents=True, exist_ok=True)
            (made / image.UNPACKED_MARK).write_text("0" * 64 + "\n")
    login = slurm_nodes.local / "login-only"  # this machine has it; each node sees its own storage there
    login.mkdir()
    env = {**packed.env, "TMPDIR": str(login), "SBATCH_EXPORT": f"ALL,TMPDIR={slurm_nodes.local}"}
    (packed.root / "show.py").write_text(SHOW + "\n")
    argv = cli_argv("sbatch", "vcpu", "--nodes", "2", "--stage", "--json", "--", "show.py")
    try:
        sub = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=packed.root)
        job = json.loads(ok(sub).stdout)["data"]
        script = Path(job["script_path"]).read_text()
        assert "envbuilder stage vcpu" in script
        assert str(login) not in script and "TMPDIR" not in script, script
        assert Path(job["script_path"]).is_relative_to(cpu_torch_world.prefix)  # the env's own directory
        record = _wait(job["job"], env)
        output = Path(job["output"]).read_text()
        assert record.get("ExitCode") == "0:0", output
        _ran_on_both_nodes_from(alias, output)
        for copy, old, other in zip(
            _on_nodes(slurm_nodes, f"{key}.unpacked"),
            _on_nodes(slurm_nodes, older),
            _on_nodes(slurm_nodes, "vcpu-extra-0123456789abcdef.unpacked"),
        ):
            assert (copy / image.UNPACKED_MARK).is_file(), copy
            assert not old.exists() and other.is_dir(), (old, other)
    finally:
        login.rmdir()


def test_stage_clean_removes_the_env_s_copies_from_every_node(
    packed: Packed, slurm_nodes: MultiNodeCluster
) -> None:
    """Whatever digest they have (a copy made by hand stands for an older pack's), and the alias with them;
    another env's stay; a second clean finds nothing."""
    ok(_salloc(packed.env, "stage", "vcpu", cwd=packed.root))
    other = "vcpu-extra-0123456789abcdef.unpacked"  # another env's copy: it stays
    for old, kept in zip(
        _on_nodes(slurm_nodes, "vcpu-0123456789abcdef.unpacked"), _on_nodes(slurm_nodes, other)
    ):
        old.mkdir(parents=True, exist_ok=True)
        kept.mkdir(parents=True, exist_ok=True)
    cleaned = json.loads(
        ok(_salloc(packed.env, "stage", "vcpu", "--clean", "--json", cwd=packed.root)).stdout
    )
    assert cleaned["data"]["removed"] == dict.fromkeys(NODES, 2), cleaned
    for node in NODES:
        left = list((slurm_nodes.node_local(node) / f"envbuilder-{os.getuid()}").iterdir())
        assert [p.name for p in left if p.name.startswith("vcpu")] == [other], left
    assert not os.path.lexists(image.default_base() / f"{packed.key()}.unpacked")
    again = json.loads(ok(_salloc(packed.env, "stage", "vcpu", "--clean", "--json", cwd=packed.root)).stdout)
    assert again["data"]["removed"] == dict.fromkeys(NODES, 0)


def test_a_hostile_env_name_reaches_the_nodes_and_the_script_as_one_argument(
    packed: Packed, slurm_nodes: MultiNodeCluster, cpu_torch_world: CpuTorchWorld, tmp_path: Path
) -> None:
    """An env named with a space, ``;`` and ``$()``: the job script's stage command carries it quoted, and
    ``stage --clean`` hands it to every node's step as one argument, through srun and through a PBS job's
    node launcher (its copies go, nothing runs)."""
    name = "v cpu;$(touch pwned)"
    record = state.load(packed.home, "vcpu")
    state.save(packed.home, replace(record, name=name))
    try:
        script = ok(
            subprocess.run(
                cli_argv("sbatch", name, "--stage", "--dry-run", "--", "show.py"),
                env=packed.env,
                capture_output=True,
                text=True,
                timeout=60,
                cwd=packed.root,
            )
        ).stdout
        staging_line = next(line for line in script.splitlines() if " stage " in line)
        assert shlex.split(staging_line)[-2:] == ["stage", name], staging_line
        key = packed.key(name)
        for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"):
            copy.mkdir(parents=True)
        res = ok(_salloc(packed.env, "stage", name, "--clean", "--json", cwd=packed.root))
        assert json.loads(res.stdout)["data"]["removed"] == dict.fromkeys(NODES, 1), res.stderr
        assert not any(copy.exists() for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"))
        for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"):
            copy.mkdir()
        in_pbs_job = _pbs_job(packed, slurm_nodes, cpu_torch_world, tmp_path)
        assert in_pbs_job("stage", name, "--clean")["removed"] == dict.fromkeys(NODES, 1)
        assert not any(copy.exists() for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"))
        assert not (packed.root / "pwned").exists() and not (tmp_path / "pwned").exists()
    finally:
        state.record_path(packed.home, name).unlink()


def _ran_on_both_nodes_from(path: Path, output: str) -> None:
    ran = sorted(line.split()[1:] for line in output.splitlines() if line.startswith("ran "))
    assert [host for host, _ in ran] == NODES, output
    assert all(where.startswith(f"{path}/") for _, where in ran), ran


def _wait(job: str, env: dict[str, str]) -> dict[str, str]:
    deadline = time.monotonic() + BOUND_S
    while (record := job_record(job, env)).get("JobState") not in ENDED:
        assert time.monotonic() < deadline, f"job {job} still {record.get('JobState')}"
        time.sleep(0.5)
    return record


def test_stage_refuses_outside_slurm_and_a_missing_or_stale_image(
    cpu_torch_world: CpuTorchWorld, packed: Packed, tmp_path: Path
) -> None:
    """Each refused before anything is copied (the job's variables alone say where it runs). The stale image is
    the module's one pack, seen from a copy of its records (a second pack of torch cost ~4 s of CPU)."""
    extra = {**_home(cpu_torch_world, tmp_path), "TMPDIR": str(tmp_path / "node")}
    refused(cpu_torch_world.cli("stage", "vcpu", **extra), EXIT_USAGE, "run it inside an allocation")
    refused(cpu_torch_world.cli("stage", "vcpu", PBS_JOBID="7.pbs", **extra), EXIT_USAGE, "$PBS_NODEFILE")
    job = {**extra, "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}
    refused(cpu_torch_world.cli("stage", "vcpu", **job), EXIT_STATE, "vcpu has no image")
    home = tmp_path / "packed-home"
    shutil.copytree(packed.home, home)
    record = state.load(home, "vcpu")
    assert record.image, "the module's pack recorded no image"
    images = sorted(os.listdir(packed.root / "images"))
    # As if a package was installed after the pack: the env itself is the session's and stays as it is.
    state.save(home, replace(record, image={**record.image, "packages": record.image["packages"][1:]}))
    res = cpu_torch_world.cli(
        "run", "vcpu", "--stage", "--", "python", "-c", "pass", **{**job, "ENVBUILDER_HOME": str(home)}
    )
    refused(res, EXIT_STATE, "is older than the env")
    assert sorted(os.listdir(packed.root / "images")) == images == ["vcpu.sqfs"]


def _pbs_job(
    packed: Packed, slurm_nodes: MultiNodeCluster, world: CpuTorchWorld, tmp_path: Path
) -> Callable[..., dict[str, Any]]:
    """``envbuilder ARGS --json`` in a stand-in PBS job on the two nodes, started on n1; its data."""
    nodes, nodefile = tmp_path / "nodes", tmp_path / "PBS_NODEFILE"
    nodes.write_text("".join(f"{name} {slurm_nodes.host_pid(name)}\n" for name in NODES))
    nodefile.write_text("".join(f"{name}\n" for name in NODES))
    tmrsh = str(Path(__file__).parents[1] / "shims" / "pbs" / "pbs_tmrsh")
    env = {
        **packed.env,
        "PATH": f"{world.prefix / 'bin'}:{packed.env['PATH']}",
        "PBS_JOBID": "7.pbs-shim",
        "PBS_NODEFILE": str(nodefile),
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_O_WORKDIR": str(tmp_path),
        "PBS_SHIM_NODES": str(nodes),
        "HYDRA_LAUNCHER": "rsh",
        "HYDRA_LAUNCHER_EXEC": tmrsh,
    }

    def in_job(*args: str) -> dict[str, Any]:
        # pbs_tmrsh joins its words for a shell, as rsh does: the command goes quoted, as a user types it.
        argv = [tmrsh, "n1", shlex.join(cli_argv(*args, "--json"))]
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=BOUND_S, cwd=tmp_path)
        return dict(json.loads(ok(res).stdout)["data"])

    return in_job


def test_stage_in_a_pbs_job_copies_the_image_on_each_node_at_once(
    packed: Packed, slurm_nodes: MultiNodeCluster, cpu_torch_world: CpuTorchWorld, tmp_path: Path
) -> None:
    """PBS has no broadcast: each node of the job copies the image from the shared file system, started on every
    host of $PBS_NODEFILE by the job's node launcher. No PBS runs here, so its parts are stood in for as in
    test_multinode's PBS test: the job is its environment (PBS_JOBID, a PBS_NODEFILE listing n1 and n2), its
    shell runs on n1, and the remote start is tests/shims/pbs/pbs_tmrsh under MPICH's hydra mpiexec (the env's
    mpich wheel on PATH, as a site's MPI module puts its own)."""
    key = packed.key()
    for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"):
        shutil.rmtree(copy, ignore_errors=True)
    in_job = _pbs_job(packed, slurm_nodes, cpu_torch_world, tmp_path)
    staged = in_job("stage", "vcpu")
    assert (staged["nodes"], staged["copied"]) == (2, True), staged
    assert Path(staged["path"]) == slurm_nodes.local / f"envbuilder-{os.getuid()}" / f"{key}.unpacked"
    for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"):
        assert (copy / image.UNPACKED_MARK).is_file(), copy
        assert (copy / "bin" / "python").exists(), copy
        assert not list(copy.parent.glob(f"*{image.SUFFIX}*")), copy  # the copied image is dropped
    assert in_job("stage", "vcpu")["copied"] is False
    assert in_job("stage", "vcpu", "--clean")["removed"] == dict.fromkeys(NODES, 1)
    assert not any(copy.exists() for copy in _on_nodes(slurm_nodes, f"{key}.unpacked"))


def _stage_process(salloc: subprocess.Popen[str]) -> int:
    """The pid of the envbuilder that ``salloc`` runs (its child)."""
    for task in Path(f"/proc/{salloc.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"envbuilder" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise AssertionError(f"salloc (pid {salloc.pid}) runs no envbuilder")


def test_a_stage_killed_while_sbcast_writes_leaves_nothing_under_the_copy_s_name(
    packed: Packed, slurm_nodes: MultiNodeCluster
) -> None:
    """sbcast writes the image on each node under a name of its own (``.KEY.sqfs.partial-JOB``), which the node
    step unpacks and removes: a stage killed while sbcast writes leaves no file under the image copy's name for
    anything to take as whole, and the next stage copies the image whole and removes what the killed one left.
    (sbcast used to write ``KEY.sqfs`` itself, which stayed there, partial, until the next stage.)"""
    ok(_salloc(packed.env, "stage", "vcpu", "--clean", cwd=packed.root))  # no node has it: stage copies
    key = packed.key()
    dirs = _on_nodes(slurm_nodes, "")
    sent = lambda: [p for d in dirs if d.is_dir() for p in d.glob(f"*{key}{image.SUFFIX}*")]  # noqa: E731
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", *cli_argv("stage", "vcpu")]
    salloc = subprocess.Popen(argv, env=packed.env, cwd=packed.root, text=True, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + BOUND_S
        while not any(size_now(p) > 0 for p in sent()):
            assert salloc.poll() is None, f"stage ended before sbcast wrote: {salloc.communicate()[1]}"
            assert time.monotonic() < deadline, "sbcast never wrote the image on a node"
            time.sleep(0.002)
        os.kill(_stage_process(salloc), signal.SIGKILL)  # its sbcast dies with it (parent-death signal)
        salloc.communicate(timeout=BOUND_S)
    finally:
        if salloc.poll() is None:
            salloc.kill()
            salloc.communicate()
    left = [p.name for p in sent()]
    assert left and all(n.startswith(f".{key}{image.SUFFIX}.partial-") for n in left), left
    staged = json.loads(ok(_salloc(packed.env, "stage", "vcpu", "--json", cwd=packed.root)).stdout)["data"]
    assert staged["copied"] is True, staged
    for node, where in zip(NODES, dirs):
        assert (where / f"{key}.unpacked" / image.UNPACKED_MARK).is_file(), node
    assert sent() == []
