"""NIC locality in the affinity check: the payload's readers of /sys (on tests/data/topology/polaris, a Polaris node
rebuilt from ALCF's documentation, and on trees built here), NCCL_IB_HCA / NCCL_SOCKET_IFNAME as NCCL reads them,
and the report's pick and warnings (envbuilder/validate/nic.py) on records the real readers made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from envbuilder.validate import affinity, nic

sys.path.insert(0, str(REPO / "envbuilder" / "payloads"))
import envbuilder_facts as facts
import envbuilder_nics as nics

POLARIS = str(REPO / "tests" / "data" / "topology" / "polaris")
#: GPU n's PCI address in the Polaris tree (PCI order: CUDA's numbering there).
POLARIS_GPUS = ["0000:07:00.0", "0000:46:00.0", "0000:85:00.0", "0000:c7:00.0"]


def record(
    sysfs: str, cpus: list[int], gpu: str, env: dict[str, str] | None = None, host: str = "n0"
) -> dict:
    """What check_affinity records for a rank bound to ``cpus`` and given ``gpu``, read by the payload's own
    readers from ``sysfs``."""
    nodes = facts.numa_nodes(sysfs)
    placed = facts.gpu_placement(gpu, sysfs)
    return {
        "status": "pass",
        "host": host,
        "cpus": cpus,
        "cores": [None] * len(cpus),
        "numa": sorted({nodes[c] for c in cpus}),
        "numa_nodes": len(set(nodes.values())),
        "network": nics.network(sysfs, env or {}),
        "gpu": {"index": 0, **placed, "path": nics.pci_path(sysfs, placed["bus_id"])},
    }


def polaris_cpus(gpu: int) -> list[int]:
    """The 8 cores nearest GPU n (its NUMA node's first threads)."""
    node = 3 - gpu
    return list(range(8 * node, 8 * node + 8))


# --- NCCL's device lists ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "port", "kept"),
    [
        ("mlx5_0:1,mlx5_1", "mlx5_0", 1, True),
        ("mlx5_0:1,mlx5_1", "mlx5_0", 2, False),  # only port 1 of mlx5_0
        ("mlx5_0:1,mlx5_1", "mlx5_1", 2, True),  # every port of mlx5_1
        ("mlx5_0:1,mlx5_1", "mlx5_10", 1, True),  # a prefix: mlx5_1 also names mlx5_10
        ("mlx5_0:1,mlx5_1", "mlx5_2", 1, False),
        ("=mlx5_1", "mlx5_10", 1, False),  # = matches whole names
        ("=mlx5_1", "mlx5_1", 1, True),
        ("^mlx5_0", "mlx5_0", 1, False),
        ("^mlx5_0", "mlx5_1", 1, True),
        ("^=mlx5_1", "mlx5_10", 1, True),
        ("^=mlx5_1", "mlx5_1", 1, False),
        ("^mlx5_0:2", "mlx5_0", 1, True),  # excludes port 2 only
        (" mlx5_0 , ", "mlx5_0", 1, True),
    ],
)
def test_nccl_ib_hca_syntax(text, name, port, kept):
    assert nic.parse_selector(text).keeps(name, port) is kept


@pytest.mark.parametrize(
    ("text", "name", "kept"),
    [
        ("hsn", "hsn1", True),
        ("hsn", "eth0", False),
        ("=hsn1", "hsn1", True),
        ("=hsn1", "hsn10", False),
        ("^docker,lo", "lo", False),
        ("^docker,lo", "docker0", False),
        ("^docker,lo", "eth0", True),
        ("^=eth", "eth0", True),
        ("eth0:1", "eth0", True),  # an interface has no port: the text after ':' is ignored
    ],
)
def test_nccl_socket_ifname_syntax(text, name, kept):
    assert nic.parse_selector(text, ports=False).keeps(name) is kept


# --- the readers on the Polaris tree ----------------------------------------------------------------------------


def test_polaris_tree_is_read_as_documented():
    network = nics.network(POLARIS, {"NCCL_NET": "AWS Libfabric", "PATH": "/bin"})
    by_name = {d["name"]: d for d in network["devices"]}
    assert sorted(by_name) == ["cxi0", "cxi1", "hsn0", "hsn1", "lo"]
    assert (by_name["cxi0"]["numa"], by_name["cxi0"]["pci"], by_name["cxi0"]["cpulist"]) == (
        0,
        "0000:c1:00.0",
        "0-7,32-39",
    )
    assert by_name["hsn1"]["numa"] == 2 and by_name["hsn1"]["path"] == [
        "pci0000:40",
        "0000:40:01.1",
        "0000:41:00.0",
    ]
    assert by_name["lo"]["pci"] is None and by_name["lo"]["numa"] is None
    assert network["gpus"] == [{"bus_id": a, "numa": n} for a, n in zip(POLARIS_GPUS, (3, 2, 1, 0))]
    assert network["env"] == {"NCCL_NET": "AWS Libfabric"}


def test_visible_gpu_follows_cuda_visible_devices_in_pci_order():
    assert nics.visible_gpu(POLARIS, "3,2,1,0", 1) == POLARIS_GPUS[2]
    assert nics.visible_gpu(POLARIS, "2", 0) == POLARIS_GPUS[2]
    assert nics.visible_gpu(POLARIS, "0,2", 3) == POLARIS_GPUS[2]  # local rank 3 of 2 GPUs: as cuda:{3 % 2}
    assert nics.visible_gpu(POLARIS, "GPU-5a1e", 0) is None  # UUIDs: torch or nvidia-smi must say
    assert nics.visible_gpu(POLARIS, "7", 0) is None
    assert nics.visible_gpu(POLARIS, None, 0) is None


# --- the pick and the warnings ------------------------------------------------------------------------------------


def test_polaris_four_ranks_with_the_reverse_map_pass_and_name_each_nic():
    # ALCF's map: local rank r on GPU 3-r, bound to the CPUs nearest it.
    ranks = {r: record(POLARIS, polaris_cpus(3 - r), POLARIS_GPUS[3 - r]) for r in range(4)}
    verdict = affinity.judge(ranks)
    assert verdict.status == "pass", verdict.cause
    assert [verdict.nics[r]["name"] for r in range(4)] == ["cxi0", "cxi0", "cxi1", "cxi0"]
    assert verdict.nics[0] == {
        "transport": "ofi",
        "name": "cxi0",
        "pci": "0000:c1:00.0",
        "numa": 0,
        "path": "PHB",
        "ties": [],
        "left_out": {},
    }
    assert verdict.nics[1]["path"] == "SYS" and verdict.nics[1]["ties"] == ["cxi1"]
    assert "rank 0: cpus 0-7 numa 0, gpu numa 0, nic cxi0 numa 0 (PHB)" in verdict.detail
    # GPU2 (NUMA 1) has no NIC of its own: said, not warned of, as nothing can be done about it with 4 ranks.
    assert "rank 1: cpus 8-15 numa 1, gpu numa 1, nic cxi0 numa 0 (SYS) [no NIC on NUMA 1]" in verdict.detail
    assert "rank 2: cpus 16-23 numa 2, gpu numa 2, nic cxi1 numa 2 (PHB)" in verdict.detail


def test_polaris_two_ranks_on_the_far_gpus_warn():
    # CUDA_VISIBLE_DEVICES=0,2: both ranks far from both NICs while GPU1 and GPU3 sit beside them unused.
    ranks = {r: record(POLARIS, polaris_cpus(g), POLARIS_GPUS[g]) for r, g in enumerate((0, 2))}
    verdict = affinity.judge(ranks)
    assert verdict.status == "warn"
    assert verdict.cause.startswith(
        "rank 0: GPU 0000:07:00.0 on NUMA 3, its NIC cxi0 on NUMA 0; GPU(s) 0000:46:00.0, 0000:c7:00.0 share a "
        "NUMA node with a NIC and no rank on this host uses them"
    ), verdict.cause
    assert "rank 1: GPU 0000:85:00.0 on NUMA 1, its NIC cxi0 on NUMA 0" in verdict.cause
    assert verdict.hint.startswith("bind ranks to the GPUs nearest the NICs")
    # The same two ranks on the near GPUs pass.
    near = {r: record(POLARIS, polaris_cpus(g), POLARIS_GPUS[g]) for r, g in enumerate((1, 3))}
    assert affinity.judge(near).status == "pass"


def test_polaris_socket_ifname_leaving_out_the_near_interface_warns():
    env = {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "=hsn1"}
    verdict = affinity.judge({0: record(POLARIS, polaris_cpus(3), POLARIS_GPUS[3], env)})
    assert verdict.status == "warn"
    assert verdict.cause == (
        "rank 0: GPU 0000:c7:00.0 on NUMA 0, its NIC hsn1 on NUMA 2 (NCCL_SOCKET_IFNAME==hsn1 leaves out hsn0 "
        "on NUMA 0)"
    )
    assert verdict.hint.startswith(
        "set NCCL_SOCKET_IFNAME so that it keeps hsn0 (NCCL_SOCKET_IFNAME==hsn1,hsn0)"
    )
    assert verdict.detail.endswith(
        ", nic hsn1 numa 2 (SYS)"
    )  # hsn0 is there, left out: not "no NIC on NUMA 0"
    assert verdict.nics[0]["transport"] == "socket" and verdict.nics[0]["left_out"] == {
        "hsn0": "NCCL_SOCKET_IFNAME"
    }
    # Unset, the socket transport takes the near interface; lo is never a candidate.
    unset = affinity.judge({0: record(POLARIS, polaris_cpus(3), POLARIS_GPUS[3], {"NCCL_NET": "Socket"})})
    assert (unset.status, unset.nics[0]["name"], unset.nics[0]["path"]) == ("pass", "hsn0", "PHB")
    empty = affinity.judge(
        {0: record(POLARIS, polaris_cpus(3), POLARIS_GPUS[3], {**env, "NCCL_SOCKET_IFNAME": " "})}
    )
    assert (empty.status, empty.nics[0]["name"]) == ("pass", "hsn0")


# --- an InfiniBand node built here ------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _pci(root: Path, where: str, *, numa: int, cpus: str, vendor: str, klass: str) -> Path:
    device = root / "devices" / where
    for name, text in (
        ("numa_node", str(numa)),
        ("local_cpulist", cpus),
        ("vendor", vendor),
        ("class", klass),
    ):
        _write(device / name, text)
    link = root / "bus" / "pci" / "devices" / device.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(device, link.parent))
    return device


def _hca(root: Path, where: str, *, name: str, numa: int, cpus: str, states: dict[str, str]) -> None:
    device = _pci(root, where, numa=numa, cpus=cpus, vendor="0x15b3", klass="0x020700")
    hca = device / "infiniband" / name
    for port, state in states.items():
        _write(hca / "ports" / port / "state", state)
        _write(hca / "ports" / port / "link_layer", "InfiniBand")
    (hca / "device").symlink_to(os.path.relpath(device, hca))
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    (root / "class" / "infiniband" / name).symlink_to(os.path.relpath(hca, root / "class" / "infiniband"))


@pytest.fixture
def two_socket(tmp_path: Path) -> str:
    """Two sockets of 4 CPUs; GPU0 and mlx5_0 behind one PCIe switch on socket 0, GPU1 on socket 1 beside mlx5_1
    (another root port of its root complex), mlx5_2 on socket 1 with no active port."""
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        _write(tmp_path / "devices" / "system" / "node" / f"node{node}" / "cpulist", cpus)
    switch = "pci0000:00/0000:00:01.0/0000:01:00.0"
    gpu = {"vendor": "0x10de", "klass": "0x030200"}
    _pci(tmp_path, f"{switch}/0000:02:00.0/0000:03:00.0", numa=0, cpus="0-3", **gpu)
    socket0 = {"numa": 0, "cpus": "0-3"}
    _hca(tmp_path, f"{switch}/0000:02:01.0/0000:04:00.0", name="mlx5_0", states={"1": "4: ACTIVE"}, **socket0)
    _pci(tmp_path, "pci0000:80/0000:80:01.0/0000:81:00.0", numa=1, cpus="4-7", **gpu)
    socket1 = {"numa": 1, "cpus": "4-7"}
    _hca(
        tmp_path,
        "pci0000:80/0000:80:02.0/0000:82:00.0",
        name="mlx5_1",
        states={"1": "4: ACTIVE", "2": "1: DOWN"},
        **socket1,
    )
    _hca(tmp_path, "pci0000:80/0000:80:03.0/0000:83:00.0", name="mlx5_2", states={"1": "1: DOWN"}, **socket1)
    return str(tmp_path)


def test_ib_path_types_from_the_pci_tree(two_socket):
    r0 = record(two_socket, [0, 1], "0000:03:00.0")
    r1 = record(two_socket, [4, 5], "0000:81:00.0")
    hcas = {d["name"]: d for d in r0["network"]["devices"]}
    assert hcas["mlx5_1"]["ports"] == {"1": "ACTIVE", "2": "DOWN"}
    assert nic.path_type(r0["gpu"], hcas["mlx5_0"]) == "PXB"  # two bridges of one switch
    assert nic.path_type(r1["gpu"], hcas["mlx5_1"]) == "PHB"
    assert nic.path_type(r0["gpu"], hcas["mlx5_1"]) == "SYS"
    verdict = affinity.judge({0: r0, 1: r1})
    assert verdict.status == "pass", verdict.cause
    assert [(verdict.nics[r]["transport"], verdict.nics[r]["name"]) for r in (0, 1)] == [
        ("ib", "mlx5_0"),
        ("ib", "mlx5_1"),
    ]
    # mlx5_2 has no active port: never a candidate, even where NCCL_IB_HCA names only it.
    only = affinity.judge({0: record(two_socket, [4, 5], "0000:81:00.0", {"NCCL_IB_HCA": "=mlx5_2"})})
    assert only.nics[0]["name"] is None and only.detail.endswith(", no ib NIC")


def test_ib_hca_leaving_out_the_near_hca_warns(two_socket):
    verdict = affinity.judge({1: record(two_socket, [4, 5], "0000:81:00.0", {"NCCL_IB_HCA": "mlx5_0:1"})})
    assert verdict.status == "warn"
    assert verdict.cause == (
        "rank 1: GPU 0000:81:00.0 on NUMA 1, its NIC mlx5_0 on NUMA 0 (NCCL_IB_HCA=mlx5_0:1 leaves out mlx5_1 on NUMA "
        "1)"
    )
    assert verdict.hint.startswith("set NCCL_IB_HCA so that it keeps mlx5_1 (NCCL_IB_HCA=mlx5_0:1,mlx5_1)")
    # An exclusion: the hint takes the near HCA out of it.
    for value, hint in (
        ("^mlx5_1", "unset NCCL_IB_HCA: "),
        ("^=mlx5_1,mlx5_2", "set NCCL_IB_HCA so that it keeps mlx5_1 (NCCL_IB_HCA=^=mlx5_2), or unset it: "),
    ):
        excluded = affinity.judge({1: record(two_socket, [4, 5], "0000:81:00.0", {"NCCL_IB_HCA": value})})
        assert excluded.status == "warn" and excluded.nics[1]["name"] == "mlx5_0"
        assert excluded.hint.startswith(hint), excluded.hint
    # Only port 2 of mlx5_1, which is down: mlx5_1 is left out all the same (mlx5_2, no port active, is no
    # candidate at all, so not left out by the variable).
    port2 = affinity.judge(
        {1: record(two_socket, [4, 5], "0000:81:00.0", {"NCCL_IB_HCA": "mlx5_1:2,mlx5_0"})}
    )
    assert port2.status == "warn" and port2.nics[1]["left_out"] == {"mlx5_1": "NCCL_IB_HCA"}


def test_ib_disabled_or_socket_falls_back_to_interfaces(two_socket):
    rec = record(two_socket, [0, 1], "0000:03:00.0", {"NCCL_IB_DISABLE": "1"})
    assert nic.pick(rec) == nic.Pick("socket", None, "?", (), {}, frozenset())
    # A record without network devices (a container hiding /sys/class) names no NIC.
    rec["network"]["devices"] = []
    assert nic.pick(rec) is None


# --- scripts/capture_topology.sh ----------------------------------------------------------------------------------


def _capture(tmp_path: Path, *sys_root: str) -> Path:
    """Run the capture script (on ``--sys DIR`` if given) and unpack its tar; the unpacked directory."""
    out = tmp_path / "out"
    res = subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "capture_topology.sh"),
            *(("--sys", *sys_root) if sys_root else ()),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    (tar,) = out.glob("topology-*.tar.gz")
    assert res.stdout.strip() == str(tar)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-C", str(unpacked), "-xzf", str(tar)], check=True, timeout=60)
    return unpacked


def test_capture_of_the_polaris_tree_reads_the_same(tmp_path):
    unpacked = _capture(tmp_path, POLARIS)
    captured = str(unpacked / "sys")
    assert nics.network(captured, {}) == nics.network(POLARIS, {})
    assert facts.numa_nodes(captured) == facts.numa_nodes(POLARIS)
    links = (unpacked / "sys" / "LINKS").read_text().splitlines()
    assert "class/cxi/cxi0 -> ../../devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0/cxi/cxi0" in links
    assert "bus/pci/devices/0000:07:00.0 -> ../../../devices/pci0000:00/0000:00:03.1/0000:07:00.0" in links
    origin = (unpacked / "ORIGIN").read_text()
    assert f"sysfs: {POLARIS}\n" in origin and "kernel: " in origin


def test_capture_of_this_machine_reads_as_its_sys(tmp_path):
    captured = str(_capture(tmp_path) / "sys")
    assert nics.nics(captured) == nics.nics("/sys")
    assert nics.gpus(captured) == nics.gpus("/sys")
    assert facts.numa_nodes(captured) == facts.numa_nodes("/sys")


def test_socket_transport_prefers_ib_interfaces_unless_told():
    # Interfaces only (an IPoIB ib0, eth0 on the GPU's node, a docker bridge): NCCL's sockets take ib* first.
    def iface(name: str, numa: int | None, pci: str | None) -> dict:
        return {"name": name, "kind": "net", "pci": pci, "numa": numa, "path": None, "operstate": "up"}

    devices = [
        iface("docker0", None, None),
        iface("eth0", 0, "0000:01:00.0"),
        iface("ib0", 1, "0000:81:00.0"),
    ]
    rec = {
        "gpu": {"bus_id": "0000:03:00.0", "numa": 0},
        "network": {"devices": devices, "env": {}, "gpus": []},
    }
    assert nic.pick(rec).device["name"] == "ib0"
    rec["network"]["env"] = {"NCCL_SOCKET_IFNAME": "^ib"}
    chosen = nic.pick(rec)
    assert (chosen.device["name"], chosen.path, dict(chosen.left_out)) == (
        "eth0",
        "NODE",
        {"ib0": "NCCL_SOCKET_IFNAME"},
    )


H200 = str(REPO / "tests" / "data" / "topology" / "h200-node")


def test_the_captured_h200_node_reads_as_it_was():
    # Captured by scripts/capture_topology.sh on the lent 2x H200 machine (a VM: one NUMA node, the GPUs at
    # 0000:00:06.0 and 0000:00:07.0, one virtio NIC eth0, no InfiniBand): each rank's NIC is eth0 over
    # sockets, next to its GPU's node, and nothing is flagged.
    found = nics.nics(H200)
    assert [d["name"] for d in found if d["kind"] == "net" and d["pci"]] == ["eth0"]
    assert sorted(g["bus_id"] for g in nics.gpus(H200)) == ["0000:00:06.0", "0000:00:07.0"]
    ranks = {r: record(H200, list(range(32)), gpu) for r, gpu in enumerate(("0000:00:06.0", "0000:00:07.0"))}
    verdict = affinity.judge(ranks)
    assert verdict.status == "pass", verdict.cause
    assert [(verdict.nics[r]["transport"], verdict.nics[r]["name"]) for r in range(2)] == [
        ("socket", "eth0")
    ] * 2
