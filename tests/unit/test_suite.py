"""The validation run resolver (pure): checks, device, where a run can go, payload arguments, the launch."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
from helpers import PLAN_ENV, REPO, load_facts

from envbuilder import plan
from envbuilder.core import checks, schedulers
from envbuilder.core.errors import RecipeError, UsageError
from envbuilder.plan import batch, suite
from envbuilder.plan.activation import Activation
from envbuilder.plan.target import target_facts
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.validate import runner

CATALOG = Catalog.from_env({})


def test_checks_default_to_the_recipe_and_import_comes_first():
    recipe = loader.load("vista-venv-cu124", CATALOG)
    assert suite.checks_for(recipe, None) == tuple(recipe.get("validation.checks"))
    assert suite.checks_for(recipe, ["nccl"]) == ("import", "nccl")


def test_unknown_check_names_the_known_ones():
    with pytest.raises(UsageError, match="unknown check") as err:
        suite.checks_for(loader.load("local", CATALOG), ["ncl"])
    assert "nccl" in (err.value.hint or "")


def test_the_payload_runs_exactly_the_registered_checks(monkeypatch):
    # The payload runs inside the env and imports nothing from envbuilder: its table is Suite.check_<name> (its
    # own and the SiteChecks mixed in).
    monkeypatch.syspath_prepend(str(REPO / "envbuilder" / "payloads"))
    payload = importlib.import_module("envbuilder_checks")
    methods = {name.removeprefix("check_") for name in dir(payload.Suite) if name.startswith("check_")}
    assert methods == set(checks.NAMES)
    assert {*payload.GPU_CHECKS, *payload.DIST_CHECKS} <= methods


def test_device_and_where():
    gpu_host, cpu_host = load_facts("h100"), load_facts("cpu-only")
    assert suite.device_for(gpu_host, cpu=False) == "cuda"
    assert suite.device_for(gpu_host, cpu=True) == "cpu"
    assert suite.device_for(cpu_host, cpu=False) == "cpu"
    assert suite.where("cuda", gpu_host, gpu_host, submit=False) is None
    assert suite.where("cpu", cpu_host, gpu_host, submit=False) is None
    assert "has no GPU" in suite.where("cuda", cpu_host, gpu_host, submit=False)
    assert suite.where("cuda", gpu_host, gpu_host, submit=True)


def test_payload_args_for_a_run():
    p = suite.Payload(("import", "nccl"), "cpu", out="/r/ranks", fs=("/scratch/u1",), timeout=30)
    assert p.args() == [
        "--checks",
        "import,nccl",
        "--device",
        "cpu",
        "--out",
        "/r/ranks",
        "--timeout",
        "30",
        "--sweep-max",
        str(16 << 20),
        "--fs=/scratch/u1",
    ]
    assert suite.Payload(("import",), "cuda", out="/r").args()[-1] == str(1 << 30)


def test_a_file_system_directory_that_starts_with_a_dash_stays_a_value():
    """validation.filesystems reaches the payload's own argparse: `--fs DIR` would read a DIR of "-x" as an
    option; one word keeps it the value (the payload's parser is the real one, run here)."""
    from envbuilder.payloads import validate as payload_validate  # its checks module beside it, on first use

    argv = suite.Payload(("import", "filesystem"), "cpu", fs=("-x", "/scratch/u1")).args()
    assert payload_validate._parser().parse_args(argv).fs == ["-x", "/scratch/u1"]


def _launch(name, facts_name, payload, workdir=None):
    recipe = loader.load(name, CATALOG)
    target = target_facts(recipe, load_facts(facts_name), [], [])
    activate = Activation()
    return suite.launch(
        recipe,
        target,
        suite.LaunchedEnv("/e", "/e/bin/python", activate),
        payload,
        package_dir="/e/run",
        warnings=[],
        workdir=workdir,
    )


def test_polaris_ranks_each_expect_one_gpu_behind_the_affinity_wrapper():
    run = _launch(
        "polaris-overlay-conda",
        "a100-sxm4-x4",
        suite.Payload(("import", "gpu"), "cuda", out="/e/run/ranks"),
        workdir="/e/run",
    )
    assert run.launcher == "mpiexec" and run.world == 4
    argv = list(run.argv)
    wrapper = next(i for i, a in enumerate(argv) if a.endswith("gpu_affinity.sh"))
    assert argv[wrapper + 1 : wrapper + 3] == ["reverse-local-rank", "/e/bin/python"]
    assert argv[argv.index("--expect-gpus") + 1] == "1"
    assert run.script is not None and "cd /e/run" in run.script and "#PBS -l select=1" in run.script


def test_cpu_run_of_a_gpu_recipe_asks_for_no_gpus_in_its_batch_job():
    run = _launch("zurada-conda-cu126", "cpu-only", suite.Payload(("import", "ddp"), "cpu", out="/e/r"))
    assert run.nproc_per_node == 2
    assert "--gpus-per-node" not in (run.script or "")
    assert "--expect-gpus" not in run.argv


def test_filesystems_from_the_recipe_or_scratch():
    recipe = loader.load("zurada-conda-cu126", CATALOG)
    assert suite.filesystems(recipe, PLAN_ENV, plan.expand) == ("/scratch/u1",)


def test_filesystems_named_by_the_recipe_must_exist(tmp_path):
    (tmp_path / "fsbad.toml").write_text(
        'schema_version = 1\nextends = "zurada-conda-cu126"\n[recipe]\nname = "fsbad"\n'
        'description = "x"\n[validation]\nfilesystems = ["wrok"]\n'
    )
    recipe = loader.load("fsbad", Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)}))
    with pytest.raises(RecipeError, match="not a \\[filesystems\\] entry") as err:
        suite.filesystems(recipe, PLAN_ENV, plan.expand)
    assert err.value.hint == "did you mean 'work'?"
    ok = loader.load("zurada-conda-cu126", CATALOG)
    assert suite.filesystems(ok, PLAN_ENV, plan.expand) == ("/scratch/u1",)


@pytest.mark.parametrize(
    ("env", "where"),
    [
        ({}, schedulers.Where()),
        # An srun --pty shell: a step of job 7 holding 32 CPUs here, and no GPU (a step that holds GRES GPUs is
        # told how many).
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "0",
                "SLURM_CPUS_ON_NODE": "32",
                "SLURM_JOB_NUM_NODES": "2",
            },
            schedulers.Where("slurm", "7", in_step=True, nodes=2, cpus_per_node=32, gpus=0),
        ),
        # An salloc shell on the login node knows only the allocation's CPU list.
        (
            {"SLURM_JOB_ID": "8", "SLURM_JOB_CPUS_PER_NODE": "16(x2)", "SLURM_NNODES": "2"},
            schedulers.Where("slurm", "8", nodes=2, cpus_per_node=16),
        ),
        (
            {"PBS_JOBID": "9.pbs", "NCPUS": "64", "PBS_QUEUE": "debug", "PBS_ENVIRONMENT": "PBS_INTERACTIVE"},
            schedulers.Where("pbs", "9.pbs", cpus_per_node=64, partition="debug"),
        ),
        ({"SLURM_JOB_ID": "", "SLURM_CPUS_ON_NODE": "x"}, schedulers.Where()),
    ],
)
def test_where_a_command_runs(env, where):
    assert schedulers.locate(env) == where


@pytest.mark.parametrize(
    ("env", "cpus"),
    [
        # An srun --pty step that asked for no CPUs: Slurm says the job's 32 here, the step may run on one.
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_CPUS_ON_NODE": "32"}, 1),
        # A batch script: the same cap (its batch step is confined to the job's CPUs on the node).
        ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "32"}, 1),
        # An salloc shell runs on the login node: its own CPUs say nothing of the job's.
        ({"SLURM_JOB_ID": "8", "SLURM_JOB_CPUS_PER_NODE": "16(x2)"}, 16),
        ({"PBS_JOBID": "9.pbs", "NCPUS": "64"}, 1),
    ],
)
def test_a_launch_on_a_jobs_node_has_the_cpus_this_process_may_run_on(env, cpus):
    assert schedulers.locate(env, usable_cpus=1).cpus_per_node == cpus
    assert schedulers.locate(env, usable_cpus=1000).cpus_per_node == schedulers.locate(env).cpus_per_node


def test_a_pbs_jobs_nodes_are_counted_from_its_nodefile(tmp_path):
    env = {"PBS_JOBID": "9.pbs", "NCPUS": "64"}
    # One line per rank slot: two slots on n1, one on n2.
    assert schedulers.locate(env, nodefile="n1\nn1\nn2\n").nodes == 2
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x3001\nx3001\nx3002\nx3003\n")
    assert runner.locate({**env, "PBS_NODEFILE": str(nodefile)}).nodes == 3
    assert runner.locate({**env, "PBS_NODEFILE": str(tmp_path / "gone")}).nodes is None  # unknown, as before
    polaris = loader.load("polaris-overlay-conda", CATALOG)
    target = target_facts(polaris, load_facts("a100-sxm4-x4"), [], [])
    with pytest.raises(UsageError, match=r"3 nodes asked for inside job 9\.pbs, which holds 2"):
        suite.shape_for(
            polaris,
            target,
            suite.LaunchRequest(nodes=3, here=schedulers.locate(env, nodefile="n1\nn2\n")),
            "cuda",
            [],
        )


def _zurada(here, **request):
    recipe = loader.load("zurada-conda-cu128", CATALOG)
    target = target_facts(recipe, load_facts("h100"), [], [])
    return suite.launch(
        recipe,
        target,
        suite.LaunchedEnv("/e", "/e/bin/python", Activation()),
        suite.Payload(("import",), "cuda"),
        package_dir="/e/envbuilder",
        warnings=[],
        request=suite.LaunchRequest(here=here, **request),
    )


def test_srun_inside_a_step_overlaps_it_with_the_jobs_cpus():
    argv = list(_zurada(schedulers.Where("slurm", "7", in_step=True, nodes=1, cpus_per_node=32)).argv)
    assert argv[:7] == [
        "srun",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--ntasks=1",
        "--cpus-per-task",
        "32",
        "--overlap",
    ]


def test_srun_in_an_allocation_takes_its_cpus_and_a_job_script_reads_them():
    argv = list(_zurada(schedulers.Where("slurm", "8", nodes=1, cpus_per_node=16)).argv)
    assert argv[4:6] == ["--cpus-per-task", "16"] and "--overlap" not in argv
    script = _zurada(None).script
    assert 'srun --nodes=1 --ntasks-per-node=1 --ntasks=1 --cpus-per-task "${SLURM_CPUS_ON_NODE}"' in script
    outside = list(_zurada(schedulers.Where()).argv)  # srun on a login node makes its own allocation
    assert "--cpus-per-task" not in outside and "--overlap" not in outside


def test_a_launch_never_asks_more_nodes_than_the_job_holds():
    with pytest.raises(UsageError, match="2 nodes asked for inside job 8, which holds 1"):
        _zurada(schedulers.Where("slurm", "8", nodes=1, cpus_per_node=16), nodes=2)


def test_the_partition_sizes_the_launch():
    one = _zurada(None, partition="gpu1h100")
    assert "--nproc-per-node=1" in one.argv and "#SBATCH --gpus-per-node=1\n" in one.script
    assert "#SBATCH --partition=gpu1h100\n" in one.script


def test_a_job_script_sources_the_module_init_where_its_shell_has_no_module():
    """A job script is a bash that reads no profile: before its `module` lines it sources the module system's
    bash init unless the job inherited bash's exported `module` (set -u off around it); none without modules."""
    act = Activation(modules=("python3/3.9.2",), module_init="/opt/apps/lmod/lmod/init")
    text = batch.script(scheduler="slurm", directives=[], activate=act, launch=["x"], workdir="/w")
    lines = text.splitlines()
    at = lines.index("module load python3/3.9.2")
    assert lines[at - 1] == (
        "if ! type module >/dev/null 2>&1 && [ -f /opt/apps/lmod/lmod/init/bash ]; then set +u; "
        ". /opt/apps/lmod/lmod/init/bash; set -u; fi"
    )
    bare = replace(act, modules=())
    text = batch.script(scheduler="slurm", directives=[], activate=bare, launch=["x"], workdir="/w")
    assert "init/bash" not in text


@pytest.mark.parametrize(("own_python", "var"), [(True, "VIRTUAL_ENV"), (False, "PYTHONUSERBASE")])
def test_a_job_script_enters_the_env_so_python_is_the_envs(own_python, var):
    """As `envbuilder run` does: the env's bin first on PATH (a program started as `python` is the env's, not the
    module's), after the modules; VIRTUAL_ENV, or PYTHONUSERBASE for an env over the site's python."""
    act = Activation(modules=("python3/3.9.2",))
    env = batch.JobEnv("/scratch/u/my env", own_python)
    text = batch.script(scheduler="slurm", directives=[], activate=act, launch=["python", "t.py"],
                        workdir="/w", env=env)  # fmt: skip
    lines = text.splitlines()
    at = lines.index(f"export {var}='/scratch/u/my env'")
    assert lines[at + 1] == """export PATH='/scratch/u/my env/bin'"${PATH:+:$PATH}\""""
    assert lines.index("module load python3/3.9.2") < at < lines.index("python t.py")
