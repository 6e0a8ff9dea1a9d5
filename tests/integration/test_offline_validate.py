"""An env created where the network was reachable, then used on a compute node without one (a network namespace
with loopback only, tests/offline_node.py) whose own host name nothing there resolves (not in /etc/hosts, no DNS
reachable), as on a node only the site's DNS knows: `validate` passes every CPU check through torchrun and through
the env's MPI, `run` starts the user's program as the recipe's launch does, and `plan` and `doctor`, which read
the wheel indexes, fall back on the shipped table and say why, without a traceback or a wait: at once where
nothing routes out, within ENVBUILDER_INDEX_TIMEOUT where a firewall drops what goes out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import TRAIN, CpuTorchWorld, cli_argv, rank_lines
from offline_node import run_offline, why_not, why_not_dropped

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(why_not() is not None, reason=f"no network namespace: {why_not()}"),
]

#: The node's name: nothing on it resolves it.
NODE = "c042"

#: What validate's default set checks on CPU, and where each ends: the GPU checks are skipped, MPI is only
#: checked under an MPI launcher, horovod is not in the env.
CPU_PASSES = {"import", "libraries", "nccl", "ddp", "filesystem"}
SKIPPED = {"gpu", "arch", "cuda", "horovod"}


@pytest.fixture(scope="module")
def world(cpu_torch_template, torch_index, torch_uv_cache, tmp_path_factory) -> CpuTorchWorld:
    """The session's CPU torch env (torch 2.13.0, numpy, mpi4py, MPICH), created with its index reachable, in a
    world of this module's own (its validations and records change nobody else's)."""
    root = tmp_path_factory.mktemp("offline-torch")
    return CpuTorchWorld.copy_of(cpu_torch_template, root, torch_index, torch_uv_cache)


def node_env(world: CpuTorchWorld, **extra: str) -> dict[str, str]:
    """The user's environment on the node: no mirror set up and nothing told to stay offline, so whatever
    envbuilder reads from an index goes to download.pytorch.org or PyPI, which nothing there reaches."""
    gone = ("ENVBUILDER_INDEX_MIRROR", "ENVBUILDER_OFFLINE")
    return {**{k: v for k, v in world.env.items() if k not in gone}, **extra}


def on_node(world: CpuTorchWorld, *args: str, timeout: float = 300, **extra: str):
    return run_offline(cli_argv(*args), node_env(world, **extra), hostname=NODE, timeout=timeout)


def passed(res) -> dict:
    """The report of a validate --json run that passed."""
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)["data"]


def statuses(report: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, row in report["checks"].items():
        out.setdefault(row["status"], set()).add(name)
    return out


def test_validate_passes_the_cpu_checks_through_torchrun(world):
    """Before the fix the one-node torchrun gave its workers the node's name for its store, which they could not
    resolve: they retried it until the validation's timeout and every check failed as "never started"."""
    report = passed(on_node(world, "validate", "vcpu", "--cpu", "--timeout", "40", "--json"))
    assert report["launcher"] == "torchrun" and report["world"] == 2, report
    got = statuses(report)
    assert got["pass"] == CPU_PASSES, got
    assert got["skip"] == SKIPPED | {"mpi"}, got
    assert set(report["hosts"].values()) == {NODE}, report["hosts"]  # it did run on the node


def test_validate_passes_the_mpi_check_through_the_envs_mpirun(world):
    report = passed(
        on_node(world, "validate", "vcpu", "--cpu", "--launcher", "mpirun", "--timeout", "40", "--json")
    )
    assert report["launcher"] == "mpirun" and report["world"] == 2, report
    got = statuses(report)
    assert got["pass"] == CPU_PASSES | {"mpi"}, got
    assert got["skip"] == SKIPPED, got
    assert set(report["hosts"].values()) == {NODE}, report["hosts"]


def test_run_starts_the_program_as_the_recipes_launch_does(world, tmp_path):
    """`run` through the recipe's launcher (torchrun), two ranks in one world; the program's exit status passes
    through torchrun as on a node with a network. Before the fix the ranks never reached each other and the run
    waited until killed."""
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    res = on_node(world, "run", "vcpu", "--gpus-per-node", "2", "--", str(train), timeout=120)
    assert res.returncode == 0, res.stderr
    assert [line.split(" omp=")[0] for line in rank_lines(res.stdout)] == ["rank 0/2 sum=3", "rank 1/2 sum=3"]
    failed = on_node(world, "run", "vcpu", "--gpus-per-node", "2", "--", str(train), "3", timeout=120)
    assert failed.returncode == 1 and "exitcode  : 3" in failed.stderr, failed.stderr


def test_run_through_mpirun_gives_the_ranks_a_loopback_rendezvous(world):
    """Ranks started by the env's mpirun rendezvous through torch's store at MASTER_ADDR: loopback on one node,
    never the node's name."""
    show = "import os; print('rank', os.environ['PMI_RANK'], os.environ['MASTER_ADDR'])"
    res = on_node(
        world, "run", "vcpu", "--launcher", "mpirun", "--gpus-per-node", "2", "--", "python", "-c", show
    )
    assert res.returncode == 0, res.stderr
    assert rank_lines(res.stdout) == ["rank 0 127.0.0.1", "rank 1 127.0.0.1"], res.stdout


@pytest.mark.parametrize("how", [(), ("--offline",), ("--refresh",)], ids=["plan", "offline", "refresh"])
def test_plan_falls_back_on_the_shipped_table_and_says_why(world, how):
    started = time.monotonic()
    res = on_node(world, "plan", "vcpu", *how, "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    text = json.dumps(json.loads(res.stdout)["data"])
    if how == ("--offline",):
        assert "--offline" in text, text
    else:  # read, failed at once (no route), and said so: the URL and the cause in words
        assert "every index read failed: https://download.pytorch.org/whl/cpu/torch/" in text, text
        assert "name resolution" in text, text
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("command", [("plan", "vcpu"), ("doctor", "vcpu")], ids=["plan", "doctor"])
def test_index_reads_end_at_the_index_timeout_where_packets_are_dropped(world, command):
    """Where the node's packets out are dropped rather than refused, a name lookup waits for every try of the
    resolver at every name server (10 s here, more with more servers), which no socket timeout bounds: before the
    fix plan and doctor waited that long, past ENVBUILDER_INDEX_TIMEOUT, and blamed name resolution."""
    if why_not_dropped() is not None:
        pytest.skip(f"no node that drops its packets: {why_not_dropped()}")
    started = time.monotonic()
    env = node_env(world, ENVBUILDER_INDEX_TIMEOUT="2")
    res = run_offline(cli_argv(*command, "--json"), env, hostname=NODE, dropped=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    late = "https://download.pytorch.org/whl/cpu/torch/: no answer within 2 s (ENVBUILDER_INDEX_TIMEOUT)"
    assert late in res.stdout, res.stdout
    assert time.monotonic() - started < 60


def cached_pages(world: CpuTorchWorld) -> int:
    """How many pages the world's index cache holds."""
    return len(list((world.home / "cache" / "index").glob("*.json")))


def days_on(days: int) -> dict[str, str]:
    """The environment that runs a command ``days`` later by the wall clock (Debian's libfaketime, which .ci/run
    installs; monotonic clocks, which time-outs use, stay real): the cached pages are then that old, and the
    shipped table no newer than the day they were read, whatever today's date is."""
    lib = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)
    if lib is None:
        pytest.skip("libfaketime is not installed (.ci/run installs Debian's faketime)")
    return {"LD_PRELOAD": str(lib), "FAKETIME": f"+{days}d", "DONT_FAKE_MONOTONIC": "1"} if days else {}


@pytest.mark.parametrize(
    ("command", "days"),
    [(("plan", "vcpu", "--refresh"), 0), (("plan", "vcpu"), 2), (("doctor", "vcpu", "--refresh"), 0)],
    ids=["plan-refresh", "plan-two-days-on", "doctor-refresh"],
)
def test_a_failed_read_on_the_node_uses_the_pages_read_before(world, command, days):
    """The user planned on the login node, where the mirror answered, and the pages went into the index cache of
    their envbuilder home; on the node the mirror does not answer (nothing listens on its loopback). A refresh,
    or a read once the copy is over a day old, fails there: the copy read before stands in for the page, not the
    shipped table (older, and all the plan had before the fix), and the plan says that the read failed."""
    assert world.cli("plan", "vcpu").returncode == 0  # on the login node: the pages are read and cached
    assert cached_pages(world) == 2  # download.pytorch.org's cpu page and PyPI's
    res = run_offline(cli_argv(*command), {**world.env, **days_on(days)}, hostname=NODE, timeout=120)
    assert "Traceback" not in res.stderr
    out = res.stdout
    assert "every index read failed" not in out and "the index was not read" not in out, out
    if command[0] == "plan":
        assert res.returncode == 0, res.stderr
        said = " ".join(out.split())  # the line may be wrapped
        assert "https://download.pytorch.org/whl/cpu: 1 torch files, read from http://127.0.0.1:" in said, out
        assert "(cached); read again now, it failed: http://127.0.0.1:" in said, out
        assert "cannot connect (Connection refused)" in said, out
    else:  # its report names the newest torch the cached page lists
        assert "knows the newest torch on the index (2.13.0)" in out, out


def test_create_on_the_node_says_the_plans_read_failed_too(world):
    """Where the plan's read failed and the copy read before stood in for the page, the install still meets the
    unanswering index: create's error names the plan's failed read as well, as where the plan had no copy."""
    assert world.cli("plan", "vcpu").returncode == 0  # on the login node: the pages are read and cached
    res = run_offline(
        cli_argv("create", "vcpu", "--name", "vcpu2", "--no-validate", "--refresh"), world.env, hostname=NODE
    )
    assert res.returncode == 11, res.stderr
    err = " ".join(res.stderr.split())
    assert "the plan could not read the wheel index either (http://127.0.0.1:" in err, res.stderr
    assert "ENVBUILDER_INDEX_MIRROR" in err and "Traceback" not in err, res.stderr
    assert not (world.scratch / "envbuilder" / "envs" / "vcpu2").exists()


def test_doctor_reports_the_index_unread_and_the_env_as_it_is(world):
    res = on_node(world, "doctor", "vcpu", "--json", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    text = res.stdout
    assert "the index was not read (every index read failed: https://download.pytorch.org/whl/" in text, text
    assert "torch 2.13.0 cpu still resolves the same for this node" in text, text


def test_the_env_record_shows_the_last_validation_from_the_node(world):
    """What validate stored on the node is what show says there (no index, no network)."""
    passed(on_node(world, "validate", "vcpu", "--cpu", "--checks", "import", "--timeout", "40", "--json"))
    res = on_node(world, "show", "vcpu")
    assert res.returncode == 0, res.stderr
    assert "last check: import: pass" in res.stdout, res.stdout
