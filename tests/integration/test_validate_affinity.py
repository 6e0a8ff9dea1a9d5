"""The affinity check end to end on this machine (2 cores, no SMT): real ranks of the session's CPU torch env,
bound by real tools, judged by the report. ``taskset -c 0`` on envbuilder binds both torchrun workers to one
core; MPICH's Hydra binds each rank to a core of its own (HYDRA_BINDING=core) or both to CPU 0
(HYDRA_BINDING=user:0,0)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from helpers import cli_argv, cli_env

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

if len(os.sched_getaffinity(0)) < 2 or not shutil.which("taskset"):
    pytest.skip("needs 2 CPUs and taskset (util-linux)", allow_module_level=True)


def _validate(world, *args: str, bind: tuple[str, ...] = (), extra: dict[str, str] | None = None):
    res = subprocess.run(
        [*bind, *cli_argv("validate", "vcpu", "--json", "--checks", "import,affinity", *args)],
        env=cli_env({**world.env, **(extra or {})}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        return res, json.loads(res.stdout)["data"]["checks"]["affinity"]
    except (ValueError, KeyError):
        pytest.fail(f"no report (rc {res.returncode}): {res.stderr[-2000:]}")


def test_torchrun_workers_confined_to_one_core_fail(cpu_torch_world):
    res, row = _validate(cpu_torch_world, bind=("taskset", "-c", "0"))
    assert res.returncode == 8, res.stderr
    assert row["status"] == "fail"
    assert row["cause"].startswith("ranks 0,1 are bound to the same 1 core(s) (CPUs 0)"), row
    assert [row["per_rank"][r]["cpus"] for r in ("0", "1")] == [[0], [0]]


def test_mpi_ranks_on_a_core_each_pass(cpu_torch_world):
    res, row = _validate(cpu_torch_world, "--launcher", "mpiexec", extra={"HYDRA_BINDING": "core"})
    assert res.returncode == 0, res.stderr
    assert row["status"] == "pass", row
    assert sorted(row["per_rank"][r]["cpus"][0] for r in ("0", "1")) == [0, 1]
    # What /sys says of this machine: each CPU its own core, one NUMA node.
    assert row["per_rank"]["0"]["numa"] == [0] and row["per_rank"]["0"]["numa_nodes"] == 1
    assert row["detail"].startswith("rank 0: cpus ")


def test_mpi_ranks_bound_to_one_cpu_fail(cpu_torch_world):
    res, row = _validate(cpu_torch_world, "--launcher", "mpiexec", extra={"HYDRA_BINDING": "user:0,0"})
    assert res.returncode == 8, res.stderr
    assert row["cause"].startswith("ranks 0,1 are bound to the same 1 core(s) (CPUs 0)"), row
