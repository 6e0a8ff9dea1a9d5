"""`envbuilder stage` and `run --stage` for real, on the two-node Slurm cluster of tests/slurm.py: the session's
torch env packed into a directory of the test's, copied to both nodes by real sbcast and unpacked there, and torch
imported from the node-local copies on both nodes. Each node sees its own storage at ``cluster.local`` (a bind
mount in its mount namespace), so the test can tell that both nodes got a copy: as this machine sees it, that
directory stays empty."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import CpuTorchWorld, cli_argv, cli_env, ok, refused
from slurm import ENDED, MultiNodeCluster, job_record

from envbuilder import image, state

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


def test_stage_puts_the_image_on_both_nodes_and_run_imports_from_there(
    cpu_torch_world: CpuTorchWorld, slurm_nodes: MultiNodeCluster, tmp_path: Path
) -> None:
    extra = {**_home(cpu_torch_world, tmp_path), "TMPDIR": str(slurm_nodes.local)}
    ok(cpu_torch_world.cli("pack", "vcpu", "--to", str(tmp_path / "images"), timeout=BOUND_S, **extra))
    env = cli_env({**cpu_torch_world.env, **slurm_nodes.env, **extra})
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

    # A submitted job stages first too: the nodes' copies are gone, the job's script makes them again.
    for node in NODES:
        shutil.rmtree(slurm_nodes.node_local(node) / relative)
    argv = cli_argv("sbatch", "vcpu", "--nodes", "2", "--stage", "--json", "--", "show.py")
    sub = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    job = json.loads(ok(sub).stdout)["data"]
    assert "envbuilder stage vcpu" in Path(job["script_path"]).read_text()
    assert Path(job["script_path"]).is_relative_to(cpu_torch_world.prefix)  # the env's own directory
    record = _wait(job["job"], env)
    output = Path(job["output"]).read_text()
    assert record.get("ExitCode") == "0:0", output
    _ran_on_both_nodes_from(path, output)
    for node in NODES:
        assert (slurm_nodes.node_local(node) / relative / image.UNPACKED_MARK).is_file(), node


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
    cpu_torch_world: CpuTorchWorld, tmp_path: Path
) -> None:
    """Each refused before anything is copied (the job's variables alone say where it runs)."""
    extra = {**_home(cpu_torch_world, tmp_path), "TMPDIR": str(tmp_path / "node")}
    refused(cpu_torch_world.cli("stage", "vcpu", **extra), EXIT_USAGE, "run it inside an allocation")
    refused(
        cpu_torch_world.cli("stage", "vcpu", PBS_JOBID="7.pbs", **extra), EXIT_USAGE, "needs Slurm's sbcast"
    )
    job = {**extra, "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}
    refused(cpu_torch_world.cli("stage", "vcpu", **job), EXIT_STATE, "vcpu has no image")
    ok(cpu_torch_world.cli("pack", "vcpu", "--to", str(tmp_path / "images"), timeout=BOUND_S, **extra))
    home = Path(extra["ENVBUILDER_HOME"])
    record = state.load(home, "vcpu")
    # As if a package was installed after the pack: the env itself is the session's and stays as it is.
    state.save(home, replace(record, image={**record.image, "packages": record.image["packages"][1:]}))
    res = cpu_torch_world.cli("run", "vcpu", "--stage", "--", "python", "-c", "pass", **job)
    refused(res, EXIT_STATE, "is older than the env")
    assert os.listdir(tmp_path / "images") == ["vcpu.sqfs"]
