"""Pure helpers of the validation payload, and the readers of /proc, /sys, the file system and the tools
(nvidia-smi, horovodrun) it needs.

No torch here: the unit tests import this module directly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Optional

#: Libraries whose provenance matters: the CUDA stack a wheel bundles, and torch's OpenMP runtime.
TRACKED_LIBS = (
    "libcudart",
    "libcudnn",
    "libnccl",
    "libnvJitLink",
    "libcublas",
    "libgomp",
    "libc10",
    # ROCm builds: HIP runtime, RCCL, MIOpen and the HSA runtime, which the wheel carries in torch/lib.
    "libamdhip64",
    "librccl",
    "libMIOpen",
    "libhsa-runtime64",
    # XPU builds: the Level Zero loader (the node's) and the SYCL runtime (pip's intel-sycl-rt).
    "libze_loader",
    "libsycl",
)


def accelerator(cuda: Optional[str], hip: Optional[str], xpu: bool) -> str:
    """Which GPU stack a torch build drives, from ``torch.version.cuda``, ``torch.version.hip`` and whether
    ``torch.xpu`` is available: "cuda", "rocm" (torch.cuda's API over HIP), "xpu", or "" for CPU only."""
    if hip:
        return "rocm"
    if cuda:
        return "cuda"
    return "xpu" if xpu else ""


def dist_backend(kind: str) -> str:
    """The collective backend a build offers: NCCL (RCCL under the same name on ROCm), XCCL on XPU, else gloo."""
    return {"cuda": "nccl", "rocm": "nccl", "xpu": "xccl"}.get(kind, "gloo")


def device_code(kind: str, props: Any) -> Optional[str]:
    """What a build's code list is compared with, from torch's device properties: sm X.Y (CUDA), the gfx target
    (ROCm's ``gcnArchName``); None for XPU."""
    if kind == "rocm":
        return str(getattr(props, "gcnArchName", "")) or None
    if kind == "xpu":
        return None
    return f"{props.major}.{props.minor}"


def gfx_gaps(arch_list: list[str], devices: list[str]) -> list[str]:
    """The AMD GPUs' gfx targets (``gcnArchName``, "gfx90a:sramecc+:xnack-") a ROCm build has no code for."""
    built = {a.split(":")[0] for a in arch_list}
    return sorted({d.split(":")[0] for d in devices} - built)


def sm(arch: str) -> tuple[int, int]:
    digits = arch.split("_", 1)[1].rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def arch_gaps(arch_list: list[str], capabilities: list[tuple[int, int]]) -> list[str]:
    """The GPUs' sm_XY that the build cannot run: no SASS of the same major and a lower or equal minor, and no
    PTX at or below the capability (which the driver could JIT)."""
    built = [sm(a) for a in arch_list if a.startswith("sm_")]
    ptx = [sm(a) for a in arch_list if a.startswith("compute_")]
    missing = []
    for major, minor in capabilities:
        sass = any(b[0] == major and b[1] <= minor for b in built)
        jit = any(p <= (major, minor) for p in ptx)
        if not (sass or jit):
            missing.append(f"sm_{major}{minor}")
    return sorted(set(missing))


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """algbw and busbw in GB/s for an all_reduce (nccl-tests: busbw = algbw * 2(n-1)/n)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * (2 * (world - 1) / world)


def shadowed(loaded: dict[str, list[str]], wheel_copies: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Libraries loaded from outside the env although the env's wheels carry a copy (instead of it, or beside
    it: two copies in one process, where symbols bind to whichever came first)."""
    out = {}
    for stem, paths in loaded.items():
        copies = wheel_copies.get(stem, [])
        ours = {os.path.realpath(c) for c in copies}
        foreign = [p for p in paths if os.path.realpath(p) not in ours]
        if copies and foreign:
            out[stem] = {
                "loaded": foreign[0],
                "wheel": copies[0],
                "both": len(foreign) < len(paths),
            }
    return out


def expected_gpus(explicit: Optional[int]) -> tuple[Optional[int], str]:
    """How many GPUs this rank should see, and who promised it."""
    if explicit is not None:
        return explicit, "recipe"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd not in (None, "", "NoDevFiles"):
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"]), "CUDA_VISIBLE_DEVICES"
    slurm = os.environ.get("SLURM_GPUS_ON_NODE", "")
    if slurm.isdigit():
        return int(slurm), "SLURM_GPUS_ON_NODE"
    return None, "nothing"


def shared_gpus(mapping: list[dict[str, Any]]) -> list[str]:
    seen: dict[tuple[str, str], int] = {}
    shared = []
    for item in mapping:
        cvd = item.get("cuda_visible_devices") or ""
        key = (item["host"], f"{cvd}/{item['device']}")
        if key in seen:
            shared.append(f"ranks {seen[key]} and {item['rank']} on {item['host']}")
        seen[key] = item["rank"]
    return shared


def fs_roundtrip(root: str, rank: int) -> dict[str, Any]:
    # A directory per rank: a shared one raced (one rank's rmdir between another's mkdir and its isdir check made
    # makedirs(exist_ok=True) fail with "File exists").
    directory = os.path.join(root, f".envbuilder-fscheck-{socket.gethostname()}-{rank}-{os.getpid()}")
    path = os.path.join(directory, "probe")
    data = os.urandom(4 << 20)
    out: dict[str, Any] = {"dir": root}
    try:
        os.mkdir(directory, mode=0o700)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        out["write_mb_s"] = len(data) / (time.perf_counter() - t0) / 1e6
        with open(path, "rb") as fh:
            back = fh.read()
        if hashlib.sha256(back).digest() != hashlib.sha256(data).digest():
            out["error"] = "the file read back differs from what was written"
    except OSError as exc:
        out["error"] = f"{exc.strerror or exc} ({exc.filename or root})"
    finally:
        try:
            os.unlink(path)
            os.rmdir(directory)
        except OSError:
            pass  # the write never happened
    return out


def loaded_libraries() -> dict[str, list[str]]:
    """Every tracked library mapped into this process, each distinct file once."""
    found: dict[str, list[str]] = {}
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            for stem in TRACKED_LIBS:
                matches = name.startswith(stem + ".") or name.startswith(stem + "-")
                if matches and path not in found.setdefault(stem, []):
                    found[stem].append(path)
    return found


def wheel_copies(loaded: dict[str, list[str]]) -> dict[str, list[str]]:
    """Where the env's wheels keep each tracked library (torch/lib, nvidia/*/lib)."""
    import site

    roots = [p for p in {*site.getsitepackages(), site.getusersitepackages(), *sys.path} if os.path.isdir(p)]
    copies: dict[str, list[str]] = {}
    for root in roots:
        for sub in ("torch/lib", *(f"nvidia/{d}/lib" for d in _listdir(os.path.join(root, "nvidia")))):
            for name in _listdir(os.path.join(root, sub)):
                for stem in loaded:
                    if name.startswith(stem + ".") or name.startswith(stem + "-"):
                        copies.setdefault(stem, []).append(os.path.join(root, sub, name))
    return copies


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# --- where a rank runs (the affinity check) -------------------------------------------------------------------


def cpulist(text: str) -> list[int]:
    """The kernel's CPU list format ("0-7,32-39") as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def _read(path: str) -> Optional[str]:
    """A sysfs file's text; None where it is missing (containers often hide /sys/devices and /sys/bus)."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, ValueError):
        return None


def cpu_core(cpu: int, sysfs: str) -> Optional[str]:
    """The physical core of ``cpu`` as a key its SMT siblings share: the kernel's sibling list, else package and
    core id; None where /sys does not say."""
    topology = os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology")
    siblings = _read(os.path.join(topology, "thread_siblings_list"))
    if siblings:
        return siblings
    core = _read(os.path.join(topology, "core_id"))
    package = _read(os.path.join(topology, "physical_package_id"))
    return f"package {package} core {core}" if core and package else None


def numa_nodes(sysfs: str) -> dict[int, int]:
    """CPU -> its NUMA node; empty where /sys has no node directory."""
    base = os.path.join(sysfs, "devices", "system", "node")
    nodes: dict[int, int] = {}
    for name in _listdir(base):
        is_node = name.startswith("node") and name[4:].isdigit()
        text = _read(os.path.join(base, name, "cpulist")) if is_node else None
        for cpu in cpulist(text or ""):
            nodes[cpu] = int(name[4:])
    return nodes


def cpu_placement(sysfs: str) -> dict[str, Any]:
    """This process's allowed CPUs, the physical core of each, and the NUMA nodes they are on (None: unknown)."""
    cpus = sorted(os.sched_getaffinity(0))
    nodes = numa_nodes(sysfs)
    return {
        "cpus": cpus,
        "cores": [cpu_core(cpu, sysfs) for cpu in cpus],
        "numa": sorted({nodes[c] for c in cpus if c in nodes}) if nodes else None,
        "numa_nodes": len(set(nodes.values())) or None,
    }


def pci_address(bus_id: str) -> str:
    """sysfs's name of a PCI device from a driver's bus id: nvidia-smi's "00000000:17:00.0" -> "0000:17:00.0"."""
    parts = bus_id.strip().lower().split(":")
    domain = int(parts[0], 16) if len(parts) == 3 else 0
    return f"{domain:04x}:{parts[-2]}:{parts[-1]}"


def torch_bus_id(props: Any) -> Optional[str]:
    """The PCI bus id torch reports for a device (torch >= 2.6 has it); None where it does not."""
    bus = getattr(props, "pci_bus_id", None)
    if not isinstance(bus, int):
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


def smi_bus_id(uuid: str) -> Optional[str]:
    """The PCI bus id nvidia-smi reports for the GPU with ``uuid``; None where it cannot say."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    want = uuid.lower().replace("gpu-", "")
    for line in out.splitlines():
        gpu, _, bus = line.partition(",")
        if want and gpu.strip().lower().replace("gpu-", "") == want:
            return pci_address(bus)
    return None


def gpu_placement(bus_id: str, sysfs: str) -> dict[str, Any]:
    """A GPU's NUMA node and the CPUs nearest it, from its PCI device in /sys (None: unknown)."""
    device = os.path.join(sysfs, "bus", "pci", "devices", pci_address(bus_id))
    node = _read(os.path.join(device, "numa_node"))
    near = _read(os.path.join(device, "local_cpulist"))
    return {
        "bus_id": pci_address(bus_id),
        # -1: the firmware gave the device no node (a single-node host, or a VM)
        "numa": int(node) if node and node.lstrip("-").isdigit() and int(node) >= 0 else None,
        "cpus": cpulist(near) if near else None,
    }


def omp_threads(value: Optional[str]) -> Optional[int]:
    """The thread count OMP_NUM_THREADS asks for (the outer level of a nested list "8,4"); None when unset."""
    first = (value or "").split(",")[0].strip()
    return int(first) if first.isdigit() else None


# --- horovod --------------------------------------------------------------------------------------------------


def horovodrun(python: str) -> Optional[str]:
    """The env's horovodrun (beside its python), else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "horovodrun")
    return beside if os.access(beside, os.X_OK) else shutil.which("horovodrun")


def check_build(text: str) -> dict[str, dict[str, bool]]:
    """``horovodrun --check-build``'s report: section ("frameworks", "controllers", "tensor operations") ->
    name -> built. Horovod marks a built item "[X]" and a missing one "[ ]"."""
    sections: dict[str, dict[str, bool]] = {}
    current: Optional[dict[str, bool]] = None
    for line in text.splitlines():
        item = line.strip()
        if item.startswith("Available ") and item.endswith(":"):
            current = sections.setdefault(item[len("Available ") : -1].lower(), {})
        elif current is not None and item.startswith("[") and "]" in item:
            mark, _, name = item[1:].partition("]")
            current[name.strip()] = bool(mark.strip())
    return sections
