"""`envbuilder run` and `envbuilder sbatch`: a small DDP program of the tests' own (gloo on CPU, the session's torch
env) under the recipe's launch rules, here, inside an ``srun`` step, inside ``salloc``, inside a batch job and as
a submitted job of the tests' real Slurm."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from helpers import DATA, REPO, CpuTorchWorld, cli_argv, cli_env
from slurm import sbatch_wait

from envbuilder import state

pytestmark = [pytest.mark.integration]

BOUND_S = 240

TRAIN = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
line = f"rank {dist.get_rank()}/{dist.get_world_size()} sum={t.item():g} omp={os.environ['OMP_NUM_THREADS']}"
sys.stdout.write(line + "\\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.barrier()  # no rank tears gloo down while another still talks to it
dist.destroy_process_group()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def train(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def _run(world: CpuTorchWorld, argv: list[str], *, cwd: Path, extra: dict[str, str] | None = None):
    return subprocess.run(
        argv,
        env=cli_env({**world.env, **(extra or {})}),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        cwd=cwd,
    )


def _ranks(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("rank "))


def test_run_starts_one_world_and_passes_the_exit_status_on(cpu_torch_world, train):
    res = _run(
        cpu_torch_world, cli_argv("run", "vcpu", "--gpus-per-node", "2", "--", "train.py"), cwd=train.parent
    )
    assert res.returncode == 0, res.stderr
    # One world of two (not two worlds of one), threads = this machine's CPUs divided among the two ranks.
    assert [line.split(" omp=")[0] for line in _ranks(res.stdout)] == ["rank 0/2 sum=3", "rank 1/2 sum=3"]
    failed = _run(
        cpu_torch_world,
        cli_argv("run", "vcpu", "--gpus-per-node", "2", "--", "train.py", "3"),
        cwd=train.parent,
    )
    # torchrun ends the other ranks and exits 1 whatever the failed rank's status; its summary names it.
    assert failed.returncode == 1, failed.stderr
    assert "exitcode  : 3" in failed.stderr


def test_run_dry_run_prints_the_exact_command(cpu_torch_world, train):
    res = _run(
        cpu_torch_world,
        cli_argv("run", "vcpu", "--gpus-per-node", "2", "--dry-run", "--", "train.py", "--lr", "0.1"),
        cwd=train.parent,
    )
    assert res.returncode == 0, res.stderr
    argv = shlex.split(res.stdout)
    python = str(cpu_torch_world.prefix / "bin" / "python")
    assert argv == [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert not _ranks(res.stdout)
    # create wrote the env's own copy of the payloads, which job scripts name.
    assert (cpu_torch_world.prefix / "envbuilder" / "payloads" / "validate.py").is_file()


def test_mpiexec_starts_an_executable_without_python(cpu_torch_world, tmp_path):
    res = _run(
        cpu_torch_world,
        cli_argv(
            "run",
            "vcpu",
            "--launcher",
            "mpiexec",
            "--gpus-per-node",
            "2",
            "--",
            "sh",
            "-c",
            'echo "pmi $PMI_RANK"',
        ),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split("\n")[:2]) == ["pmi 0", "pmi 1"]
    # MPI launchers pass the ranks' status on.
    failed = _run(
        cpu_torch_world,
        cli_argv("run", "vcpu", "--launcher", "mpiexec", "--gpus-per-node", "2", "--", "sh", "-c", "exit 3"),
        cwd=tmp_path,
    )
    assert failed.returncode == 3, failed.stderr


def test_a_program_like_an_option_is_refused(cpu_torch_world, tmp_path):
    res = _run(cpu_torch_world, cli_argv("run", "vcpu", "--", "--help"), cwd=tmp_path)
    assert res.returncode == 2 and "cannot start with '-'" in res.stderr


@pytest.mark.slurm
@pytest.mark.parametrize("outer", ["srun", "salloc"])
def test_run_inside_an_allocation(cpu_torch_world, slurm_cluster, train, outer):
    argv = [
        outer,
        "--nodes=1",
        "--ntasks=1",
        *cli_argv("run", "vcpu", "--launcher", "srun", "--", "train.py"),
    ]
    res = _run(cpu_torch_world, argv, cwd=train.parent, extra=slurm_cluster.env)
    assert res.returncode == 0, res.stderr
    assert [line.split(" omp=")[0] for line in _ranks(res.stdout)] == ["rank 0/1 sum=1"]


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
    assert _ranks(out.read_text()) == ["rank 0/2 sum=3 omp=1", "rank 1/2 sum=3 omp=1"]


@pytest.mark.slurm
def test_sbatch_submits_the_program_with_the_validated_launch(cpu_torch_world, slurm_cluster, train):
    argv = cli_argv(
        "sbatch", "vcpu", "--launcher", "srun", "--gpus-per-node", "2", "--json", "--", "train.py"
    )
    res = _run(cpu_torch_world, argv, cwd=train.parent, extra=slurm_cluster.env)
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
    assert [line.split(" omp=")[0] for line in _ranks(output.read_text())] == [
        "rank 0/2 sum=3",
        "rank 1/2 sum=3",
    ]


@pytest.mark.slurm
def test_sbatch_dry_run_and_refusal_inside_a_job(cpu_torch_world, slurm_cluster, train):
    dry = _run(
        cpu_torch_world,
        cli_argv("sbatch", "vcpu", "--gpus-per-node", "2", "--dry-run", "--", "train.py"),
        cwd=train.parent,
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("#!/bin/bash\n") and "export OMP_NUM_THREADS=$(( cpus > 2" in dry.stdout
    inside = _run(
        cpu_torch_world,
        ["srun", "--nodes=1", "--ntasks=1", *cli_argv("sbatch", "vcpu", "--", "train.py")],
        cwd=train.parent,
        extra=slurm_cluster.env,
    )
    assert inside.returncode == 2 and "second allocation" in inside.stderr, inside.stderr


def test_sbatch_on_a_pbs_site_submits_a_pbs_job(cpu_torch_world, train, tmp_path):
    # PBS cannot run here: the qsub/qstat stand-ins (tests/shims/pbs) run the job script as a one-node job would.
    # The env is the session's; its recipe, recorded again as "vpbs", names PBS as Polaris's does.
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (DATA / "validate-recipes" / "vcpu.toml").read_text().replace('name = "vcpu"', 'name = "vpbs"')
    (recipes / "vpbs.toml").write_text(
        text.replace('type = "slurm"\nbatch = "sbatch"', 'type = "pbs"\nbatch = "qsub"')
    )
    home = Path(cpu_torch_world.env["ENVBUILDER_HOME"])
    state.save(home, dataclasses.replace(state.load(home, "vcpu"), name="vpbs", recipe="vpbs"))
    spool = tmp_path / "spool"
    extra = {
        "ENVBUILDER_RECIPE_PATH": f"{DATA / 'validate-recipes'}:{recipes}",
        "PATH": f"{REPO / 'tests' / 'shims' / 'pbs'}:{cpu_torch_world.env['PATH']}",
        "PBS_SHIM_SPOOL": str(spool),
    }
    argv = cli_argv("sbatch", "vpbs", "--gpus-per-node", "2", "--json", "--", "train.py")
    res = _run(cpu_torch_world, argv, cwd=train.parent, extra=extra)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert data["job"].endswith(".pbs-shim")
    script = Path(data["script_path"]).read_text()
    assert "#PBS -l select=1\n" in script and "#SBATCH" not in script
    state_file = spool / f"{data['job']}.state"
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and not state_file.read_text().startswith("F"):
        time.sleep(0.5)
    assert state_file.read_text().strip() == "F 0", Path(data["output"]).read_text()
    assert [line.split(" omp=")[0] for line in _ranks(Path(data["output"]).read_text())] == [
        "rank 0/2 sum=3",
        "rank 1/2 sum=3",
    ]
    # Inside a PBS job (an interactive `qsub -I` shell sets the same variables), a job from there is refused.
    inside = {**extra, "PBS_JOBID": data["job"], "PBS_ENVIRONMENT": "PBS_INTERACTIVE", "NCPUS": "2"}
    refused = _run(
        cpu_torch_world, cli_argv("sbatch", "vpbs", "--", "train.py"), cwd=train.parent, extra=inside
    )
    assert refused.returncode == 2 and f"inside pbs job {data['job']}" in refused.stderr, refused.stderr


def test_a_gpu_env_on_a_login_node_is_sent_to_a_job(cpu_torch_world, train, tmp_path):
    # The session env recorded again under a recipe whose compute nodes have GPUs; this host has none and is in
    # no job, so its program cannot run here.
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (DATA / "validate-recipes" / "vcpu.toml").read_text().replace('name = "vcpu"', 'name = "vgpurun"')
    text += '\n[compute]\ngpus_per_node = 2\ngpu = "NVIDIA H100"\ncompute_capability = "9.0"\n'
    (recipes / "vgpurun.toml").write_text(text)
    home = Path(cpu_torch_world.env["ENVBUILDER_HOME"])
    record = state.save(home, dataclasses.replace(state.load(home, "vcpu"), name="vgpurun", recipe="vgpurun"))
    extra = {"ENVBUILDER_RECIPE_PATH": f"{DATA / 'validate-recipes'}:{recipes}"}
    try:
        res = _run(
            cpu_torch_world, cli_argv("run", "vgpurun", "--", "train.py"), cwd=train.parent, extra=extra
        )
    finally:
        record.unlink()  # the session env is vcpu's alone again
    assert res.returncode == 2, res.stderr
    assert "has no GPU and is in no job" in res.stderr and "envbuilder sbatch vgpurun" in res.stderr
    assert not _ranks(res.stdout)
