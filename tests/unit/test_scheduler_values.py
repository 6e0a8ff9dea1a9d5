"""No value is an option (issue 32, finding 3): every scheduler and launcher value that lands in a job script
directive or an argv has a pattern of its kind (recipe.values). Real sites' values pass; a value a scheduler would
split into a second option, read as an option, or a shell would run is refused: in a recipe at load (exit 3,
naming file and key), on the command line at parse (exit 2, naming the option), and again in the renderers. And
``forbidden_flags`` holds wherever an option would appear: inside a directive's value, in the interactive
command, the srun step and the submit command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import PLAN_ENV, run_cli

from envbuilder import plan
from envbuilder.core import schedulers, values
from envbuilder.core.errors import RecipeError, UsageError
from envbuilder.core.facts import HostFacts
from envbuilder.core.launchers import LaunchSpec
from envbuilder.plan import batch
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, Layer

SLURM, PBS = schedulers.SCHEDULERS["slurm"], schedulers.SCHEDULERS["pbs"]
HOST = HostFacts(arch="x86_64", python="3.11.7", gpus=())
ENV = {"SCRATCH": "/s", "HOME": "/h"}

#: What a hostile value tries: an option of its own, a second option after a space or on a second directive
#: line, shell code. None of them may reach a directive or an argv.
HOSTILE = {
    "leading-dash": "-x",
    "an-option": "--error=/tmp/stolen",
    "space-then-option": "debug --error=/tmp/stolen",
    "tab-then-option": "debug\t--error=/tmp/stolen",
    "newline-directive": "debug\n#SBATCH --error=/tmp/stolen",
    "semicolon": "debug;touch pwned",
    "command-substitution": "$(touch pwned)",
    "backticks": "`touch pwned`",
}


def write_recipe(tmp_path: Path, tables: dict[str, dict[str, Any]]) -> Path:
    """demo.toml with ``tables`` (a Slurm site unless a table says otherwise), every value written as TOML."""
    lines = ['schema_version = 1\n[recipe]\nname = "demo"\n[torch]\ninstall = false']
    tables = {"scheduler": {"type": "slurm"}, **tables}
    tables["scheduler"] = {"type": "slurm", **tables["scheduler"]}
    for table, entries in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in entries.items()]
    path = tmp_path / "demo.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load(tmp_path: Path) -> loader.Recipe:
    return loader.load("demo", Catalog([Layer("t", tmp_path)]))


def refused_at_load(tmp_path: Path, tables: dict[str, dict[str, Any]], key: str) -> RecipeError:
    path = write_recipe(tmp_path, tables)
    with pytest.raises(RecipeError) as info:
        load(tmp_path)
    assert info.value.file == str(path)
    assert info.value.key == key
    return info.value


# ---------------------------------------------------------------------------------------------------------------
# Real sites' values pass, and reach the job script as the scheduler reads them


@pytest.mark.parametrize(
    "partition", ["gpu-a100", "normal", "gh", "gh-dev", "gpu,gpu-preempt", "debug@pbs01"]
)
@pytest.mark.parametrize("key", ["scheduler.partition", "validation.partition"])
def test_real_partition_names_plan_into_the_directive(tmp_path, key, partition):
    table, field = key.split(".")
    write_recipe(tmp_path, {table: {field: partition}})
    script = plan.build(load(tmp_path), HOST, ENV).batch_script or ""
    assert f"#SBATCH --partition={partition}\n" in script


@pytest.mark.parametrize(
    ("time", "walltime"),
    [
        ("2:00:00", "02:00:00"),
        ("00:30:00", "00:30:00"),
        ("1-00:00:00", "24:00:00"),
        ("30", "00:30:00"),
        ("10:30", "00:10:30"),
        ("1-12", "36:00:00"),
        ("2-06:30", "54:30:00"),
        ("100:00:00", "100:00:00"),
    ],
)
def test_every_slurm_time_form_plans_as_hh_mm_ss(tmp_path, time, walltime):
    # qsub would read a bare "30" as 30 seconds and refuse "1-00:00:00": both schedulers get HH:MM:SS.
    write_recipe(tmp_path, {"scheduler": {"time": time}})
    assert f"#SBATCH --time={walltime}\n" in (plan.build(load(tmp_path), HOST, ENV).batch_script or "")
    write_recipe(tmp_path, {"scheduler": {"type": "pbs"}, "validation": {"time": time}})
    assert f"#PBS -l walltime={walltime}\n" in (plan.build(load(tmp_path), HOST, ENV).batch_script or "")


def test_the_interactive_command_gets_the_walltime_and_its_minutes(tmp_path):
    template = ["idev", "-p", "{partition}", "-t", "{time}", "-m", "{minutes}"]
    write_recipe(
        tmp_path, {"scheduler": {"partition": "gh-dev", "time": "1-00:00:30", "interactive": template}}
    )
    built = plan.build(load(tmp_path), HOST, ENV)
    assert list(built.interactive_command or ()) == ["idev", "-p", "gh-dev", "-t", "24:00:30", "-m", "1441"]


def test_a_slurm_step_that_asks_for_no_cpus_is_warned_about(tmp_path):
    template = ["srun", "--partition={partition}", "--ntasks-per-node=1", "--pty", "/bin/bash", "-i"]
    site = {"partition": "p", "exclusive_nodes": False, "interactive": template}
    write_recipe(tmp_path, {"scheduler": site, "compute": {"cores_per_node": 8}})
    warned = [w for w in plan.build(load(tmp_path), HOST, ENV).warnings if "asks for no CPUs" in w]
    assert warned and "--cpus-per-task={cpus}" in warned[0] and "(8 per task here)" in warned[0]
    write_recipe(
        tmp_path,
        {
            "scheduler": {**site, "interactive": [*template[:3], "-c", "{cpus}", *template[3:]]},
            "compute": {"cores_per_node": 8},
        },
    )
    built = plan.build(load(tmp_path), HOST, ENV)
    assert not [w for w in built.warnings if "asks for no CPUs" in w]
    assert list(built.interactive_command or ())[3:5] == ["-c", "8"]


@pytest.mark.parametrize(
    "flag",
    [
        "--qos=normal",
        "--exclusive",
        "--account=ABC23001",
        "--reservation=maint_2026",
        "--constraint=a100&ib",
        "--constraint=[rack1|rack2]",
        "--constraint=[rack1*2&rack2*4]",
        "--constraint=(knl&snc4)*4&haswell",
        "-C gpu&hbm80g",
        "--time=1-00:00:00",
        "-l filesystems=home:eagle",
        "--gres=gpu:4",
    ],
)
def test_real_required_flags_plan_into_directives(tmp_path, flag):
    write_recipe(tmp_path, {"scheduler": {"required_flags": [flag]}})
    assert f"#SBATCH {flag}\n" in (plan.build(load(tmp_path), HOST, ENV).batch_script or "")


@pytest.mark.parametrize(
    ("kind", "good"),
    [
        ("ACCOUNT", ["ABC23001", "TG-CCR180001", "p01", "project_x.2026"]),
        ("QOS", ["normal", "gpu", "high-prio", "debug_q"]),
        ("RESERVATION", ["maint_2026", "hackathon-day1"]),
        ("CONSTRAINT", ["a100", "a100&ib", "[rack1|rack2]", "intel*4", "(a|b)&c", "gpu_a100.80gb"]),
        ("MPI_PLUGIN", ["pmi2", "pmix", "pmix_v4", "cray_shasta", "none"]),
        ("CPU_BIND", ["depth", "core", "numa", "list:0-7:8-15", "verbose,core"]),
        ("JOB_NAME", ["envbuilder-vista-venv-cu124", "job_1"]),
    ],
)
def test_each_kind_takes_real_site_values(kind, good):
    word = getattr(values, kind)
    assert [value for value in good if word.problem(value) is not None] == []
    assert all(word.problem(bad) is not None for bad in HOSTILE.values())


# ---------------------------------------------------------------------------------------------------------------
# Hostile values are refused at load, naming the file and the key


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize(
    ("table", "field", "what"),
    [
        ("scheduler", "partition", "partition name"),
        ("validation", "partition", "partition name"),
        ("scheduler", "time", "walltime"),
        ("validation", "time", "walltime"),
        ("launcher", "mpi", "srun MPI plugin"),
        ("launcher", "cpu_bind", "mpiexec CPU binding"),
    ],
)
def test_hostile_values_are_refused_at_load(tmp_path, table, field, what, value):
    error = refused_at_load(tmp_path, {table: {field: value}}, f"{table}.{field}")
    assert what in error.message or "line break" in error.message, error.message
    assert error.hint


def test_the_findings_partition_is_refused_even_before_forbidden_flags(tmp_path):
    error = refused_at_load(
        tmp_path,
        {"scheduler": {"partition": "debug --error=/tmp/stolen", "forbidden_flags": ["--error"]}},
        "scheduler.partition",
    )
    assert error.message.startswith(
        f"{tmp_path / 'demo.toml'}: scheduler.partition: a partition name cannot hold whitespace"
    )
    assert "letters, digits" in (error.hint or "")


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--qos=normal --error=/tmp/stolen", "not one scheduler directive"),
        ("-l -e", "not one scheduler directive"),
        ("--qos=-x", "--qos: a QOS name cannot start with '-'"),
        ("--constraint=a100;id", "--constraint: not a node-feature constraint"),
        ("-A $(touch pwned)", "not one scheduler directive"),
        ("--account=`id`", "--account: not an account name"),
        ("--time=soon", "--time: not a walltime"),
        ("qos=normal", "not one scheduler directive"),
    ],
)
def test_required_flags_that_hide_an_option_or_a_bad_value_are_refused(tmp_path, flag, says):
    tables = {"scheduler": {"required_flags": ["--exclusive", flag]}}
    error = refused_at_load(tmp_path, tables, "scheduler.required_flags[1]")
    assert says in error.message


@pytest.mark.parametrize("flag", ["--error=/tmp/x", "error", "--gres gpu", "-"])
def test_forbidden_and_allowed_flags_name_options(tmp_path, flag):
    for key in ("forbidden_flags", "allowed_flags"):
        error = refused_at_load(tmp_path, {"scheduler": {key: ["--gres", flag]}}, f"scheduler.{key}[1]")
        assert "not a scheduler option" in error.message


def test_a_partitions_entry_must_be_named_like_a_partition(tmp_path):
    path = write_recipe(tmp_path, {})
    path.write_text(
        path.read_text() + '[scheduler.partitions."gpu --error=/tmp/x"]\ngpus_per_node = 4\n',
        encoding="utf-8",
    )
    with pytest.raises(RecipeError) as info:
        load(tmp_path)
    assert info.value.key == "scheduler.partitions.gpu --error=/tmp/x"


# ---------------------------------------------------------------------------------------------------------------
# The renderers refuse them again (a state record, the job's environment or a caller hands them over)


def job(**kw: Any) -> schedulers.JobShape:
    base: dict[str, Any] = {
        "nodes": 1,
        "tasks_per_node": 1,
        "gpus_per_node": 0,
        "cpus_per_task": None,
        "partition": "gpu",
        "time": "00:30:00",
        "account": None,
        "name": "envbuilder-demo",
    }
    return schedulers.JobShape(**{**base, **kw})


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_job_shape_refuses_a_hostile_partition_time_or_name(value):
    for field, key in (
        ("partition", "partition"),
        ("time", "scheduler.time"),
        ("name", "job name"),
    ):
        with pytest.raises(RecipeError) as info:
            job(**{field: value})
        assert info.value.key == key


@pytest.mark.parametrize("account", ["-x", "a b", "ABC --error=/tmp/x", "$(id)", "a\nb"])
def test_job_shape_refuses_a_hostile_account_as_a_usage_error(account):
    with pytest.raises(UsageError, match="--account"):
        job(account=account)
    job(account="ABC23001")  # the control


@pytest.mark.parametrize(("field", "value"), [("mpi", "pmix --error=/x"), ("cpu_bind", "-x")])
def test_launch_spec_refuses_hostile_launcher_values(field, value):
    with pytest.raises(RecipeError) as info:
        LaunchSpec(python="/p", script=("x.py",), **{field: value})
    assert info.value.key == f"launcher.{field}"


# ---------------------------------------------------------------------------------------------------------------
# forbidden_flags holds wherever an option would appear


def test_a_forbidden_flag_inside_a_directives_value_is_refused():
    with pytest.raises(RecipeError) as info:
        batch.check_dialect(["--nodes=1", "--partition=debug --error=/tmp/x"], ["--error"], [], "site.toml")
    assert info.value.key == "scheduler.forbidden_flags"
    assert "would pass --error, which this site rejects" in info.value.message
    assert "inside the directive '--partition=debug --error=/tmp/x'" in (info.value.hint or "")
    batch.check_dialect(["--nodes=1", "--partition=debug"], ["--error"], [], "site.toml")  # the control


@pytest.mark.parametrize(
    ("directive", "forbidden"),
    [("--partition=debug -e /tmp/x", "--error"), ("--error=/tmp/x", "-e"), ("-e/tmp/x", "--error")],
)
def test_slurms_one_letter_options_are_the_long_ones(directive, forbidden):
    with pytest.raises(RecipeError, match="--error"):
        batch.check_dialect([directive], [forbidden], [], "site.toml", SLURM.short_options)


def test_an_option_inside_a_directives_value_must_be_allowed_too():
    allowed = ["--nodes", "--partition"]
    with pytest.raises(RecipeError, match="--error, which is not in this site's allowed flags"):
        batch.check_dialect(["--partition=debug --error=/tmp/x"], [], allowed, "site.toml")


def plan_with(tmp_path: Path, scheduler: dict[str, Any], launcher: Optional[str] = None) -> None:
    tables: dict[str, dict[str, Any]] = {"scheduler": scheduler}
    if launcher:
        tables["launcher"] = {"default": launcher}
    write_recipe(tmp_path, tables)
    plan.build(load(tmp_path), HOST, ENV)


@pytest.mark.parametrize(
    ("scheduler", "launcher", "says"),
    [
        (
            {"interactive": ["salloc", "-p", "{partition}", "-e", "/tmp/x"]},
            None,
            "the interactive command (scheduler.interactive) would pass -e (--error)",
        ),
        ({"exclusive_nodes": True}, "srun", "the srun step would pass --cpus-per-task"),
        ({}, None, "the sbatch command would pass --output"),
    ],
    ids=["interactive", "srun-step", "submit"],
)
def test_forbidden_flags_hold_for_the_commands_too(tmp_path, scheduler, launcher, says):
    forbidden = {"forbidden_flags": ["--error", "--cpus-per-task", "--output"]}
    with pytest.raises(RecipeError) as info:
        plan_with(tmp_path, {**scheduler, **forbidden}, launcher)
    assert info.value.key == "scheduler.forbidden_flags"
    assert says in info.value.message
    plan_with(tmp_path, scheduler, launcher)  # the control: the same recipe without forbidden flags plans


# ---------------------------------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--partition", "-x", "a partition name cannot start with '-'"),
        ("--partition", "debug --error=/tmp/x", "a partition name cannot hold whitespace"),
        ("--account", "a b", "an account name cannot hold whitespace"),
        ("--account", "-x", "an account name cannot start with '-'"),
        ("--account", "$(id)", "not an account name"),
    ],
)
def test_cli_values_that_would_be_options_are_usage_errors(tmp_path, option, value, says):
    write_recipe(tmp_path, {})
    env = {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(tmp_path)}
    res = run_cli("plan", "demo", f"{option}={value}", "--json", env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"argument {option}: {says}" in res.stderr
    assert "Traceback" not in res.stderr
    good = run_cli("plan", "demo", "--partition", "gpu-a100", "--account", "ABC23001", "--json", env=env)
    assert good.returncode == 0, good.stderr
    assert "#SBATCH --account=ABC23001\n" in json.loads(good.stdout)["data"]["batch_script"]
