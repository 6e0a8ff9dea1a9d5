"""Launchers are pure argv builders: exact argv per launcher, and shell rendering that quotes everything."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from envbuilder.core import launchers, modulelines, schedulers
from envbuilder.core.errors import RecipeError, UsageError
from envbuilder.core.launchers import LaunchSpec, ShellVar
from envbuilder.plan import batch
from envbuilder.plan.activation import Activation

PY = "/env/bin/python"
SCRIPT = ("/pkg/payloads/validate.py", "--checks", "import")


def spec(**kw):
    base = {"python": PY, "script": SCRIPT, "torchrun": (PY, "-m", "torch.distributed.run")}
    return LaunchSpec(**{**base, **kw})


def test_local():
    assert launchers.build("local", spec()) == [PY, *SCRIPT]


def test_local_refuses_several_processes():
    with pytest.raises(UsageError):
        launchers.build("local", spec(nproc_per_node=2))


def test_torchrun_single_node_is_standalone():
    assert launchers.build("torchrun", spec(nproc_per_node=4)) == [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--local-addr=127.0.0.1",
        "--nnodes=1",
        "--nproc-per-node=4",
        *SCRIPT,
    ]


def test_torchrun_alone_cannot_span_nodes():
    with pytest.raises(UsageError, match="one agent per node"):
        launchers.build("torchrun", spec(nodes=2))


def test_srun_runs_exactly_one_agent_per_node():
    argv = launchers.build(
        "srun", spec(nodes=2, nproc_per_node=4, port=29400, rdzv_id=ShellVar("SLURM_JOB_ID"))
    )
    assert [str(a) for a in argv] == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--ntasks=2",
        PY,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint",
        "$MASTER_ADDR:29400",
        "--rdzv-id",
        "$SLURM_JOB_ID",
        *SCRIPT,
    ]


@pytest.mark.parametrize("nproc", [1, 2, 4, 8])
def test_srun_never_starts_more_than_one_task_per_node(nproc):
    argv = [str(a) for a in launchers.build("srun", spec(nodes=3, nproc_per_node=nproc))]
    assert "--ntasks-per-node=1" in argv
    assert not any(a.startswith("--ntasks-per-node=") and a != "--ntasks-per-node=1" for a in argv)
    assert argv.count("--standalone") == 0  # several nodes share one rendezvous


def test_srun_with_mpi_plugin():
    argv = launchers.build("srun", spec(mpi="pmi2"))
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks-per-node=1", "--ntasks=1", "--mpi=pmi2"]


def test_ibrun_starts_every_rank():
    assert launchers.build("ibrun", spec(nodes=2, nproc_per_node=1)) == ["ibrun", "-n", "2", PY, *SCRIPT]


def test_mpiexec_pals_with_binding_and_affinity_wrapper():
    argv = launchers.build(
        "mpiexec",
        spec(
            nodes=2,
            nproc_per_node=4,
            cpu_bind="depth",
            depth=16,
            affinity_wrapper=("/pkg/gpu_affinity.sh", "reverse-local-rank"),
        ),
    )
    assert argv == [
        "mpiexec",
        "-n",
        "8",
        "--ppn",
        "4",
        "--depth",
        "16",
        "--cpu-bind",
        "depth",
        "/pkg/gpu_affinity.sh",
        "reverse-local-rank",
        PY,
        *SCRIPT,
    ]


def test_mpirun_maps_ranks_per_node():
    assert launchers.build("mpirun", spec(nodes=2, nproc_per_node=4)) == [
        "mpirun",
        "-n",
        "8",
        "--map-by",
        "ppr:4:node",
        "--bind-to",
        "none",
        PY,
        *SCRIPT,
    ]


def test_unknown_launcher():
    with pytest.raises(UsageError, match="unknown launcher"):
        launchers.build("aprun", spec())


def test_render_quotes_values_and_expands_only_shell_vars():
    argv = ["/path with space/python", "it's", "$HOME", ShellVar("MASTER_ADDR"), "a;rm -rf /"]
    text = launchers.render(argv)
    assert text == "'/path with space/python' 'it'\"'\"'s' '$HOME' \"${MASTER_ADDR}\" 'a;rm -rf /'"
    out = subprocess.run(
        ["bash", "-c", f"MASTER_ADDR=n1; printf '%s\\n' {text}"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["/path with space/python", "it's", "$HOME", "n1", "a;rm -rf /"]


def test_render_joined_endpoint():
    argv = launchers.torchrun_argv(spec(nodes=2, nproc_per_node=1, port=29500))
    text = launchers.render(argv)
    assert '--rdzv-endpoint "${MASTER_ADDR}":29500' in text


def test_a_job_meets_at_its_own_port_unless_the_recipe_names_one():
    """Two multi-node jobs whose first node is the same must not both listen at one port (two CI jobs did and
    one failed its rendezvous): the endpoint is $MASTER_PORT, which the script derives from the job's number;
    a recipe's port is kept as it is (a site that opens one port)."""
    argv = launchers.torchrun_argv(spec(nodes=2, nproc_per_node=1))
    endpoint = argv[argv.index("--rdzv-endpoint") + 1]
    assert str(endpoint) == "$MASTER_ADDR:$MASTER_PORT"
    assert '--rdzv-endpoint "${MASTER_ADDR}":"${MASTER_PORT}"' in launchers.render(argv)
    assert launchers.bind([endpoint], {"MASTER_ADDR": "n1", "MASTER_PORT": "15123"}) == ["n1:15123"]
    with pytest.raises(UsageError, match="MASTER_PORT"):
        launchers.bind([endpoint], {"MASTER_ADDR": "n1"})
    shown = launchers.display(launchers.plain(argv))
    out = subprocess.run(
        ["bash", "-c", f"MASTER_ADDR=n1 MASTER_PORT=15123; printf '%s\\n' {shown}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "n1:15123" in out
    fixed = launchers.torchrun_argv(spec(nodes=2, nproc_per_node=1, port=29400))
    assert str(fixed[fixed.index("--rdzv-endpoint") + 1]) == "$MASTER_ADDR:29400"


@pytest.mark.parametrize(
    ("name", "job_var", "job_id", "number"),
    [("slurm", "SLURM_JOB_ID", "1234567", 1234567), ("pbs", "PBS_JOBID", "4242.polaris-pbs-01", 4242)],
)
def test_the_job_script_and_the_runner_agree_on_the_jobs_port(name, job_var, job_id, number):
    """The batch script's shell arithmetic and the runner's Python give one port for one job, below the
    ephemeral range, different for the next job; a recipe's port is exported as it is."""
    adapter = schedulers.get(name)
    lines = "\n".join(adapter.port_lines(None))
    printed = subprocess.run(
        ["bash", "-c", f'set -euo pipefail\n{lines}\necho "$MASTER_PORT"'],
        env={"PATH": "/usr/bin:/bin", job_var: job_id},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert int(printed) == adapter.job_port({job_var: job_id}) == launchers.job_port(number)
    assert launchers.PORT_BASE <= int(printed) < 32768
    assert adapter.job_port({job_var: str(number + 1)}) != int(printed)
    assert schedulers.job_port({job_var: job_id}) == int(printed)
    assert schedulers.job_port({}) == 29500  # no job: torch's own default
    assert adapter.port_lines(29400) == ["export MASTER_PORT=29400"]


def test_shellvar_rejects_non_names():
    with pytest.raises(ValueError):
        ShellVar("A; rm")


# --- batch helpers --------------------------------------------------------------------------------------------

SLURM = schedulers.SCHEDULERS["slurm"]

JOB = schedulers.JobShape(
    nodes=2,
    tasks_per_node=1,
    gpus_per_node=4,
    cpus_per_task=32,
    partition="gpu",
    time="01:00:00",
    account=None,
    name="t",
)


def test_interactive_template_fills_and_drops_unknown_options():
    argv = batch.interactive_argv(
        ["qsub", "-I", "-l", "select={nodes}", "-q", "{partition}", "-A", "{account}"], JOB
    )
    assert argv == ["qsub", "-I", "-l", "select=2", "-q", "gpu"]


def test_interactive_template_asks_for_the_cpus_per_task_or_leaves_the_option_out():
    template = ["srun", "--ntasks-per-node=1", "--cpus-per-task={cpus}", "-c", "{cpus}", "--pty", "bash"]
    assert batch.interactive_argv(template, JOB) == [
        "srun",
        "--ntasks-per-node=1",
        "--cpus-per-task=32",
        "-c",
        "32",
        "--pty",
        "bash",
    ]
    whole_nodes = dataclasses.replace(JOB, cpus_per_task=None, partition=None)
    template = ["srun", "--partition={partition}", "--cpus-per-task={cpus}", "-c", "{cpus}", "--pty", "bash"]
    assert batch.interactive_argv(template, whole_nodes) == ["srun", "--pty", "bash"]


def test_interactive_template_minutes():
    assert batch.interactive_argv(["idev", "-m", "{minutes}"], JOB) == ["idev", "-m", "60"]


def test_interactive_template_unknown_placeholder():
    with pytest.raises(RecipeError, match="unknown placeholder"):
        batch.interactive_argv(["idev", "-q", "{queue}"], JOB)


@pytest.mark.parametrize(
    ("style", "flag"),
    [("gpus-per-node", "--gpus-per-node=4"), ("gres", "--gres=gpu:4"), ("gpus", "--gpus=8")],
)
def test_slurm_gpu_request_styles(style, flag):
    assert flag in SLURM.directives(JOB, style, [])


def test_slurm_gpu_request_none_emits_no_gpu_flag():
    flags = SLURM.directives(JOB, "none", [])
    assert not any("gpu" in f and not f.startswith("--partition") for f in flags)


def test_forbidden_flag_is_refused():
    with pytest.raises(RecipeError, match="--gres"):
        batch.check_dialect(SLURM.directives(JOB, "gres", []), ["--gres"], [], "site.toml")


def test_allowed_flags_whitelist():
    directives = SLURM.directives(JOB, "none", [])
    allowed = [
        "--job-name",
        "--nodes",
        "--ntasks",
        "--ntasks-per-node",
        "--time",
        "--partition",
        "--cpus-per-task",
    ]
    batch.check_dialect(directives, [], allowed, "site.toml")
    with pytest.raises(RecipeError, match="--cpus-per-task, which is not in this site's allowed flags"):
        batch.check_dialect(directives, [], allowed[:-1], "site.toml")


def test_an_output_path_is_kept_from_slurms_patterns_and_the_job_id_put_in():
    """Slurm expands '%' patterns anywhere in --output: a directory's own '%' is doubled, %j (envbuilder's
    default name) becomes the job id where the output is reported; qsub's -o expands nothing but reads
    HOST:PATH."""
    slurm, pbs = SLURM, schedulers.SCHEDULERS["pbs"]
    given = slurm.output_literal("/w/100%x done") + "/envbuilder-e-" + slurm.output_job_id + ".out"
    assert given == "/w/100%%x done/envbuilder-e-%j.out"
    assert slurm.output_of(given, "42") == "/w/100%x done/envbuilder-e-42.out"
    assert slurm.output_of("/w/%x-%A-%j.out", "42") == "/w/%x-42-42.out"  # the rest stay as written
    assert (pbs.output_job_id, pbs.output_literal("/w/100%x"), pbs.output_of("/w/a%j", "7.pbs")) == (
        "",
        "/w/100%x",
        "/w/a%j",
    )
    assert pbs.output_problem("/w/a:b") and pbs.output_problem("/w/ab") is None
    assert slurm.output_problem("/w/a:b") is None


def test_scheduler_adapters_build_exact_argv_and_read_what_the_commands_print():
    slurm, pbs = SLURM, schedulers.SCHEDULERS["pbs"]
    assert slurm.submit("/r/job.sh", "/r/job.out") == [
        "sbatch",
        "--parsable",
        "--output=/r/job.out",
        "/r/job.sh",
    ]
    assert slurm.job_id("42;cluster\n") == "42"
    assert slurm.state_query("42") == ["squeue", "-h", "-j", "42", "-o", "%T %r"]
    assert (slurm.state(0, "RUNNING None\n"), slurm.state(0, ""), slurm.state(1, "RUNNING")) == (
        "RUNNING",
        None,
        None,
    )
    assert slurm.state(0, "PENDING Priority\n") == "PENDING, Priority"
    # Reasons that clear by themselves are waited out; those that never do are named.
    assert [
        slurm.never_starts(f"PENDING {r}\n") for r in ("Priority", "Resources", "ReqNodeNotAvail,_Un")
    ] == [
        None,
        None,
        None,
    ]
    assert slurm.never_starts("PENDING JobHeldAdmin\n") == (
        "JobHeldAdmin: the job is held, and waits for `scontrol release`"
    )
    assert "partition's" in (slurm.never_starts("PENDING PartitionTimeLimit\n") or "")
    assert slurm.never_starts("RUNNING None\n") is None and pbs.never_starts("anything") is None
    assert slurm.exit_query("42") == ["scontrol", "show", "job", "42"]
    assert slurm.exit_code("JobId=42 JobState=FAILED ExitCode=3:0 Reason=NonZeroExitCode") == 3
    assert slurm.cancel("42") == ["scancel", "42"]
    assert pbs.submit("/r/job.sh", "/r/job.out") == ["qsub", "-o", "/r/job.out", "-j", "oe", "/r/job.sh"]
    assert pbs.job_id("42.pbs01\n") == "42.pbs01"
    table = "Job id  Name  User  Time Use S Queue\n------\n42.pbs01  envb  u1  0  R  debug\n"
    assert (pbs.state(0, table), pbs.state(0, ""), pbs.state(153, "")) == ("R", "Q", None)
    assert pbs.exit_query("42") is None
    assert pbs.cancel("42") == ["qdel", "42"]


def test_launchers_and_schedulers_name_each_other():
    for launcher in launchers.LAUNCHERS.values():
        assert launcher.scheduler in (None, *schedulers.SCHEDULERS)
    for adapter in schedulers.SCHEDULERS.values():
        assert not launchers.get(adapter.node_launcher).one_node


def test_display_quotes_for_pasting():
    shown = launchers.display(
        ["srun", "/path with space/python", "--rdzv-endpoint", "$MASTER_ADDR:29500", "$SLURM_JOB_ID"]
    )
    assert (
        shown == 'srun \'/path with space/python\' --rdzv-endpoint "${MASTER_ADDR}":29500 "${SLURM_JOB_ID}"'
    )


def test_script_quotes_recipe_values(tmp_path):
    text = batch.script(
        scheduler="slurm",
        directives=["--nodes=1"],
        activate=Activation(
            module_use=("/soft/module files",),
            modules=("conda/2025-09-25",),
            env={"NCCL_NET": "AWS Libfabric", "X": "$(touch pwned)"},
        ),
        launch=["echo", "done"],
        workdir=str(tmp_path / "w d"),
    )
    assert "module load conda/2025-09-25" in text
    assert "export X='$(touch pwned)'" in text
    # Run it with a module function that records its arguments: nothing is executed from the values.
    runner = tmp_path / "run.sh"
    runner.write_text('module() { printf "<%s>" "$@" >> "$LOG"; echo >> "$LOG"; }\n' + text)
    log = tmp_path / "log"
    res = subprocess.run(
        ["bash", str(runner)],
        cwd=tmp_path,
        env={"LOG": str(log), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.strip() == "done"
    assert not (tmp_path / "pwned").exists()
    assert log.read_text().splitlines() == ["<use></soft/module files>", "<load><conda/2025-09-25>"]
    # A module name is not quoted into safety: Lmod evaluates it. Such a name is refused (tests/integration/
    # test_hostile.py shows Lmod running it).
    with pytest.raises(RecipeError, match="not a module name"):
        modulelines.module_lines([], ["conda/2025; echo pwned"])


def test_script_adds_list_entries_quoted_and_without_an_empty_entry(tmp_path):
    odd = "/soft/a dir $(touch pwned) 'q'"
    text = batch.script(
        scheduler="slurm",
        directives=["--nodes=1"],
        activate=Activation(prepend={"LD_LIBRARY_PATH": (odd, "/soft/b")}, append={"CPATH": ("/inc",)}),
        launch=["sh", "-c", 'printf "%s|%s" "$LD_LIBRARY_PATH" "$CPATH"'],
        workdir=str(tmp_path / "w"),
    )
    for before, expected in (
        ({}, f"{odd}:/soft/b|/inc"),
        ({"LD_LIBRARY_PATH": "/u", "CPATH": "/c"}, f"{odd}:/soft/b:/u|/c:/inc"),
    ):
        res = subprocess.run(
            ["bash", "-c", text],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", **before},
            capture_output=True,
            text=True,
            check=True,
        )
        assert res.stdout == expected
    assert not (tmp_path / "pwned").exists()


def test_plan_refuses_a_directive_outside_the_allowed_flags(tmp_path):
    from envbuilder import plan
    from envbuilder.core.facts import HostFacts
    from envbuilder.recipe import loader
    from envbuilder.recipe.catalog import Catalog, Layer

    (tmp_path / "strict.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "strict"\n[compute]\ngpus_per_node = 1\ncores_per_node = 8\n'
        '[scheduler]\ntype = "slurm"\ngpu_request = "gpus-per-node"\n'
        'allowed_flags = ["--job-name", "--nodes", "--ntasks", "--ntasks-per-node", "--time", "--cpus-per-task"]\n'
        '[launcher]\ndefault = "srun"\n'
    )
    recipe = loader.load("strict", Catalog([Layer("t", tmp_path)]))
    with pytest.raises(RecipeError, match="--gpus-per-node, which is not in this site's allowed flags"):
        plan.build(recipe, HostFacts(arch="x86_64", python="3.11.7", gpus=()), {"SCRATCH": "/s"})


def test_bind_fills_the_allocation_values_for_a_run_inside_the_job():
    argv = launchers.build(
        "srun", spec(nodes=2, nproc_per_node=4, port=29400, rdzv_id=ShellVar("SLURM_JOB_ID"))
    )
    bound = launchers.bind(argv, {"MASTER_ADDR": "c001", "SLURM_JOB_ID": "42"})
    assert "c001:29400" in bound and "42" in bound
    assert all(isinstance(a, str) and "$" not in a for a in bound)


def test_bind_without_a_value_says_a_batch_job_is_needed():
    argv = launchers.build("srun", spec(nodes=2, port=29400))
    with pytest.raises(UsageError, match=r"\$MASTER_ADDR"):
        launchers.bind(argv, {})
