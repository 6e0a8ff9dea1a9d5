"""Pure helpers of the validation payload, and the readers of /proc and the file system it needs.

No torch here: the unit tests import this module directly.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
from typing import Any, Optional

#: Libraries whose provenance matters: the CUDA stack a wheel bundles, and torch's OpenMP runtime.
TRACKED_LIBS = ("libcudart", "libcudnn", "libnccl", "libnvJitLink", "libcublas", "libgomp", "libc10")


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
