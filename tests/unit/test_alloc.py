"""`envbuilder alloc` (issue 40): the allocation lines a launch needs on its site (Slurm, TACC's idev, Polaris's
PBS), read back as a scheduler would parse them rather than compared with stored text, and the comparison of what
a job holds (plan/allocation.py, pure) with what the launch needs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import PLAN_ENV, load_facts, refused, run_cli

from envbuilder.core import schedulers
from envbuilder.plan import allocation, suite
from envbuilder.plan.target import target_facts
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog

CATALOG = Catalog.from_env({})
CPU_HOST = load_facts("cpu-only")


def _slurm(argv: Sequence[str]) -> argparse.Namespace:
    """``argv``'s options as salloc, srun and sbatch read them (long and short spellings)."""
    p = argparse.ArgumentParser(add_help=False)
    for flags in (
        ("-N", "--nodes"),
        ("--ntasks-per-node",),
        ("-c", "--cpus-per-task"),
        ("--gpus-per-node",),
        ("--gres",),
        ("-p", "--partition"),
        ("-A", "--account"),
        ("-t", "--time"),
        ("-J", "--job-name"),
        ("--qos",),
    ):
        p.add_argument(*flags)
    p.add_argument("--pty", action="store_true")
    p.add_argument("--exclusive", action="store_true")
    p.add_argument("rest", nargs=argparse.REMAINDER)  # the command (or script) and its own arguments
    return p.parse_args(list(argv))


def _pbs(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-I", action="store_true")
    p.add_argument("-l", action="append", default=[])
    for flag in ("-q", "-A", "-N"):
        p.add_argument(flag)
    p.add_argument("rest", nargs="*")
    return p.parse_args(list(argv))


def _advice(name: str, **request: object) -> allocation.Advice:
    recipe = loader.load(name, CATALOG)
    warnings: list[str] = []
    target = target_facts(recipe, CPU_HOST, warnings, [])
    wanted = suite.LaunchRequest(**request)  # type: ignore[arg-type]
    shape = suite.shape_for(recipe, target, wanted, suite.device_for(target, cpu=False), warnings)
    advice = allocation.advise(recipe, shape)
    assert advice is not None
    return advice


def test_zurada_lines_ask_for_the_cpus_and_gpus_the_launch_uses():
    recipe = loader.load("zurada-conda-cu126", CATALOG)
    part = recipe.scheduler.partitions[recipe.scheduler.partition]
    advice = _advice("zurada-conda-cu126")
    assert advice.site and advice.interactive and advice.shell and advice.batch
    for line in (advice.site, advice.interactive, advice.shell, advice.batch):
        opts = _slurm(line[1:])
        # One torchrun agent per node holds the node's cores and its GPUs (the seed's line asked for no CPUs).
        assert int(opts.cpus_per_task) == part.cores_per_node
        assert int(opts.gpus_per_node) == part.gpus_per_node
        assert opts.partition == recipe.scheduler.partition
        assert (int(opts.nodes), int(opts.ntasks_per_node)) == (1, 1)
    assert advice.interactive[0] == "salloc"
    assert advice.shell[0] == "srun" and _slurm(advice.shell[1:]).pty
    assert advice.batch[0] == "sbatch" and _slurm(advice.batch[1:]).rest == [allocation.SCRIPT]
    assert advice.need.cpus == part.cores_per_node and advice.need.gpus_per_node == part.gpus_per_node


def test_a_gres_site_asks_for_its_gpus_as_gres():
    advice = _advice("cirrus-venv-cu121-horovod", nodes=2, account="ABC23001")
    assert advice.gpu_request == "gres"
    opts = _slurm(advice.interactive[1:])
    assert opts.gres == f"gpu:{advice.job.gpus_per_node}" and opts.gpus_per_node is None
    assert (opts.nodes, opts.account, opts.qos) == ("2", "ABC23001", "gpu")


def test_tacc_idev_line_and_whole_nodes():
    advice = _advice("vista-venv-cu124", nodes=2)
    assert advice.site is not None and advice.site[0] == "idev"
    idev = argparse.ArgumentParser(add_help=False)
    for flag in ("-p", "-N", "-n", "-t"):
        idev.add_argument(flag)
    opts = idev.parse_args(list(advice.site[1:]))
    assert (opts.p, opts.N, opts.t) == (advice.job.partition, "2", "00:30:00")
    assert int(opts.n) == 2 * advice.job.tasks_per_node
    # Whole nodes: no CPU or GPU count (Vista rejects --gres).
    salloc = _slurm(advice.interactive[1:])
    assert salloc.cpus_per_task is None and salloc.gres is None and salloc.gpus_per_node is None


def test_polaris_qsub_lines_carry_the_filesystems_queue_and_account():
    advice = _advice("polaris-overlay-conda", account="ABC23001", nodes=2)
    assert advice.shell is None  # PBS's interactive job is already a shell on the first node
    for line in (advice.site, advice.interactive):
        assert line is not None and line[:2] == ("qsub", "-I")
        opts = _pbs(line[1:])
        assert "filesystems=home:eagle" in opts.l
        assert f"walltime={advice.job.walltime}" in opts.l
        assert (opts.q, opts.A) == (advice.job.partition, "ABC23001")
        assert any(value.split(":")[0] == "select=2" for value in opts.l)
    batch = _pbs(advice.batch[1:])
    assert batch.rest == [allocation.SCRIPT] and advice.job.name == batch.N


def test_pbs_select_asks_for_cpus_and_gpus_where_the_site_counts_them():
    job = schedulers.JobShape(2, 4, 4, 8, "prod", "1:00:00", None, "envbuilder-x")
    adapter = schedulers.get("pbs")
    select = _pbs(adapter.allocate(job, "gpus-per-node", ())[1:]).l[0]
    assert dict(p.split("=") for p in select.split(":")) == {"select": "2", "ncpus": "32", "ngpus": "4"}
    assert _pbs(adapter.allocate(job, "none", ())[1:]).l[0] == "select=2:ncpus=32"


def test_alloc_of_a_recipe_by_name_prints_the_lines_as_json():
    res = run_cli("alloc", "zurada-conda-cu126", "--json", "--facts", str(CPU_HOST.source), env=PLAN_ENV)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert data["scheduler"] == "slurm" and data["inside"] is None
    assert _slurm(data["lines"]["interactive"][1:]).cpus_per_task == str(data["need"]["cpus_per_node"])


def test_alloc_prints_each_line_shell_quoted():
    res = run_cli("alloc", "polaris-overlay-conda", "--account", "ABC23001", "--facts", str(CPU_HOST.source))
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if not line.startswith("#")]
    assert lines and all(line.startswith("qsub ") for line in lines)


def test_a_hostile_value_never_becomes_an_option(tmp_path: Path):
    # From the command line: refused as the option is read.
    res = run_cli("alloc", "zurada-conda-cu126", "--account", "--uid=0", "--facts", str(CPU_HOST.source))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = run_cli("alloc", "zurada-conda-cu126", "--time", "1 --uid=0", "--facts", str(CPU_HOST.source))
    refused(res, 2, "walltime")
    # From a recipe: the loader refuses the partition before any line is built.
    (tmp_path / "hostile.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "hostile"\n[scheduler]\ntype = "slurm"\n'
        'partition = "gpu --uid=0"\n[torch]\ninstall = false\n'
    )
    env = {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(tmp_path)}
    res = run_cli("alloc", "hostile", "--facts", str(CPU_HOST.source), env=env)
    refused(res, 3, "partition")
    assert "--uid=0" not in res.stdout


def test_a_hostile_value_from_elsewhere_is_refused_by_the_job_shape():
    # A value that reached the planner without the loader (a record, the job's environment) is checked again.
    advice = _advice("zurada-conda-cu126")
    with pytest.raises(Exception, match="partition"):
        schedulers.JobShape(1, 1, 2, 32, "-p evil", "30", None, advice.job.name)


# -- the comparison (pure) ----------------------------------------------------------------------------------


def _need(ranks: int, cores: int, gpus: int = 0, step: bool = False) -> allocation.Advice:
    need = allocation.Need(1, ranks, cores, gpus, task_per_rank=step)
    tasks = ranks if step else 1
    job = schedulers.JobShape(1, tasks, gpus, ranks * cores // tasks, "debug", "10", None, "envbuilder-t")
    return allocation.Advice("slurm", job, need, "gres", None, None, None, None)


def _job(**held: object) -> schedulers.Where:
    return schedulers.Where(scheduler="slurm", job="7", nodes=1, **held)  # type: ignore[arg-type]


def test_a_job_with_what_the_launch_needs_lacks_nothing():
    assert allocation.compare(_need(2, 2, gpus=2), _job(cpus_per_node=4, gpus=2, visible_gpus=2)) == []


def test_too_few_cpus_for_one_task_per_rank_is_refused_with_the_options_that_fix_it():
    advice = _need(2, 2, step=True)
    missing = allocation.compare(advice, _job(cpus_per_node=1))
    assert [(m.what, m.held, m.needed, m.refuse) for m in missing] == [("cpus", 1, 4, True)]
    assert "2 ranks x 2 cores need 4" in missing[0].text
    opts = _slurm(missing[0].ask)
    assert (opts.ntasks_per_node, opts.cpus_per_task) == ("2", "2")
    error = allocation.refusal(advice, missing, _job(cpus_per_node=1))
    assert error is not None and "--cpus-per-task=2" in (error.hint or "")


def test_fewer_cores_than_ideal_is_a_warning():
    # torchrun's agent starts the ranks itself: they run, sharing what the job holds.
    missing = allocation.compare(_need(2, 4), _job(cpus_per_node=2))
    assert [(m.what, m.refuse) for m in missing] == [("cpus", False)]
    assert allocation.refusal(_need(2, 4), missing, _job()) is None
    assert "each rank gets 1 thread" in allocation.notes(missing)[0]


def test_gpus_the_scheduler_did_not_give_are_missing():
    advice = _need(2, 1, gpus=2)
    missing = allocation.compare(advice, _job(cpus_per_node=2, gpus=0))
    assert [(m.what, m.held, m.refuse) for m in missing] == [("gpus", 0, True)]
    assert missing[0].ask == ("--gres=gpu:2",)
    # CUDA_VISIBLE_DEVICES may leave fewer than the scheduler gave.
    missing = allocation.compare(advice, _job(cpus_per_node=2, gpus=2, visible_gpus=1))
    assert [(m.held, m.refuse) for m in missing] == [(1, True)]


def test_unknown_holdings_are_not_missing():
    # An salloc shell is told no GPU count; a whole-node site's scheduler counts none.
    assert allocation.compare(_need(2, 1, gpus=2), _job(cpus_per_node=2)) == []
    whole = allocation.Advice(
        "slurm", _need(2, 1, 2).job, _need(2, 1, 2).need, "none", None, None, None, None
    )
    assert allocation.compare(whole, _job(cpus_per_node=2, gpus=0)) == []


def test_slurm_tells_the_gpus_of_a_step_and_none_in_a_step_without():
    slurm = schedulers.get("slurm")
    base = {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "2", "SLURM_NTASKS": "1"}
    assert slurm.where({**base, "SLURM_GPUS_ON_NODE": "2"}).gpus == 2
    assert slurm.where({**base, "SLURM_STEP_GPUS": "0,1,2"}).gpus == 3
    assert slurm.where(base).gpus == 0
    salloc = {"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "1"}
    assert slurm.where(salloc).gpus is None
    assert slurm.where({**salloc, "SLURM_GPUS_PER_NODE": "h100:4"}).gpus == 4
    assert schedulers.locate({**salloc, "CUDA_VISIBLE_DEVICES": "0,1"}).visible_gpus == 2


def _site(tmp_path: Path, scheduler: str) -> allocation.Advice:
    """The advice for a recipe of this site's test directory with ``scheduler`` lines added to its [scheduler]."""
    (tmp_path / "site.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "site"\n[scheduler]\ntype = "slurm"\npartition = "debug"\n'
        f"{scheduler}\n[scheduler.partitions.debug]\ncores_per_node = 8\n[torch]\ninstall = false\n"
        '[launcher]\ndefault = "srun"\n[validation]\nnproc_per_node = 2\n'
    )
    recipe = loader.load("site", Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)}))
    target = target_facts(recipe, CPU_HOST, [], [])
    shape = suite.shape_for(recipe, target, suite.LaunchRequest(), "cpu", [])
    advice = allocation.advise(recipe, shape)
    assert advice is not None
    return advice


def test_a_site_command_that_asks_for_no_cpus_is_named(tmp_path: Path):
    # The seeds' own pages got this wrong: a step that asks for no CPUs gets one.
    bare = 'interactive = ["srun", "--partition={partition}", "--nodes={nodes}", "--pty", "bash"]'
    advice = _site(tmp_path, bare)
    [note] = advice.notes
    assert "asks for no CPUs" in note and "--cpus-per-task=8" in note
    assert _slurm(advice.shell[1:]).cpus_per_task == "8"
    fixed = bare.replace('"--pty"', '"--cpus-per-task={cpus}", "--pty"')
    assert _site(tmp_path, fixed).notes == ()


def test_a_line_that_would_pass_a_forbidden_flag_is_left_out(tmp_path: Path):
    advice = _site(tmp_path, 'forbidden_flags = ["--ntasks-per-node"]')
    assert (advice.interactive, advice.shell, advice.batch) == (None, None, None)
    assert len(advice.notes) == 3 and all("forbids" in note for note in advice.notes)


def test_too_little_time_left_is_a_warning():
    advice = _need(1, 1)
    [short] = allocation.compare(advice, _job(cpus_per_node=1), seconds_left=59)
    assert (short.what, short.held, short.needed, short.refuse) == ("time", 59, 600, False)
    assert short.ask == ("--time=00:10:00",)
    assert allocation.compare(advice, _job(cpus_per_node=1), seconds_left=600) == []
    assert schedulers.get("slurm").time_left("9:58\n") == 598
    assert schedulers.get("slurm").time_left("UNLIMITED") is None


def test_a_pbs_job_is_compared_by_its_cpus_and_visible_gpus():
    # Polaris hands out whole nodes (gpu_request "none"): only CUDA_VISIBLE_DEVICES counts the GPUs.
    advice = _advice("polaris-overlay-conda", account="ABC23001")
    env = {"PBS_JOBID": "12.polaris", "NCPUS": "64", "PBS_QUEUE": "debug", "CUDA_VISIBLE_DEVICES": ""}
    here = schedulers.locate(env)
    [gpus] = allocation.compare(advice, here)
    assert (gpus.what, gpus.held, gpus.needed, gpus.refuse) == ("gpus", 0, advice.need.gpus_per_node, True)
    assert gpus.ask[0] == "-l" and gpus.ask[1].startswith("select=")
    env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    assert allocation.compare(advice, schedulers.locate(env)) == []
