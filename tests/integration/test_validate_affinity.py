"""The affinity check end to end on this machine (2 cores, no SMT): real ranks of the session's CPU torch env,
bound by real tools, judged by the report. ``taskset -c 0`` on envbuilder binds both torchrun workers to one
core; MPICH's Hydra binds each rank to a core of its own (HYDRA_BINDING=core) or both to CPU 0
(HYDRA_BINDING=user:0,0). NIC locality reads tests/data/topology/polaris (ENVBUILDER_SYSFS_ROOT) in place of /sys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from helpers import REPO, cli_argv, cli_env

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


def test_each_rank_reports_its_nic_from_a_sysfs_tree(cpu_torch_world):
    # Both torchrun workers are given GPU3 of the Polaris tree (CUDA_VISIBLE_DEVICES=3: NUMA 0, this machine's
    # CPUs 0-1 there too) and NCCL's socket transport limited to hsn1, on NUMA 2: the report names the NIC and
    # warns that the variable leaves out hsn0, beside the GPU.
    extra = {
        "ENVBUILDER_SYSFS_ROOT": str(REPO / "tests" / "data" / "topology" / "polaris"),
        "CUDA_VISIBLE_DEVICES": "3",
        "NCCL_NET": "Socket",
        "NCCL_SOCKET_IFNAME": "=hsn1",
    }
    res, row = _validate(cpu_torch_world, extra=extra)
    assert res.returncode == 0, res.stderr
    assert row["status"] == "warn", row
    far = "GPU 0000:c7:00.0 on NUMA 0, its NIC hsn1 on NUMA 2 (NCCL_SOCKET_IFNAME==hsn1 leaves out hsn0 on NUMA 0)"
    assert row["cause"] == f"rank 0: {far}; rank 1: {far}"
    assert row["hint"].startswith("set NCCL_SOCKET_IFNAME so that it keeps hsn0")
    for rank in ("0", "1"):
        rec = row["per_rank"][rank]
        assert rec["gpu"]["bus_id"] == "0000:c7:00.0" and rec["gpu"]["source"] == "CUDA_VISIBLE_DEVICES"
        assert rec["numa_nodes"] == 4 and rec["numa"] == [0]
        assert (
            rec["nic"]["name"] == "hsn1" and rec["nic"]["numa"] == 2 and rec["nic"]["transport"] == "socket"
        )
        assert rec["network"]["env"] == {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "=hsn1"}
    assert row["detail"].startswith(
        "rank 0: cpus 0-1 numa 0, gpu numa 0, omp 1, nic hsn1 numa 2 (SYS); rank 1:"
    )
