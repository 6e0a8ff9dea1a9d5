"""`envbuilder validate` from wherever a user stands on a real Slurm (tests/slurm.py, Debian's 22.05): inside an
``srun`` step (the interactive ``srun --pty`` shell of the Zurada page), inside an ``salloc`` allocation and
inside a batch script. Each run has a bounded time: before ``--overlap``, the step inside a step waited forever
for the CPUs its own shell held."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import CpuTorchWorld, cli_argv, cli_env
from slurm import sbatch_wait

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: Generous for a torch import on two busy cores; a hang (the bug) runs into it.
BOUND_S = 240


def _validate_argv(*extra: str) -> list[str]:
    return cli_argv("validate", "vcpu", "--json", "--launcher", "srun", "--checks", "import,ddp", *extra)


def _env(world: CpuTorchWorld, cluster) -> dict[str, str]:
    return cli_env({**world.env, **cluster.env})


def _report(stdout: str) -> dict:
    return json.loads(stdout)["data"]


def _passes(data: dict) -> None:
    checks = data["checks"]
    assert checks["import"]["status"] == "pass" and checks["ddp"]["status"] == "pass", checks
    assert data["world"] == 2  # one torchrun agent, two workers


def test_validate_inside_an_srun_step_shares_the_step(cpu_torch_world, slurm_cluster):
    # The interactive shell of the site's page is a step; the validation's srun inside it must overlap it.
    res = subprocess.run(
        ["srun", "--nodes=1", "--ntasks=1", *_validate_argv()],
        env=_env(cpu_torch_world, slurm_cluster),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert res.returncode == 0, res.stderr
    data = _report(res.stdout)
    _passes(data)
    assert "--overlap" in data["command"]
    cpus = data["command"][data["command"].index("--cpus-per-task") + 1]
    assert cpus.isdigit() and int(cpus) >= 1  # the job's CPUs on the node, not a shell variable


def test_validate_inside_salloc_starts_a_step_of_the_allocation(cpu_torch_world, slurm_cluster):
    res = subprocess.run(
        ["salloc", "--nodes=1", "--ntasks=1", *_validate_argv()],
        env=_env(cpu_torch_world, slurm_cluster),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert res.returncode == 0, res.stderr
    data = _report(res.stdout)
    _passes(data)
    assert "--overlap" not in data["command"] and "--cpus-per-task" in data["command"]


def test_validate_inside_a_batch_script(cpu_torch_world, slurm_cluster, tmp_path: Path):
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + shlex.join(_validate_argv()) + "\n")
    res = sbatch_wait(
        ["--nodes=1", "--ntasks=1", f"--output={out}", f"--error={err}", str(script)],
        env=_env(cpu_torch_world, slurm_cluster),
        timeout=BOUND_S,
    )
    assert res.returncode == 0, err.read_text() if err.exists() else res.stderr
    data = _report(out.read_text())
    _passes(data)
    assert "--overlap" not in data["command"]


def test_submit_from_inside_a_job_is_refused(cpu_torch_world, slurm_cluster):
    res = subprocess.run(
        ["srun", "--nodes=1", "--ntasks=1", *cli_argv("validate", "vcpu", "--submit")],
        env=_env(cpu_torch_world, slurm_cluster),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert res.returncode == 2, res.stderr
    assert "--submit would queue a second allocation" in res.stderr
    assert "Traceback" not in res.stderr


def test_more_nodes_than_the_job_holds_is_refused(cpu_torch_world, slurm_cluster):
    res = subprocess.run(
        [
            "salloc",
            "--nodes=1",
            "--ntasks=1",
            *cli_argv("validate", "vcpu", "--launcher", "srun", "--nodes", "2"),
        ],
        env=_env(cpu_torch_world, slurm_cluster),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert res.returncode == 2, res.stderr
    assert "2 nodes asked for inside job" in res.stderr and "holds 1" in res.stderr
