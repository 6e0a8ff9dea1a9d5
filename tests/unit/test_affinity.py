"""The affinity check (pure): the verdict merged from the ranks' records, and the payload's readers of /sys."""

from __future__ import annotations

import os
import sys

from helpers import REPO

from envbuilder.validate import affinity, junit, report

sys.path.insert(0, str(REPO / "envbuilder" / "payloads"))
import envbuilder_facts as facts

# Polaris (../shared/reference/sites.md §5.1): one EPYC 7543P, 32 cores / 64 threads, CPU n and n+32 SMT siblings,
# four NUMA nodes of 8 cores; GPU0 nearest CPUs 24-31 (NUMA 3), GPU1 16-23, GPU2 8-15, GPU3 0-7 (NUMA 0). The bus
# ids are illustrative.
POLARIS_GPU_NUMA = {0: 3, 1: 2, 2: 1, 3: 0}
POLARIS_BUS = {0: "0000:07:00.0", 1: "0000:46:00.0", 2: "0000:85:00.0", 3: "0000:c7:00.0"}


def polaris_rank(cpus: range, gpu: int, omp: int) -> dict:
    """What check_affinity records on a Polaris node for a rank bound to ``cpus`` and given ``gpu``."""
    node = POLARIS_GPU_NUMA[gpu]
    return {
        "status": "pass",
        "host": "x3006c0s13b1n0",
        "cpus": list(cpus),
        "cores": [f"{c % 32},{c % 32 + 32}" for c in cpus],
        "numa": sorted({c % 32 // 8 for c in cpus}),
        "numa_nodes": 4,
        "omp_num_threads": omp,
        "gpu": {
            "index": 0,
            "bus_id": POLARIS_BUS[gpu],
            "numa": node,
            "cpus": [*range(8 * node, 8 * node + 8), *range(32 + 8 * node, 40 + 8 * node)],
        },
    }


def reverse_map(local_rank: int) -> int:
    # ALCF's set_affinity_gpu_polaris.sh: CUDA_VISIBLE_DEVICES = num_gpus - 1 - local rank
    return 3 - local_rank


def test_polaris_depth_16_with_the_reverse_map_fails():
    # --depth 16 --cpu-bind depth: CPUs 0-15, 16-31, then the SMT siblings 32-47 and 48-63.
    ranks = {r: polaris_rank(range(16 * r, 16 * r + 16), reverse_map(r), 16) for r in range(4)}
    verdict = affinity.judge(ranks)
    assert verdict.status == "fail"
    assert (
        "rank 1: CPUs 16-31 (NUMA 2,3) are all on other NUMA nodes than its GPU: its GPU 0000:85:00.0 is on "
        "NUMA 1 (nearest CPUs 8-15,40-47)" in verdict.cause
    )
    assert "rank 2: CPUs 32-47 (NUMA 0,1) are all on other NUMA nodes" in verdict.cause
    assert (
        "rank 0 (CPUs 0-15) and rank 2 (CPUs 32-47) share 16 physical core(s): SMT siblings" in verdict.cause
    )
    assert "rank 1 (CPUs 16-31) and rank 3 (CPUs 48-63) share 16 physical core(s)" in verdict.cause
    assert "one rank per NUMA domain" in verdict.hint
    assert verdict.detail.startswith("rank 0: cpus 0-15 numa 0,1, gpu numa 0, omp 16; rank 1: cpus 16-31")


def test_polaris_depth_8_with_the_reverse_map_passes():
    ranks = {r: polaris_rank(range(8 * r, 8 * r + 8), reverse_map(r), 8) for r in range(4)}
    verdict = affinity.judge(ranks)
    assert (verdict.status, verdict.cause) == ("pass", None)
    assert verdict.detail == (
        "rank 0: cpus 0-7 numa 0, gpu numa 0, omp 8; rank 1: cpus 8-15 numa 1, gpu numa 1, omp 8; "
        "rank 2: cpus 16-23 numa 2, gpu numa 2, omp 8; rank 3: cpus 24-31 numa 3, gpu numa 3, omp 8"
    )


def test_polaris_depth_8_with_the_identity_map_fails_on_numa_only():
    # The seed's CUDA_VISIBLE_DEVICES=$PMI_LOCAL_RANK: rank 0 on CPUs 0-7 gets GPU0, the farthest one.
    verdict = affinity.judge({r: polaris_rank(range(8 * r, 8 * r + 8), r, 8) for r in range(4)})
    assert verdict.status == "fail"
    assert "rank 0: CPUs 0-7 (NUMA 0) are all on other NUMA nodes" in verdict.cause
    assert "share" not in verdict.cause


def test_a_rank_spanning_its_gpus_node_and_another_warns():
    ranks = {0: polaris_rank(range(16), 3, 1)}
    verdict = affinity.judge(ranks)
    assert verdict.status == "warn"
    assert (
        "rank 0: CPUs 0-15 (NUMA 0,1) span several NUMA nodes; its GPU 0000:c7:00.0 is on NUMA 0"
        in verdict.cause
    )


def cpu_rank(cpus: list[int], omp=None, host="n1", cores=None) -> dict:
    """A CPU run's record on a host without SMT (this test machine's kind): each CPU its own core."""
    return {
        "status": "pass",
        "host": host,
        "cpus": cpus,
        "cores": cores if cores is not None else [str(c) for c in cpus],
        "numa": [0],
        "numa_nodes": 1,
        "omp_num_threads": omp,
    }


def test_cpu_run_ranks_on_one_core_fail_and_unbound_ranks_pass():
    same = affinity.judge({0: cpu_rank([0]), 1: cpu_rank([0])})
    assert same.status == "fail"
    assert same.cause.startswith("ranks 0,1 are bound to the same 1 core(s) (CPUs 0)")
    assert affinity.judge({0: cpu_rank([0], 1), 1: cpu_rank([1], 1)}).status == "pass"
    # torchrun's workers, unbound: both may use both cores, and the kernel spreads them.
    unbound = affinity.judge({0: cpu_rank([0, 1], 1), 1: cpu_rank([0, 1], 1)})
    assert (unbound.status, unbound.detail) == (
        "pass",
        "rank 0: cpus 0-1 numa 0, omp 1; rank 1: cpus 0-1 numa 0, omp 1",
    )
    # Overlapping but different sets are a binding error; another host's CPU 0 is another CPU.
    assert (
        "share 1 physical core(s): the same CPUs"
        in affinity.judge({0: cpu_rank([0, 1]), 1: cpu_rank([1])}).cause
    )
    assert affinity.judge({0: cpu_rank([0]), 1: cpu_rank([0], host="n2")}).status == "pass"


def test_oversubscription_and_omp_beyond_a_ranks_cpus_warn():
    over = affinity.judge({0: cpu_rank([0, 1], 2), 1: cpu_rank([0, 1], 2)})
    assert over.status == "warn"
    assert over.cause == "n1: 2 rank(s) x OMP threads = 4 threads on 2 CPU(s)"
    assert "OMP_NUM_THREADS" in over.hint
    own = affinity.judge({0: cpu_rank([0], 2), 1: cpu_rank([1], 1)})
    assert own.cause.startswith("rank 0: OMP_NUM_THREADS=2 exceeds its 1 CPU(s)")


def test_unknown_topology_is_judged_on_what_is_known():
    # A container without /sys: no cores, no NUMA, no GPU node. Identical CPUs still count as shared.
    blind = {"status": "pass", "host": "c", "cpus": [0], "cores": [None], "numa": None, "numa_nodes": None}
    gpu = {**blind, "gpu": {"index": 0, "bus_id": None, "numa": None, "cpus": None}}
    verdict = affinity.judge({0: gpu, 1: {**blind, "cpus": [1], "cores": [None]}})
    assert (verdict.status, verdict.detail) == (
        "pass",
        "rank 0: cpus 0 numa ?, gpu numa ?; rank 1: cpus 1 numa ?",
    )
    assert affinity.judge({0: blind, 1: blind}).status == "fail"


def _events(record: dict) -> list[dict]:
    return [
        {"event": "hello"},
        {"event": "start", "check": "affinity"},
        {"event": "result", "check": "affinity", **record},
        {"event": "end", "ok": True},
    ]


def test_the_report_judges_the_affinity_row_and_keeps_warnings_out_of_failures():
    records = {r: polaris_rank(range(16 * r, 16 * r + 16), reverse_map(r), 16) for r in range(4)}
    rows = report.merge(["affinity"], {r: _events(rec) for r, rec in records.items()}, 4, 0)
    row = rows[1]
    assert (row.check, row.status, row.ranks) == ("affinity", "fail", (0, 1, 2, 3))
    assert row.to_json()["detail"].startswith("rank 0: cpus 0-15")
    warned = report.merge(["affinity"], {0: _events(cpu_rank([0], 4))}, 1, 0)[1]
    assert warned.status == "warn"
    result = report.Report(
        "e", "torchrun", "cpu", 1, 1, (), (report.Row("import", "pass", (0,)), warned), 1.0, 0, "here", "t"
    )
    assert result.ok and result.failed == []
    assert "warning: rank 0: OMP_NUM_THREADS=4 exceeds its 1 CPU(s)" in junit.junit(result)


# --- the payload's readers ------------------------------------------------------------------------------------


def test_cpu_lists_and_pci_addresses():
    assert facts.cpulist("0-3,32-35\n") == [0, 1, 2, 3, 32, 33, 34, 35]
    assert facts.cpulist("") == []
    assert affinity.cpu_text([35, 0, 1, 2, 3, 32, 33, 34, 7]) == "0-3,7,32-35"
    assert facts.pci_address("00000000:C7:00.0") == "0000:c7:00.0"  # nvidia-smi's 8-digit domain
    assert facts.pci_address("0000:07:00.0") == "0000:07:00.0"
    assert (
        facts.omp_threads("8,4") == 8 and facts.omp_threads(None) is None and facts.omp_threads("x") is None
    )


def test_placement_where_sys_says_nothing_is_unknown(tmp_path):
    # A container that hides /sys/devices and /sys/bus: the CPUs come from the kernel, the rest is unknown.
    placed = facts.cpu_placement(str(tmp_path))
    assert placed == {
        "cpus": sorted(os.sched_getaffinity(0)),
        "cores": [None] * len(os.sched_getaffinity(0)),
        "numa": None,
        "numa_nodes": None,
    }
    assert facts.gpu_placement("00000000:17:00.0", str(tmp_path)) == {
        "bus_id": "0000:17:00.0",
        "numa": None,
        "cpus": None,
    }


def test_placement_reads_a_sysfs_tree(tmp_path):
    # The files the kernel writes, for a host with SMT (CPU n and n+2 siblings) and a GPU on node 1.
    for cpu in range(4):
        topo = tmp_path / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(f"{cpu % 2},{cpu % 2 + 2}\n")
    for node, cpus in ((0, "0,2"), (1, "1,3")):
        (tmp_path / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True)
        (tmp_path / "devices" / "system" / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    gpu = tmp_path / "bus" / "pci" / "devices" / "0000:c7:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text("1\n")
    (gpu / "local_cpulist").write_text("1,3\n")
    assert facts.cpu_core(2, str(tmp_path)) == "0,2"
    assert facts.numa_nodes(str(tmp_path)) == {0: 0, 2: 0, 1: 1, 3: 1}
    assert facts.gpu_placement("00000000:C7:00.0", str(tmp_path)) == {
        "bus_id": "0000:c7:00.0",
        "numa": 1,
        "cpus": [1, 3],
    }


# --- horovodrun --check-build -----------------------------------------------------------------------------------

# The shape of Horovod's own report (horovod/runner/launch.py, check_build), as its users' guides show it.
CHECK_BUILD = """
Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [ ] Gloo

Available Tensor Operations:
    [X] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [ ] Gloo
"""


def test_check_build_report_is_parsed_by_section():
    built = facts.check_build(CHECK_BUILD)
    assert built["frameworks"] == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert built["controllers"] == {"MPI": True, "Gloo": False}
    assert [n for n, ok in built["tensor operations"].items() if ok] == ["NCCL", "MPI"]
    assert facts.check_build("horovodrun: command failed\n") == {}


def test_horovodrun_beside_the_python_comes_before_path(tmp_path, monkeypatch):
    name = "horovodrun"
    env_bin, other = tmp_path / "env" / "bin", tmp_path / "other"
    for directory in (env_bin, other):
        directory.mkdir(parents=True)
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(other))
    assert facts.horovodrun(str(env_bin / "python")) == str(env_bin / name)
    (env_bin / name).unlink()
    assert facts.horovodrun(str(env_bin / "python")) == str(other / name)
