"""`envbuilder run` and `envbuilder sbatch` with the tests' real Slurm: a small DDP program of the tests' own
(helpers.TRAIN: gloo on CPU, the session's torch env) under the recipe's launch rules inside an ``srun`` step,
inside ``salloc``, inside a batch job and as a submitted job."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from helpers import DATA, REPO, cli_argv, cli_env, rank_lines, run_in
from slurm import sbatch_wait

from envbuilder.system import state

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


#: Each rank says which CPUs it may run on and its OpenMP threads.
WHERE_RANKS_RUN = """import json, os
print("cpus " + json.dumps({"rank": int(os.environ["RANK"]), "cpus": sorted(os.sched_getaffinity(0)),
                            "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
"""


@pytest.mark.slurm
def test_ranks_in_the_interactive_step_run_on_the_cpus_the_launch_asked_for(
    cpu_torch_world, slurm_confined, tmp_path
):
    # Zurada as sites run Slurm: the interactive step of the recipe's plan, whose ranks may run only on the CPUs
    # the step was allocated. Asking for none, it got one CPU, and both ranks (started by validate and run inside
    # it) shared that core.
    cores = slurm_confined.cpus
    if cores < 2:
        pytest.skip("one CPU here: two ranks cannot be told apart from two ranks sharing a core")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    zurada = (REPO / "recipes" / "zurada" / "site.toml").read_text()
    template = next(line for line in zurada.splitlines() if line.startswith("interactive = "))
    text = (DATA / "validate-recipes" / "vcpu.toml").read_text().replace('name = "vcpu"', 'name = "vzurada"')
    text = re.sub(r"(?m)^interactive = .*$", lambda _: template, text)
    text = text.replace('default = "torchrun"', 'default = "srun"')
    text = text.replace('time = "00:10:00"', 'time = "00:10:00"\nexclusive_nodes = false')
    (recipes / "vzurada.toml").write_text(text + f"\n[compute]\ncores_per_node = {cores}\n")
    home = Path(cpu_torch_world.env["ENVBUILDER_HOME"])
    record = state.save(home, dataclasses.replace(state.load(home, "vcpu"), name="vzurada", recipe="vzurada"))
    extra = {"ENVBUILDER_RECIPE_PATH": f"{DATA / 'validate-recipes'}:{recipes}", **slurm_confined.env}
    program = tmp_path / "where.py"
    program.write_text(WHERE_RANKS_RUN)
    try:
        planned = run_in(cpu_torch_world, cli_argv("plan", "vzurada", "--json"), cwd=tmp_path, extra=extra)
        assert planned.returncode == 0, planned.stderr
        step = json.loads(planned.stdout)["data"]["interactive_command"]
        assert step[-3:] == ["--pty", "/bin/bash", "-i"]
        # The step as the plan gives it (a shell started by hand in it runs the same command).
        inside = cli_argv("run", "vzurada", "--gpus-per-node", "2", "--", program.name)
        res = run_in(cpu_torch_world, [*step[:-3], *inside], cwd=tmp_path, extra=extra)
    finally:
        record.unlink()  # the session env is vcpu's alone again
    assert res.returncode == 0, res.stderr
    ranks = sorted((json.loads(found) for found in re.findall(r"cpus (\{[^}]*\})", res.stdout)),
                   key=lambda r: r["rank"])  # fmt: skip
    assert [r["rank"] for r in ranks] == [0, 1], res.stdout
    # The step holds the node's cores; the two ranks together may run on all of them, each on its share.
    assert len({cpu for r in ranks for cpu in r["cpus"]}) == cores, (slurm_confined.confinement, ranks)
    assert [r["omp"] for r in ranks] == [str(cores // 2)] * 2
