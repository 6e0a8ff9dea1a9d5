"""`envbuilder run` and `envbuilder sbatch` with the tests' real Slurm: a small DDP program of the tests' own
(helpers.TRAIN: gloo on CPU, the session's torch env) under the recipe's launch rules inside an ``srun`` step,
inside ``salloc``, inside a batch job and as a submitted job."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from helpers import cli_argv, cli_env, rank_lines, run_in
from slurm import sbatch_wait

pytestmark = [pytest.mark.integration]

BOUND_S = 240


@pytest.mark.slurm
@pytest.mark.parametrize("outer", ["srun", "salloc"])
def test_run_inside_an_allocation(cpu_torch_world, slurm_cluster, train, outer):
    argv = [
        outer,
        "--nodes=1",
        "--ntasks=1",
        *cli_argv("run", "vcpu", "--launcher", "srun", "--", "train.py"),
    ]
    res = run_in(cpu_torch_world, argv, cwd=train.parent, extra=slurm_cluster.env)
    assert res.returncode == 0, res.stderr
    assert [line.split(" omp=")[0] for line in rank_lines(res.stdout)] == ["rank 0/1 sum=1"]


@pytest.mark.slurm
def test_run_inside_a_batch_script(cpu_torch_world, slurm_cluster, train):
    job = train.parent / "job.sh"
    argv = cli_argv("run", "vcpu", "--launcher", "srun", "--gpus-per-node", "2", "--", "train.py")
    job.write_text("#!/bin/bash\n" + shlex.join(argv) + "\n")
    out = train.parent / "job.out"
    res = sbatch_wait(
        ["--nodes=1", "--ntasks=1", "--cpus-per-task=2", f"--output={out}", str(job)],
        env=cli_env({**cpu_torch_world.env, **slurm_cluster.env}),
        timeout=BOUND_S,
        cwd=train.parent,
    )
    assert res.returncode == 0, out.read_text() if out.exists() else res.stderr
    # The job's 2 CPUs on the node, divided among its 2 ranks.
    assert rank_lines(out.read_text()) == ["rank 0/2 sum=3 omp=1", "rank 1/2 sum=3 omp=1"]


@pytest.mark.slurm
def test_sbatch_submits_the_program_with_the_validated_launch(cpu_torch_world, slurm_cluster, train):
    argv = cli_argv(
        "sbatch", "vcpu", "--launcher", "srun", "--gpus-per-node", "2", "--json", "--", "train.py"
    )
    res = run_in(cpu_torch_world, argv, cwd=train.parent, extra=slurm_cluster.env)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    script = Path(data["script_path"]).read_text()
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=envbuilder-vcpu\n")
    assert f"cd {train.parent}" in script
    assert str(cpu_torch_world.prefix) in script and '--cpus-per-task "${SLURM_CPUS_ON_NODE}"' in script
    output = Path(data["output"])
    deadline = time.monotonic() + BOUND_S
    env = cli_env({**cpu_torch_world.env, **slurm_cluster.env})
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", data["job"]], env=env, capture_output=True, text=True)
        if not queued.stdout.strip():
            break
        time.sleep(0.5)
    assert [line.split(" omp=")[0] for line in rank_lines(output.read_text())] == [
        "rank 0/2 sum=3",
        "rank 1/2 sum=3",
    ]


@pytest.mark.slurm
def test_sbatch_dry_run_and_refusal_inside_a_job(cpu_torch_world, slurm_cluster, train):
    dry = run_in(
        cpu_torch_world,
        cli_argv("sbatch", "vcpu", "--gpus-per-node", "2", "--dry-run", "--", "train.py"),
        cwd=train.parent,
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("#!/bin/bash\n") and "export OMP_NUM_THREADS=$(( cpus > 2" in dry.stdout
    inside = run_in(
        cpu_torch_world,
        ["srun", "--nodes=1", "--ntasks=1", *cli_argv("sbatch", "vcpu", "--", "train.py")],
        cwd=train.parent,
        extra=slurm_cluster.env,
    )
    assert inside.returncode == 2 and "second allocation" in inside.stderr, inside.stderr
