"""`envbuilder run` and `envbuilder sbatch` outside Slurm: a small DDP program of the tests' own (helpers.TRAIN: gloo on
CPU, the session's torch env) under the recipe's launch rules here, through mpiexec, and as a job of the PBS
stand-in; refusals. Inside Slurm (a step, salloc, a batch job, a submitted job) in test_run_slurm.py, apart so that
xdist can run the two files on different workers."""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path

import pytest
from helpers import DATA, REPO, cli_argv, rank_lines, run_in

from envbuilder.system import state

pytestmark = [pytest.mark.integration]

BOUND_S = 240


def test_run_starts_one_world_and_passes_the_exit_status_on(cpu_torch_world, train):
    res = run_in(
        cpu_torch_world, cli_argv("run", "vcpu", "--gpus-per-node", "2", "--", "train.py"), cwd=train.parent
    )
    assert res.returncode == 0, res.stderr
    # One world of two (not two worlds of one), threads = this machine's CPUs divided among the two ranks.
    assert [line.split(" omp=")[0] for line in rank_lines(res.stdout)] == ["rank 0/2 sum=3", "rank 1/2 sum=3"]
    failed = run_in(
        cpu_torch_world,
        cli_argv("run", "vcpu", "--gpus-per-node", "2", "--", "train.py", "3"),
        cwd=train.parent,
    )
    # torchrun ends the other ranks and exits 1 whatever the failed rank's status; its summary names it.
    assert failed.returncode == 1, failed.stderr
    assert "exitcode  : 3" in failed.stderr


def test_run_dry_run_prints_the_exact_command(cpu_torch_world, train):
    res = run_in(
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
        "--local-addr=127.0.0.1",
        "--nnodes=1",
        "--nproc-per-node=2",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert not rank_lines(res.stdout)
    # create wrote the env's own copy of the payloads, which job scripts name.
    assert (cpu_torch_world.prefix / "envbuilder" / "payloads" / "validate.py").is_file()


def test_mpiexec_starts_an_executable_without_python(cpu_torch_world, tmp_path):
    res = run_in(
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
    failed = run_in(
        cpu_torch_world,
        cli_argv("run", "vcpu", "--launcher", "mpiexec", "--gpus-per-node", "2", "--", "sh", "-c", "exit 3"),
        cwd=tmp_path,
    )
    assert failed.returncode == 3, failed.stderr


def test_a_program_like_an_option_is_refused(cpu_torch_world, tmp_path):
    res = run_in(cpu_torch_world, cli_argv("run", "vcpu", "--", "--help"), cwd=tmp_path)
    assert res.returncode == 2 and "cannot start with '-'" in res.stderr


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
    res = run_in(cpu_torch_world, argv, cwd=train.parent, extra=extra)
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
    assert [line.split(" omp=")[0] for line in rank_lines(Path(data["output"]).read_text())] == [
        "rank 0/2 sum=3",
        "rank 1/2 sum=3",
    ]
    # Inside a PBS job (an interactive `qsub -I` shell sets the same variables), a job from there is refused.
    inside = {**extra, "PBS_JOBID": data["job"], "PBS_ENVIRONMENT": "PBS_INTERACTIVE", "NCPUS": "2"}
    refused = run_in(
        cpu_torch_world, cli_argv("sbatch", "vpbs", "--", "train.py"), cwd=train.parent, extra=inside
    )
    assert refused.returncode == 2 and f"inside pbs job {data['job']}" in refused.stderr, refused.stderr


def test_sbatch_dry_run_refuses_a_recipe_without_scheduler_as_sbatch_does(cpu_torch_world, train, tmp_path):
    # The session env recorded again under a recipe that names no scheduler (a workstation's, as `local`): there
    # is no job to submit, so a dry run has no script to show and says so as the real submission does.
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (DATA / "validate-recipes" / "vcpu.toml").read_text().replace('name = "vcpu"', 'name = "vnosched"')
    start, end = text.index("[scheduler]"), text.index("[env]")
    (recipes / "vnosched.toml").write_text(text[:start] + text[end:])
    home = Path(cpu_torch_world.env["ENVBUILDER_HOME"])
    record = state.save(
        home, dataclasses.replace(state.load(home, "vcpu"), name="vnosched", recipe="vnosched")
    )
    extra = {"ENVBUILDER_RECIPE_PATH": f"{DATA / 'validate-recipes'}:{recipes}"}
    jobs = cpu_torch_world.prefix / "envbuilder" / "jobs"
    before = sorted(jobs.glob("*"))
    try:
        real, dry = (
            run_in(
                cpu_torch_world,
                cli_argv("sbatch", "vnosched", *flags, "--", "train.py"),
                cwd=train.parent,
                extra=extra,
            )
            for flags in ((), ("--dry-run",))
        )
    finally:
        record.unlink()  # the session env is vcpu's alone again
    assert real.returncode == 2 and "names no scheduler, so there is nothing to submit to" in real.stderr
    assert (dry.returncode, dry.stdout, dry.stderr) == (real.returncode, real.stdout, real.stderr)
    assert sorted(jobs.glob("*")) == before  # neither wrote a job directory


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
        res = run_in(
            cpu_torch_world, cli_argv("run", "vgpurun", "--", "train.py"), cwd=train.parent, extra=extra
        )
    finally:
        record.unlink()  # the session env is vcpu's alone again
    assert res.returncode == 2, res.stderr
    assert "has no GPU and is in no job" in res.stderr and "envbuilder sbatch vgpurun" in res.stderr
    assert not rank_lines(res.stdout)
