"""Across nodes for real: `envbuilder validate` and `envbuilder run` on a two-node Slurm cluster on this one machine
(tests/slurm.py's MultiNodeCluster: nodes n1 and n2, each slurmd in a UTS namespace of its own, so every rank
sees the host name of its node). What is checked: srun starts one torchrun agent per node, the ranks meet at the
allocation's first host, gloo and DDP run across both nodes, MPI ranks on both nodes talk through srun's PMI,
the report says where every rank ran, a node whose step dies is a FAIL naming it, not a hang, and a PBS site's
mpiexec (MPICH's hydra, through a stand-in for PBS's remote start) reaches both hosts."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from helpers import DATA, REPO, CpuTorchWorld, cli_argv, cli_env, run_cli
from slurm import MultiNodeCluster, sbatch_wait

from envbuilder.system import state

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.multinode]

#: Generous for four torch imports on two busy cores; a hang runs into it.
BOUND_S = 420
#: The exit status of a validation that ran and failed.
VALIDATION_FAILED = 8
CHECKS = "import,nccl,ddp"
NODES = ["n1", "n2"]


def _env(world: CpuTorchWorld, cluster: MultiNodeCluster, **extra: str) -> dict[str, str]:
    return cli_env({**world.env, **cluster.env, **extra})


def _validate_args(*extra: str) -> list[str]:
    return ["validate", "vcpu", "--nodes", "2", "--cpu", "--json", *extra]


def _salloc(*argv: str, tasks_per_node: int = 1) -> list[str]:
    return ["salloc", "--nodes=2", f"--ntasks-per-node={tasks_per_node}", *argv]


def _data(res: subprocess.CompletedProcess[str]) -> dict:
    try:
        return json.loads(res.stdout)["data"]
    except ValueError:
        pytest.fail(f"no JSON (rc {res.returncode}): {res.stderr[-3000:]}")


def _runs(world: CpuTorchWorld) -> set[Path]:
    return set((world.prefix / "envbuilder" / "validation").glob("run-*"))


def _hellos(run_dir: Path) -> dict[int, dict]:
    """Each rank's first event (where it ran, where it met the others)."""
    out = {}
    for path in (run_dir / "ranks").glob("rank-*.jsonl"):
        out[int(path.stem.split("-")[1])] = json.loads(path.read_text().splitlines()[0])
    return out


def _run_dir(world: CpuTorchWorld, data: dict) -> Path:
    """The run directory whose report is ``data``."""
    for run in _runs(world):
        report = run / "report.json"
        if report.exists() and json.loads(report.read_text())["started"] == data["started"]:
            return run
    pytest.fail(f"no run directory holds the report of {data['started']}")


def _passes_across_both_nodes(world: CpuTorchWorld, data: dict) -> None:
    """Every check passed on 2 nodes × 2 ranks, each node's ranks on that node, all meeting at n1."""
    checks = data["checks"]
    for name in CHECKS.split(","):
        assert checks[name]["status"] == "pass", (name, checks[name])
    assert (data["nodes"], data["world"]) == (2, 4)
    assert sorted(data["layout"]) == NODES
    assert all(len(ranks) == 2 for ranks in data["layout"].values()), data["layout"]
    assert sorted(data["hosts"].values()) == ["n1", "n1", "n2", "n2"]
    hellos = _hellos(_run_dir(world, data))
    assert {h["host"] for h in hellos.values()} == set(NODES)
    assert all(h["launched_by"] == "torchrun" for h in hellos.values())
    # The rendezvous is on the allocation's first host, for the ranks on n2 as for those on n1.
    assert [h["master_addr"] for h in hellos.values()] == ["n1"] * 4
    # One torchrun agent per node: two workers each, local ranks 0 and 1 on both nodes.
    for host in NODES:
        assert sorted(h["local_rank"] for h in hellos.values() if h["host"] == host) == [0, 1]
    gloo = checks["nccl"]["per_rank"]["0"]
    assert gloo["backend"] == "gloo" and gloo["world"] == 4


def _one_agent_per_node(command: list[str]) -> None:
    assert command[:4] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--ntasks=2"], command
    assert "--nnodes=2" in command and "--nproc-per-node=2" in command
    assert "--rdzv-backend=c10d" in command


def test_each_node_is_a_host_of_its_own(slurm_nodes: MultiNodeCluster) -> None:
    assert slurm_nodes.node_states() == {"n1": "idle", "n2": "idle"}
    proc = slurm_nodes.client(
        "srun", "--nodes=2", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $(getent hosts n1)"'
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line.split() for line in proc.stdout.splitlines())
    # Each node has its own name, and finds n1 at n1's own loopback address.
    assert lines == [["n1", "127.0.1.1", "n1"], ["n2", "127.0.1.1", "n1"]]
    assert socket.gethostname() not in NODES  # this machine keeps its name


def test_validate_submitted_across_two_nodes(cpu_torch_world, slurm_nodes) -> None:
    args = _validate_args("--submit", "--checks", CHECKS)
    res = run_cli(*args, env={**cpu_torch_world.env, **slurm_nodes.env}, timeout=BOUND_S)
    assert res.returncode == 0, res.stderr
    data = _data(res)
    _passes_across_both_nodes(cpu_torch_world, data)
    _one_agent_per_node(data["command"])
    # The batch script finds the first host itself: the plan keeps it a variable.
    endpoint = data["command"][data["command"].index("--rdzv-endpoint") + 1]
    assert endpoint == "$MASTER_ADDR:$MASTER_PORT"


def test_validate_inside_salloc_across_two_nodes(cpu_torch_world, slurm_nodes) -> None:
    res = subprocess.run(
        _salloc(*cli_argv(*_validate_args("--checks", CHECKS))),
        env=_env(cpu_torch_world, slurm_nodes),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert res.returncode == 0, res.stderr
    data = _data(res)
    _passes_across_both_nodes(cpu_torch_world, data)
    _one_agent_per_node(data["command"])
    # A step of the salloc allocation, with the CPUs the job holds on each node.
    assert "--overlap" not in data["command"]
    cpus = data["command"][data["command"].index("--cpus-per-task") + 1]
    assert cpus.isdigit(), data["command"]


def test_mpi_ranks_on_both_nodes_talk_through_srun_pmi(cpu_torch_world, slurm_nodes) -> None:
    # The ibrun stand-in starts the ranks with `srun --mpi=pmi2`, as in a job at TACC.
    path = f"{REPO / 'tests' / 'shims' / 'tacc'}:{cpu_torch_world.env['PATH']}"
    res = subprocess.run(
        _salloc(
            *cli_argv(*_validate_args("--launcher", "ibrun", "--checks", "import,mpi,nccl")), tasks_per_node=2
        ),
        env=_env(cpu_torch_world, slurm_nodes, PATH=path, IBRUN_USE_SRUN="1"),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert res.returncode == 0, res.stderr
    data = _data(res)
    assert data["command"][:3] == ["ibrun", "-n", "4"]
    mpi = data["checks"]["mpi"]
    assert mpi["status"] == "pass", mpi
    assert mpi["per_rank"]["0"]["library"].startswith("MPICH")
    mapping = {m["rank"]: m["host"] for m in mpi["per_rank"]["0"]["mapping"]}
    assert mapping == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}  # srun's block layout
    assert data["layout"] == {"n1": [0, 1], "n2": [2, 3]}
    assert data["checks"]["nccl"]["status"] == "pass"


def test_a_node_whose_step_dies_is_a_fail_naming_it(cpu_torch_world, slurm_nodes) -> None:
    before = _runs(cpu_torch_world)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        _salloc(*cli_argv(*_validate_args("--checks", CHECKS, "--timeout", "60"))),
        env=_env(cpu_torch_world, slurm_nodes),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_ddp(cpu_torch_world, before, proc)
        killed_at = time.monotonic()
        victims = slurm_nodes.job_pids("n2")
        assert victims, "nothing of the step runs on n2"
        for pid in victims:  # the torchrun agent and its workers on n2, all at once: the node's step dies
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Within a bound: the ranks on n1 see their peers gone, nobody waits for a timeout.
    assert time.monotonic() - killed_at < 60, time.monotonic() - t0
    assert proc.returncode == VALIDATION_FAILED, err
    data = json.loads(out)["data"]
    ddp = data["checks"]["ddp"]
    assert ddp["status"] == "fail"
    # The node that died comes first; the ranks on n1, whose collective failed, lost it. Every rank on n2 is named
    # on n2: one died first (which one depends on the order the kills land); a rank the kill reached after the
    # launcher had already ended it is reported as ended by the launcher while it waited for its dead peer.
    parts = ddp["cause"].split("; ")
    n2 = data["layout"]["n2"]
    said = {rank: next((p for p in parts if p.startswith(f"rank {rank} on n2: ")), "") for rank in n2}
    assert any(f"rank {rank} died during this check" in said[rank] for rank in n2), ddp["cause"]
    for rank in n2:
        assert (
            f"rank {rank} died during this check" in said[rank] or "then the launcher ended it" in said[rank]
        ), ddp["cause"]
    assert any(parts[0].startswith(f"rank {rank} on n2: ") for rank in n2), ddp["cause"]
    assert all(": lost ranks " in p for p in parts if " on n1: " in p), ddp["cause"]
    assert data["checks"]["import"]["status"] == "pass"
    # The bed is whole again for whatever runs next.
    deadline = time.monotonic() + 60
    while slurm_nodes.node_states() != {"n1": "idle", "n2": "idle"} and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm_nodes.node_states() == {"n1": "idle", "n2": "idle"}


def _wait_for_ddp(world: CpuTorchWorld, before: set[Path], proc: subprocess.Popen[str]) -> None:
    """Until all four ranks of the new run have started the DDP check (they have met and trained a step)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for run in _runs(world) - before:
            files = list((run / "ranks").glob("rank-*.jsonl"))
            if len(files) == 4 and all('"check": "ddp"' in f.read_text() for f in files):
                return
        time.sleep(0.2)
    pytest.fail("the ranks never reached the DDP check")


TRAIN = """\
import os, socket, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
line = f"rank {dist.get_rank()}/{dist.get_world_size()} sum={t.item():g} host={socket.gethostname()} "
line += f"local={os.environ['LOCAL_RANK']} master={os.environ['MASTER_ADDR']}"
sys.stdout.write(line + "\\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("how", ["salloc", "sbatch"])
def test_run_puts_the_program_on_both_nodes(cpu_torch_world, slurm_nodes, tmp_path, how) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    argv = cli_argv("run", "vcpu", "--nodes", "2", "--gpus-per-node", "2", "--", "train.py")
    env = _env(cpu_torch_world, slurm_nodes)
    if how == "salloc":
        res = subprocess.run(
            _salloc(*argv), env=env, capture_output=True, text=True, timeout=BOUND_S, cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr
        output = res.stdout
    else:
        job, out = tmp_path / "job.sh", tmp_path / "job.out"
        job.write_text("#!/bin/bash\n" + shlex.join(argv) + "\n")
        res = sbatch_wait(
            ["--nodes=2", "--ntasks-per-node=1", f"--output={out}", str(job)],
            env=env,
            timeout=BOUND_S,
            cwd=tmp_path,
        )
        output = out.read_text() if out.exists() else ""
        assert res.returncode == 0, output or res.stderr
    # "rank 0/4 sum=10 host=n1 local=0 master=n1": one world of 2 nodes × 2 ranks, all meeting at n1.
    ranks = sorted(line.split()[1:] for line in output.splitlines() if line.startswith("rank "))
    assert [r[0] for r in ranks] == ["0/4", "1/4", "2/4", "3/4"], output
    assert {r[1] for r in ranks} == {"sum=10"} and {r[4] for r in ranks} == {"master=n1"}
    local_ranks: dict[str, list[str]] = {}
    for r in ranks:
        local_ranks.setdefault(r[2], []).append(r[3])
    both = ["local=0", "local=1"]
    assert {host: sorted(v) for host, v in local_ranks.items()} == {"host=n1": both, "host=n2": both}, ranks


@pytest.fixture
def pbs_site(cpu_torch_world: CpuTorchWorld, tmp_path: Path) -> Iterator[str]:
    """The session env recorded again as "vpbsnodes", under a recipe whose scheduler is PBS (as Polaris's is):
    the recipe path that finds it. The record goes after the test (the session's env is shared: a later `create
    vcpu` would find another env recorded at its prefix)."""
    recipe_path = _pbs_site(cpu_torch_world, tmp_path / "recipes")
    yield recipe_path
    state.record_path(Path(cpu_torch_world.env["ENVBUILDER_HOME"]), "vpbsnodes").unlink(missing_ok=True)


def _pbs_site(world: CpuTorchWorld, recipes: Path) -> str:
    """The recipe and record of ``pbs_site``; returns the recipe path."""
    text = (DATA / "validate-recipes" / "vcpu.toml").read_text()
    text = text.replace('name = "vcpu"', 'name = "vpbsnodes"')
    recipes.mkdir()
    (recipes / "vpbsnodes.toml").write_text(
        text.replace('type = "slurm"\nbatch = "sbatch"', 'type = "pbs"\nbatch = "qsub"')
    )
    home = Path(world.env["ENVBUILDER_HOME"])
    state.save(home, dataclasses.replace(state.load(home, "vcpu"), name="vpbsnodes", recipe="vpbsnodes"))
    return f"{DATA / 'validate-recipes'}:{recipes}"


def test_pbs_job_mpiexec_reaches_both_hosts(cpu_torch_world, slurm_nodes, pbs_site, tmp_path) -> None:
    """A PBS site's validation across two hosts, through the mpiexec argv envbuilder builds for PBS (Polaris's
    shape: ``mpiexec -n WORLD --ppn RANKS_PER_NODE PROGRAM``). No PBS runs here, so its parts are stood in for:
    the job is its environment (PBS_JOBID, and a PBS_NODEFILE listing n1 and n2: envbuilder takes the first host
    for the ranks' rendezvous from it, hydra the hosts), its script runs on the job's first node, n1, and
    tests/shims/pbs/pbs_tmrsh is the remote start (PBS Pro's pbs_tmrsh; PALS does its own), which here enters a
    node's UTS and mount namespaces. The mpiexec is MPICH's hydra from the env (the mpich wheel), pointed at
    pbs_tmrsh through its environment (HYDRA_LAUNCHER=rsh, HYDRA_LAUNCHER_EXEC), as a site whose hydra lacks PBS's
    TM interface does: the argv is envbuilder's, untouched. Cray PALS's --depth and --cpu-bind have no hydra
    counterpart (hydra refuses both as unknown options), so this recipe sets neither; their argv is covered
    by the launcher's exact-argv unit tests. The recipe names torchrun, which reaches one node: envbuilder
    launches the two nodes through the PBS site's node launcher, mpiexec."""
    recipe_path = pbs_site
    nodes, nodefile = tmp_path / "nodes", tmp_path / "PBS_NODEFILE"
    nodes.write_text("".join(f"{name} {slurm_nodes.host_pid(name)}\n" for name in NODES))
    nodefile.write_text("".join(f"{name}\n" for name in NODES))
    tmrsh = str(REPO / "tests" / "shims" / "pbs" / "pbs_tmrsh")
    job = {
        "ENVBUILDER_RECIPE_PATH": recipe_path,
        "PBS_JOBID": "7.pbs-shim",
        "PBS_NODEFILE": str(nodefile),
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_O_WORKDIR": str(tmp_path),
        "NCPUS": "2",
        "PBS_SHIM_NODES": str(nodes),
        "HYDRA_LAUNCHER": "rsh",
        "HYDRA_LAUNCHER_EXEC": tmrsh,
    }
    checks = "import,mpi,nccl,ddp"
    argv = cli_argv("validate", "vpbsnodes", "--nodes", "2", "--cpu", "--json", "--checks", checks)
    res = subprocess.run(
        [tmrsh, "n1", *argv],
        env=cli_env({**cpu_torch_world.env, **job}),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    data = _data(res)
    assert data["command"][:5] == ["mpiexec", "-n", "4", "--ppn", "2"], data["command"]
    for name in checks.split(","):
        assert data["checks"][name]["status"] == "pass", (name, data["checks"][name])
    assert (data["nodes"], data["world"]) == (2, 4)
    assert data["layout"] == {"n1": [0, 1], "n2": [2, 3]}  # hydra's block layout, two per host
    mpi = data["checks"]["mpi"]["per_rank"]["0"]
    assert {m["rank"]: m["host"] for m in mpi["mapping"]} == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    hellos = _hellos(_run_dir(cpu_torch_world, data))
    assert {r: h["host"] for r, h in hellos.items()} == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    assert all(h["launched_by"] == "mpi" for h in hellos.values())
    # The ranks meet at the job's first host, which envbuilder read from $PBS_NODEFILE.
    assert [h["master_addr"] for h in hellos.values()] == ["n1"] * 4
    for host in NODES:
        assert sorted(h["local_rank"] for h in hellos.values() if h["host"] == host) == [0, 1]
    assert data["checks"]["nccl"]["per_rank"]["0"]["world"] == 4
