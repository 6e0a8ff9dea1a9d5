"""The scheduler seam (issue 35): a scheduler is one adapter in :data:`schedulers.SCHEDULERS`. Staging, the first
host of a multi-node run, the allocation a run finds itself in and the probe's record of it all ask the adapter,
so a third scheduler, registered here for the test only, is used by them all; and no other module names a
scheduler or reads its variables."""

from __future__ import annotations

import ast
import re
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Optional

import pytest
import sourcetrees

import envbuilder
from envbuilder.core import schedulers
from envbuilder.core.launchers import ShellVar
from envbuilder.plan import suite
from envbuilder.scale import staging
from envbuilder.system import host, state
from envbuilder.validate import runner

PACKAGE = Path(envbuilder.__file__).parent

#: What may name the variables without reading them for the package:
#: - payloads/: standard-library scripts run by the env's own python on the nodes (no envbuilder there); the
#:   rank variables they read are the launchers' (srun's SLURM_PROCID beside MPI's);
#: - cli/helptext.py: the --help and man text that documents the variables, imported at start-up with nothing else.
EXEMPT = ("payloads/", "cli/helptext.py")
#: Each adapter's one module, which names its own scheduler and variables and no other's.
ADAPTERS = {"core/schedulers/slurm.py": "slurm", "core/schedulers/pbs.py": "pbs"}

_VARIABLE = re.compile(r"(SLURM|PBS)_[A-Z0-9_]+")
_NAMES = {"slurm", "pbs"}
#: What a module's text holds wherever it names a scheduler or a variable of one (sourcetrees.parse_if).
_SPELT = re.compile(r"(?i)slurm|pbs")


def _hits(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """A scheduler's variable named as a string (read from an environment, listed, bound), or a scheduler's
    name as a string, except where a launcher declares the scheduler it belongs to (``scheduler="slurm"``)."""
    declared = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "scheduler"
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        named = node.value.lower() in _NAMES and id(node) not in declared
        if named or _VARIABLE.fullmatch(node.value):
            yield node.lineno, node.value


#: Each way of naming a scheduler the check looks for, and the one it lets pass, with what it must find.
_SAMPLE = (
    'a = env.get("SLURM_JOB_NODELIST")\n'
    'b = env["PBS_NODEFILE"]\n'
    'c = here.scheduler == "pbs"\n'
    'd = here.scheduler not in ("slurm", "pbs")\n'
    'e = SCHEDULERS["pbs"]\n'
    'f = Launcher("srun", argv, scheduler="slurm")\n'
)
_SAMPLE_HITS = [
    (1, "SLURM_JOB_NODELIST"),
    (2, "PBS_NODEFILE"),
    (3, "pbs"),
    (4, "pbs"),
    (4, "slurm"),
    (5, "pbs"),
]


def test_no_module_but_the_adapters_names_a_scheduler_or_its_variables() -> None:
    assert sorted(_hits(ast.parse(_SAMPLE))) == _SAMPLE_HITS  # the check is not blind
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(EXEMPT):
            continue
        tree = sourcetrees.parse_if(path, _SPELT)
        if tree is None:
            continue
        own = ADAPTERS.get(relative)
        hits = [(line, text) for line, text in _hits(tree) if own is None or not _names(own, text)]
        found += [f"envbuilder/{relative}:{line}: {text!r}" for line, text in hits]
    assert not found, "ask the scheduler adapter instead:\n" + "\n".join(found)


def _names(scheduler: str, text: str) -> bool:
    """Whether ``text`` is ``scheduler``'s name or one of its variables (``slurm``, ``SLURM_JOB_ID``)."""
    return text.lower() == scheduler or text.startswith(f"{scheduler.upper()}_")


def test_each_scheduler_is_one_module_of_its_name() -> None:
    """Every registered scheduler is the adapter of its own module under core/schedulers/, and the check above
    knows each of those modules (a new adapter's module is checked for naming other schedulers too)."""
    modules = {name: type(adapter).__module__ for name, adapter in schedulers.SCHEDULERS.items()}
    assert modules == {name: f"envbuilder.core.schedulers.{name}" for name in schedulers.SCHEDULERS}
    assert sorted(ADAPTERS.values()) == sorted(schedulers.SCHEDULERS)
    assert not _names("pbs", "SLURM_JOB_ID") and _names("slurm", "SLURM_JOB_ID")  # the filter is not blind


# ---------------------------------------------------------------------------------------------------------------
# A third scheduler, registered for one test


class Toy(schedulers.Scheduler):
    """A scheduler no module knows: its job is TOY_JOB, its hosts the file at TOY_HOSTS, and it starts one task
    per node with the ``toyrun`` script (a real one, in the test's directory)."""

    name = "toy"
    title = "Toy"
    allocation_vars = ("TOY_JOB", "TOY_HOSTS")
    hosts_var = "TOY_HOSTS"
    directive = "#TOY"
    submit_tool = "toysub"
    job_id_var = "TOY_JOB"
    partition_var = "TOY_QUEUE"
    node_launcher = "toyrun"
    rdzv_id = ShellVar("TOY_JOB")
    first_host = 'MASTER_ADDR=$(head -n 1 "$TOY_HOSTS")'
    cpus_var = "TOY_CPUS"

    def __init__(self, toyrun: Path) -> None:
        self.toyrun = toyrun

    def where(self, env: Mapping[str, str]) -> schedulers.Where:
        return schedulers.Where(scheduler=self.name, job=env[self.job_id_var])

    def hosts(self, env: Mapping[str, str]) -> Optional[schedulers.HostList]:
        return schedulers.HostList(path=env[self.hosts_var]) if env.get(self.hosts_var) else None

    def on_each_node(self, here: schedulers.Where, command: Sequence[str]) -> list[str]:
        return [str(self.toyrun), f"--nodes={here.nodes}", *command]

    def directives(self, job: schedulers.JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        return [f"--nodes={job.nodes}", *required]

    def submit(self, script: str, output: str) -> list[str]:
        return ["toysub", output, script]

    def state_query(self, job: str) -> list[str]:
        return ["toystat", job]

    def state(self, returncode: int, stdout: str) -> Optional[str]:
        return stdout.strip() or None

    def cancel(self, job: str) -> list[str]:
        return ["toydel", job]


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Toy, dict[str, str]]:
    """The toy registered (for this test only), and the environment of a two-node toy job: a host file naming
    its nodes (one line per slot), ``toyrun`` logging its argv and running the command once (this machine is
    every node), node-local copies under the test's directory."""
    hosts = tmp_path / "hosts"
    hosts.write_text("toy-n1\ntoy-n1\ntoy-n2\n", encoding="utf-8")
    toyrun = tmp_path / "toyrun"
    toyrun.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$TOY_LOG"\nshift\nexec "$@"\n', encoding="utf-8")
    toyrun.chmod(0o755)
    adapter = Toy(toyrun)
    monkeypatch.setitem(schedulers.SCHEDULERS, adapter.name, adapter)
    (tmp_path / "node").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "TOY_JOB": "42",
        "TOY_HOSTS": str(hosts),
        "TOY_LOG": str(tmp_path / "toyrun.log"),
        "TMPDIR": str(tmp_path / "node"),
        "ENVBUILDER_HOME": str(tmp_path / "home"),
    }
    monkeypatch.setenv("TMPDIR", env["TMPDIR"])
    return adapter, env


def test_a_third_scheduler_is_found_in_its_job(toy: tuple[Toy, dict[str, str]], tmp_path: Path) -> None:
    """The allocation: the run locates itself in the toy's job (its node count read from the toy's host file),
    and the probe names the scheduler and records its variables."""
    _, env = toy
    here = runner.locate(env)
    assert (here.scheduler, here.job, here.nodes) == ("toy", "42", 2)
    facts = host.probe(env, root=str(tmp_path))
    assert facts.scheduler == "toy"
    assert facts.allocation == {"TOY_JOB": "42", "TOY_HOSTS": env["TOY_HOSTS"]}


def test_a_third_scheduler_gives_the_first_host_and_its_rendezvous(toy: tuple[Toy, dict[str, str]]) -> None:
    """A multi-node run meets at the first host of the toy's host file, and the toy's job id fills its
    rendezvous variable."""
    _, env = toy
    launch = suite.Launch(
        "srun",
        ("torchrun", f"--rdzv-id={ShellVar('TOY_JOB')}", ShellVar("TOY_JOB")),
        2,
        1,
        "toy",
        None,
        None,
        None,
    )
    argv, run_env = runner.bind_here(launch, env)
    assert run_env["MASTER_ADDR"] == "toy-n1"
    assert argv[-1] == "42"


def test_a_third_scheduler_stages_with_its_own_argv(toy: tuple[Toy, dict[str, str]], tmp_path: Path) -> None:
    """``stage --clean`` runs its node step with the toy's argv (the real toyrun, which runs it here), and the
    step answers for this node."""
    _, env = toy
    record = state.EnvRecord("vtoy", "local", "0" * 64, str(tmp_path / "env"), "2026-11-28T00:00:00Z")
    cleaned = staging.clean(record, env)
    assert cleaned.removed == {socket.gethostname(): 0}
    logged = (tmp_path / "toyrun.log").read_text(encoding="utf-8").splitlines()
    assert logged == ["--nodes=2", sys.executable, "-m", "envbuilder", "__stage-node", "clean", "vtoy"]


# ---------------------------------------------------------------------------------------------------------------
# The two built in: what they now own, as staging and the runner built it before


def test_slurm_owns_its_step_its_broadcast_and_its_host_list() -> None:
    slurm = schedulers.SCHEDULERS["slurm"]
    command = ("py", "-m", "envbuilder", "__stage-node", "clean", "v")
    assert slurm.on_each_node(schedulers.Where("slurm", "7", nodes=2), command) == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", *command
    ]  # fmt: skip
    in_step = schedulers.Where("slurm", "7", in_step=True)
    assert slurm.on_each_node(in_step, command)[:5] == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--overlap"]  # fmt: skip
    assert slurm.broadcast("/w/a.sqfs", "/tmp/.a") == ["sbcast", "--force", "/w/a.sqfs", "/tmp/.a"]
    assert slurm.hosts({"SLURM_JOB_NODELIST": "n[1-2]"}) == schedulers.HostList(("scontrol", "show", "hostnames", "n[1-2]"))  # fmt: skip
    assert slurm.bound_values({}) == {"SLURM_JOB_ID": "envbuilder"}


def test_pbs_starts_its_node_launcher_and_reads_its_nodefile() -> None:
    pbs = schedulers.SCHEDULERS["pbs"]
    assert not pbs.broadcasts
    argv = pbs.on_each_node(schedulers.Where("pbs", "7.pbs", nodes=2), ("py", "-m", "envbuilder", "x"))
    assert argv[0] == "mpiexec" and argv[-4:] == ["py", "-m", "envbuilder", "x"]
    assert pbs.hosts({"PBS_NODEFILE": "/var/spool/pbs/aux/7"}) == schedulers.HostList(
        path="/var/spool/pbs/aux/7"
    )
    refused = pbs.unstageable(schedulers.Where("pbs", "7.pbs"))
    assert refused and "$PBS_NODEFILE" in refused[0]
    assert schedulers.allocation_vars()[-3:] == ("PBS_JOBID", "PBS_NODEFILE", "PBS_QUEUE")
