"""The network devices NCCL could use on this host, and its GPUs, as /sys describes them (the affinity check's
NIC locality). Standard library only; the unit tests import it directly. Reading only: which device NCCL would
pick is judged by envbuilder (``envbuilder/validate/nic.py``) from every rank's record.

Each device says its PCI address, its PCI path from the root complex (``pci0000:c0/0000:c0:01.1/0000:c1:00.0``:
two devices under one root complex are a host bridge apart, under one bridge a switch apart), its NUMA node and
nearest CPUs: InfiniBand/RoCE HCAs (``class/infiniband``, with their ports' states), Slingshot's Cassini NICs
(``class/cxi``) and the network interfaces (``class/net``: ``hsn0``, ``ib0``, ``eth0``; a virtual one has no
PCI device).
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from envbuilder_facts import _listdir, _read, pci_address

#: The NCCL variables that choose the network, as the rank saw them.
NCCL_VARIABLES = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET")

_PCI_NAME = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
#: PCI classes of NVIDIA's GPUs: VGA (0x0300) and 3D controllers (0x0302).
_GPU_CLASSES = ("0x0300", "0x0302")
_NVIDIA = "0x10de"


def pci_path(sysfs: str, address: str) -> Optional[list[str]]:
    """The PCI device's place in /sys/devices, root complex first: ["pci0000:c0", "0000:c0:01.1", address];
    None where /sys does not link it there."""
    real = os.path.realpath(os.path.join(sysfs, "bus", "pci", "devices", address))
    root = os.path.realpath(os.path.join(sysfs, "devices"))
    if not real.startswith(root + os.sep) or not os.path.isdir(real):
        return None
    return real[len(root) + 1 :].split(os.sep)


def pci_device(sysfs: str, address: str) -> dict[str, Any]:
    """A PCI device's address, path, NUMA node and nearest CPUs in the kernel's list format (None: unknown)."""
    base = os.path.join(sysfs, "bus", "pci", "devices", address)
    node = _read(os.path.join(base, "numa_node"))
    near = _read(os.path.join(base, "local_cpulist"))
    return {
        "pci": address,
        "path": pci_path(sysfs, address),
        # -1: the firmware gave the device no node (a single-node host, or a VM)
        "numa": int(node) if node and node.lstrip("-").isdigit() and int(node) >= 0 else None,
        "cpulist": near,
    }


def _device_address(link: str) -> Optional[str]:
    """The PCI address of the device a class device's ``device`` link leads to, or of its nearest PCI ancestor
    (a virtio NIC's ``virtio2`` hangs below its PCI function); None for a virtual one (no link, no PCI)."""
    if not os.path.exists(link):
        return None
    path = os.path.realpath(link)
    while path != os.path.dirname(path):
        if _PCI_NAME.match(os.path.basename(path)):
            return os.path.basename(path)
        path = os.path.dirname(path)
    return None


def _port_states(base: str) -> dict[str, str]:
    """An HCA's ports and their states ("4: ACTIVE" -> "ACTIVE")."""
    ports = {}
    for port in _listdir(os.path.join(base, "ports")):
        state = _read(os.path.join(base, "ports", port, "state")) or ""
        ports[port] = state.partition(":")[2].strip() or state or "?"
    return ports


def nics(sysfs: str) -> list[dict[str, Any]]:
    """The host's network devices: HCAs, Cassini NICs and interfaces, each with where it sits."""
    found: list[dict[str, Any]] = []
    for kind, klass in (("ib", "infiniband"), ("cxi", "cxi"), ("net", "net")):
        base = os.path.join(sysfs, "class", klass)
        for name in _listdir(base):
            address = _device_address(os.path.join(base, name, "device"))
            device: dict[str, Any] = {"name": name, "kind": kind}
            device.update(pci_device(sysfs, address) if address else {"pci": None, "numa": None})
            if kind == "ib":
                device["ports"] = _port_states(os.path.join(base, name))
                device["link_layer"] = _read(os.path.join(base, name, "ports", "1", "link_layer"))
            if kind == "net":
                device["operstate"] = _read(os.path.join(base, name, "operstate"))
            found.append(device)
    return found


def gpus(sysfs: str) -> list[dict[str, Any]]:
    """The host's NVIDIA GPUs in PCI order (CUDA's order with CUDA_DEVICE_ORDER=PCI_BUS_ID, and in practice for
    GPUs of one model) with their NUMA nodes."""
    base = os.path.join(sysfs, "bus", "pci", "devices")
    found = []
    for address in _listdir(base):
        klass = _read(os.path.join(base, address, "class")) or ""
        if _read(os.path.join(base, address, "vendor")) == _NVIDIA and klass.startswith(_GPU_CLASSES):
            found.append({"bus_id": address, "numa": pci_device(sysfs, address)["numa"]})
    return found


def visible_gpu(sysfs: str, visible: Optional[str], index: int) -> Optional[str]:
    """The PCI address of device ``index`` under CUDA_VISIBLE_DEVICES ``visible`` (numbers in PCI order; None
    where it names GPUs by UUID or the host's GPUs are unknown), for a rank whose torch cannot say."""
    host = [gpu["bus_id"] for gpu in gpus(sysfs)]
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if not host or not entries or not all(e.isdigit() for e in entries):
        return None
    chosen = int(entries[index % len(entries)])
    return pci_address(host[chosen]) if chosen < len(host) else None


def network(sysfs: str, environ: Any) -> dict[str, Any]:
    """What the rank records of the network: the devices, the host's GPUs and the NCCL variables it was given."""
    return {
        "devices": nics(sysfs),
        "gpus": gpus(sysfs),
        "env": {k: environ[k] for k in NCCL_VARIABLES if k in environ},
    }
