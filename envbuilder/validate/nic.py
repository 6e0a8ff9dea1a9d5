"""Pure: which network device NCCL would use for each rank, and whether it sits far from the rank's GPU.

Each rank records the host's network devices as /sys describes them (PCI path, NUMA node), the host's GPUs, its
own GPU and the NCCL variables it was given (``envbuilder_nics.network`` in the payload). This is an
approximation of NCCL's topology search, not NCCL itself: NCCL weighs the PCI paths and the links' bandwidths of
the whole node; here the transport is the first that has devices (InfiniBand/RoCE HCAs with an active port, unless
NCCL_IB_DISABLE=1 or NCCL_NET=Socket; then Slingshot's Cassini NICs through the OFI plugin; then sockets), the
devices are those NCCL_IB_HCA / NCCL_SOCKET_IFNAME leave (their own syntax: a list of prefixes, ``^`` excludes,
``=`` matches names exactly, ``:port`` picks an HCA's port), and the device is the nearest to the GPU by the
path types ``nvidia-smi topo -m`` prints: PIX (one bridge between them), PXB (several), PHB (through the root
complex), NODE (one NUMA node, several root complexes), SYS (across NUMA nodes). Among equally near devices NCCL
spreads a node's GPUs; the first is named, the others as ties.

A rank whose device sits on another NUMA node than its GPU is warned of where something can be done about it: an
NCCL variable leaves out a device on the GPU's node, or the host has a GPU near a device that none of its ranks
uses. Where the node has no device near the GPU (Polaris: two NICs for four GPUs), the detail says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from envbuilder.core.structs import dataclass

Record = Mapping[str, Any]

#: The path types nearest first, as nvidia-smi topo -m and NCCL's topology name them; "?" where /sys says nothing.
PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS", "?")
#: What NCCL's socket transport leaves out when NCCL_SOCKET_IFNAME is unset (ncclFindInterfaces: ib* interfaces
#: first, then any but these).
DEFAULT_SOCKET_IFNAME = "^docker,lo"


@dataclass(frozen=True)
class Selector:
    """A parsed NCCL_IB_HCA or NCCL_SOCKET_IFNAME: (name, port or None) items, matched as prefixes unless
    ``exact``, kept unless ``exclude``."""

    items: tuple[tuple[str, Optional[int]], ...]
    exclude: bool = False
    exact: bool = False

    def keeps(self, name: str, port: Optional[int] = None) -> bool:
        hit = any(
            (name == item if self.exact else name.startswith(item)) and (want is None or port in (None, want))
            for item, want in self.items
        )
        return hit != self.exclude


def parse_selector(text: str, ports: bool = True) -> Selector:
    """NCCL's device list syntax: ``mlx5_0:1,mlx5_1`` (prefixes, an HCA's port after ``:``), ``^`` before the
    list excludes, ``=`` (after any ``^``) matches whole names. ``ports=False`` for interface names."""
    rest = text.strip()
    exclude = rest.startswith("^")
    rest = rest[1:] if exclude else rest
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    items: list[tuple[str, Optional[int]]] = []
    for part in (p.strip() for p in rest.split(",")):
        if not part:
            continue
        name, colon, port = part.partition(":")
        items.append((name, int(port) if ports and colon and port.isdigit() else None))
    return Selector(tuple(items), exclude, exact)


@dataclass(frozen=True)
class Pick:
    transport: str  # ib | ofi | socket
    #: The device, its NUMA node and its path type to the rank's GPU; None where no device is left.
    device: Optional[Mapping[str, Any]]
    path: str
    ties: tuple[str, ...]
    #: Devices of the transport an NCCL variable leaves out: name -> the variable.
    left_out: Mapping[str, str]
    #: The NUMA nodes of the devices NCCL may use, and of all the transport's devices (before the NCCL variables).
    nodes: frozenset[int] = frozenset()
    all_nodes: frozenset[int] = frozenset()

    def to_json(self) -> dict[str, Any]:
        device = self.device or {}
        return {
            "transport": self.transport,
            "name": device.get("name"),
            "pci": device.get("pci"),
            "numa": device.get("numa"),
            "path": self.path,
            "ties": list(self.ties),
            "left_out": dict(self.left_out),
        }


def path_type(gpu: Record, device: Record) -> str:
    """The PCI path type between a GPU and a device, from their /sys paths, else their NUMA nodes."""
    a, b = gpu.get("path"), device.get("path")
    if a and b and a[0] == b[0]:
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if common == 1:
            return "PHB"
        # Below one root port: one bridge apart where both hang off the same one, else a switch's bridges.
        return "PIX" if a[:-1] == b[:-1] else "PXB"
    if gpu.get("numa") is None or device.get("numa") is None:
        return "?"
    return "NODE" if gpu["numa"] == device["numa"] else "SYS"


def _active(device: Record) -> list[Optional[int]]:
    """An HCA's active ports (NCCL uses no other); [None] where the record has no port states."""
    ports = device.get("ports")
    if not ports:
        return [None]
    return [int(p) for p, state in sorted(ports.items()) if state == "ACTIVE" and p.isdigit()]


def _transport(devices: Sequence[Record], env: Mapping[str, str]) -> tuple[str, list[Record]]:
    """The transport NCCL would take and its devices before the NCCL variables' filters."""
    net = env.get("NCCL_NET", "").lower()
    hcas = [d for d in devices if d.get("kind") == "ib" and _active(d)]
    if hcas and env.get("NCCL_IB_DISABLE", "0") != "1" and net in ("", "ib"):
        return "ib", hcas
    cxi = [d for d in devices if d.get("kind") == "cxi"]
    if cxi and net not in ("ib", "socket"):
        return "ofi", cxi
    return "socket", [d for d in devices if d.get("kind") == "net" and d.get("operstate") != "down"]


def _filter(
    transport: str, devices: Sequence[Record], env: Mapping[str, str]
) -> tuple[list[Record], dict[str, str]]:
    """The devices the NCCL variables leave, and those they leave out (name -> the variable)."""
    if transport == "ofi":
        return list(devices), {}
    if transport == "ib":
        if "NCCL_IB_HCA" not in env:
            return list(devices), {}
        var, sel = "NCCL_IB_HCA", parse_selector(env["NCCL_IB_HCA"])
        kept = [d for d in devices if any(sel.keeps(d["name"], p) for p in _active(d))]
    else:
        var = "NCCL_SOCKET_IFNAME"
        sel = parse_selector(env.get(var, DEFAULT_SOCKET_IFNAME), ports=False)
        kept = [d for d in devices if sel.keeps(d["name"])]
        if var not in env:
            ib = [d for d in kept if d["name"].startswith("ib")]
            return ib or kept, {}
    # A virtual interface (lo) left out is no loss: only devices on the PCI bus are named.
    return kept, {d["name"]: var for d in devices if d not in kept and d.get("pci")}


def pick(rec: Record) -> Optional[Pick]:
    """The device NCCL would most likely use for this rank; None where the rank recorded no network device."""
    network = rec.get("network") or {}
    if not network.get("devices"):
        return None
    # An empty variable is an unset one; NCCL reads an NCCL_SOCKET_IFNAME of one character as unset too.
    env = {k: v for k, v in (network.get("env") or {}).items() if v.strip()}
    if len(env.get("NCCL_SOCKET_IFNAME", "")) == 1:
        del env["NCCL_SOCKET_IFNAME"]
    transport, devices = _transport(network["devices"], env)
    kept, left_out = _filter(transport, devices, env)
    gpu = rec.get("gpu") or {}
    if not kept:
        return Pick(transport, None, "?", (), left_out)
    ranked = sorted(kept, key=lambda d: (PATHS.index(path_type(gpu, d)), d["name"]))
    best = path_type(gpu, ranked[0])
    ties = tuple(d["name"] for d in ranked[1:] if path_type(gpu, d) == best)
    return Pick(transport, ranked[0], best, ties, left_out, _nodes(kept), _nodes(devices))


def _nodes(devices: Sequence[Record]) -> frozenset[int]:
    return frozenset(d["numa"] for d in devices if d.get("numa") is not None)


def far(rank: int, rec: Record, chosen: Pick, used: set[str]) -> Optional[tuple[str, str]]:
    """The warning and hint for a rank whose device is on another NUMA node than its GPU, where the NCCL
    variables or the rank's GPU could be changed for a nearer one; None otherwise."""
    gpu = rec.get("gpu") or {}
    device = chosen.device or {}
    if gpu.get("numa") is None or device.get("numa") is None or gpu["numa"] == device["numa"]:
        return None
    text = (
        f"rank {rank}: GPU {gpu.get('bus_id')} on NUMA {gpu['numa']}, "
        f"its NIC {device['name']} on NUMA {device['numa']}"
    )
    network = rec.get("network") or {}
    near_out = [
        d["name"]
        for d in network.get("devices") or []
        if d["name"] in chosen.left_out and d.get("numa") == gpu["numa"]
    ]
    if near_out:
        var = chosen.left_out[near_out[0]]
        value = (network.get("env") or {}).get(var, "")
        widened = _widened(var, value, near_out[0])
        hint = (
            f"set {var} so that it keeps {near_out[0]} ({var}={widened}), or unset it"
            if widened
            else f"unset {var}"
        )
        return (
            f"{text} ({var}={value} leaves out {', '.join(near_out)} on NUMA {gpu['numa']})",
            f"{hint}: NCCL then picks the NIC nearest each GPU",
        )
    free = [
        g["bus_id"]
        for g in network.get("gpus") or []
        if g.get("numa") in chosen.nodes and g["bus_id"] not in used
    ]
    if free:
        return (
            f"{text}; GPU(s) {', '.join(free)} share a NUMA node with a NIC and no rank on this host uses them",
            "bind ranks to the GPUs nearest the NICs (CUDA_VISIBLE_DEVICES, or the launcher's GPU map) and each "
            "rank's CPUs to its GPU's NUMA node",
        )
    return None


def _widened(var: str, value: str, name: str) -> Optional[str]:
    """The variable's value that also keeps ``name``: the name added to a list of names, or taken out of an
    exclusion; None where the exclusion names nothing else."""
    if not value.startswith("^"):
        return f"{value},{name}"
    sel = parse_selector(value, ports=var == "NCCL_IB_HCA")
    kept = [item for item, _ in sel.items if not (name == item if sel.exact else name.startswith(item))]
    prefix = "^=" if sel.exact else "^"
    return f"{prefix}{','.join(kept)}" if kept else None


def detail(rec: Record, chosen: Pick) -> str:
    """The rank's device in the affinity detail: "nic cxi0 numa 0 (PHB)"."""
    if chosen.device is None:
        return f", no {chosen.transport} NIC"
    numa = chosen.device.get("numa")
    text = f", nic {chosen.device['name']} numa {'?' if numa is None else numa} ({chosen.path})"
    gpu = rec.get("gpu") or {}
    if gpu.get("numa") is not None and numa is not None and gpu["numa"] not in chosen.all_nodes:
        text += f" [no NIC on NUMA {gpu['numa']}]"
    return text
