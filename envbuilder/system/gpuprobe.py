"""AMD and Intel GPUs of the running host (issue 41), beside host.py's NVIDIA probe.

AMD: ``amd-smi static --asic --driver`` (its text form: the JSON form changed shape between ROCm releases, a list in
some and an object with ``gpu_data`` in others, per ROCm/rocprofiler-compute PR #836), else the KFD topology in
sysfs (``/sys/class/kfd/kfd/topology/nodes/*/properties``: ``gfx_target_version`` is the gfx target packed as
major*10000 + minor*100 + stepping, minor and stepping printed in hex: 90010 -> gfx90a, 90402 -> gfx942) with the
driver's version from ``/sys/module/amdgpu/version`` (present for AMD's DKMS driver only). Intel: display-class
PCI devices of vendor 0x8086 in sysfs (named by their PCI device id, which the resolver's table maps to a family),
and whether the Level Zero loader is installed. ``xpu-smi`` and ``sycl-ls`` are not read yet: no captured output of
either was at hand to test against.

Never fails because a tool or a file is missing; every fact may stay unknown. ``root`` points the sysfs reads at a
test tree, as host.probe does for /proc."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from envbuilder.core.errors import CommandFailed
from envbuilder.core.facts import Gpu
from envbuilder.system import proc

_AMD_VENDOR_ID = 4098  # 0x1002, as KFD's properties print it (decimal)
#: Where distributions put the Level Zero loader.
_LIB_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib", "opt/intel/oneapi/redist/lib")


def probe_amd(env: Mapping[str, str], root: Path) -> tuple[Optional[tuple[Gpu, ...]], Optional[str]]:
    """AMD GPUs and the amdgpu driver's version: amd-smi first, then sysfs; (None, None) when neither says."""
    gpus: Optional[tuple[Gpu, ...]] = None
    driver: Optional[str] = None
    smi = shutil.which("amd-smi", path=env.get("PATH"))
    if smi:
        gpus, driver = _amd_smi(smi, env)
    if not gpus:
        gpus = _kfd_gpus(root) or gpus
    if driver is None:
        try:
            driver = (root / "sys" / "module" / "amdgpu" / "version").read_text(
                encoding="utf-8"
            ).strip() or None
        except OSError:
            driver = None
    return (gpus or None), (driver if gpus else None)


def _amd_smi(smi: str, env: Mapping[str, str]) -> tuple[Optional[tuple[Gpu, ...]], Optional[str]]:
    try:
        res = proc.run([smi, "static", "--asic", "--driver"], env=env, timeout=30, check=True)
    except (CommandFailed, OSError):
        return None, None
    return parse_amd_smi_static(res.stdout)


def parse_amd_smi_static(text: str) -> tuple[Optional[tuple[Gpu, ...]], Optional[str]]:
    """GPUs (market name, gfx target) and the driver version from ``amd-smi static``'s text output."""
    gpus: list[Gpu] = []
    driver: Optional[str] = None
    name: Optional[str] = None
    gfx: Optional[str] = None
    section = ""

    def flush() -> None:
        if name or gfx:
            gpus.append(Gpu(name or f"AMD GPU {gfx}", vendor="amd", arch=gfx))

    for line in text.splitlines():
        if re.match(r"^GPU:\s*\d+", line):
            flush()
            name, gfx, section = None, None, ""
            continue
        found = re.match(r"^\s+([A-Z_]+):\s*(.*?)\s*$", line)
        if not found:
            continue
        key, value = found.groups()
        if not value:
            section = key
        elif key == "MARKET_NAME":
            name = value
        elif key == "TARGET_GRAPHICS_VERSION" and re.fullmatch(r"gfx[0-9a-f]+", value):
            gfx = value
        elif section == "DRIVER" and key == "VERSION" and value != "N/A":
            driver = value
    flush()
    return (tuple(gpus) or None), driver


def _kfd_gpus(root: Path) -> Optional[tuple[Gpu, ...]]:
    nodes = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    if not nodes.is_dir():
        return None
    gpus = []
    for node in sorted(nodes.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        try:
            props = dict(
                line.split(None, 1)
                for line in (node / "properties").read_text(encoding="utf-8").splitlines()
                if " " in line
            )
        except (OSError, ValueError):
            continue
        gfx = gfx_from_target_version(props.get("gfx_target_version", "0"))
        if gfx and props.get("vendor_id", str(_AMD_VENDOR_ID)).strip() == str(_AMD_VENDOR_ID):
            gpus.append(Gpu(f"AMD GPU {gfx}", vendor="amd", arch=gfx))
    return tuple(gpus) or None


def gfx_from_target_version(text: str) -> Optional[str]:
    """KFD's packed gfx target (90010) as its name (gfx90a); None for a CPU node (0) or nonsense."""
    value = text.strip()
    if not value.isdigit() or int(value) == 0 or int(value) >= 1000000:
        return None
    number = int(value)
    major, minor, step = number // 10000, (number // 100) % 100, number % 100
    if minor > 15 or step > 15:
        return None
    return f"gfx{major}{minor:x}{step:x}"


def probe_intel(root: Path) -> tuple[Optional[tuple[Gpu, ...]], Optional[str]]:
    """Intel GPUs (display-class PCI devices of vendor 0x8086) and the Level Zero loader's version ("" when an
    Intel GPU is there and no loader is installed); (None, None) without an Intel GPU or a readable sysfs."""
    devices = root / "sys" / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return None, None
    gpus = []
    for dev in sorted(devices.iterdir()):
        vendor, device, klass = (_read(dev / f) for f in ("vendor", "device", "class"))
        # 0x03xxxx: display controllers (0x0380 "display controller" is what Max/Flex report; 0x0300 VGA for Arc).
        if vendor == "0x8086" and klass.startswith("0x03") and device:
            gpus.append(Gpu(f"Intel GPU {device}", vendor="intel"))
    if not gpus:
        return None, None
    return tuple(gpus), _level_zero(root)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip().lower()
    except OSError:
        return ""


def _level_zero(root: Path) -> str:
    """The Level Zero loader's version from its library file name (libze_loader.so.1.17.6 -> 1.17.6); "" when
    no loader is in the usual library directories."""
    found = ""
    for lib in _LIB_DIRS:
        for path in sorted((root / lib).glob("libze_loader.so*")):
            version = path.name.partition(".so")[2].lstrip(".")
            if len(version) > len(found) or not found:
                found = version or "present"
    return found
