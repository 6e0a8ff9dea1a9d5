"""Host facts: what machine a plan targets. Probed from the running host, or replayed from a JSON file.

Every fact may be unknown (None). The probe never fails because a tool is missing, and never runs at import.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from envbuilder import proc, textfile
from envbuilder.errors import CommandFailed, HostProbeError, did_you_mean

FACTS_VERSION = 1

_ALLOCATION_VARS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_JOB_PARTITION",
    "SLURM_GPUS_ON_NODE",
    "SLURM_NTASKS",
    "PBS_JOBID",
    "PBS_NODEFILE",
    "PBS_QUEUE",
    "CUDA_VISIBLE_DEVICES",
)


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: Optional[str] = None
    memory_mib: Optional[int] = None


@dataclass(frozen=True)
class HostFacts:
    arch: Optional[str] = None
    glibc: Optional[str] = None
    python: Optional[str] = None
    driver_version: Optional[str] = None
    #: Highest CUDA version the driver supports ("CUDA Version" in nvidia-smi's header).
    max_cuda: Optional[str] = None
    #: None: unknown. Empty: known to have no NVIDIA GPU.
    gpus: Optional[tuple[Gpu, ...]] = None
    hostname: Optional[str] = None
    module_system: Optional[str] = None
    scheduler: Optional[str] = None
    allocation: Mapping[str, str] = field(default_factory=dict)
    filesystems: Mapping[str, str] = field(default_factory=dict)
    source: str = "probe"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = None if self.gpus is None else [asdict(g) for g in self.gpus]
        data["allocation"] = dict(self.allocation)
        data["filesystems"] = dict(self.filesystems)
        data["facts_version"] = FACTS_VERSION
        return data

    @property
    def python_minor(self) -> Optional[str]:
        if not self.python:
            return None
        parts = self.python.split(".")
        return ".".join(parts[:2]) if len(parts) >= 2 else None


# ---------------------------------------------------------------------------------------------------------------
# Reading facts from JSON (a --facts file, or a site's compute table)

_STR_KEYS = (
    "arch",
    "glibc",
    "python",
    "driver_version",
    "max_cuda",
    "hostname",
    "module_system",
    "scheduler",
)
_KNOWN_KEYS = (*_STR_KEYS, "gpus", "allocation", "filesystems", "source", "facts_version")
_GPU_KEYS = ("name", "compute_capability", "memory_mib")
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def facts_from_json(data: Any, source: str) -> HostFacts:
    """Build HostFacts from a decoded JSON object; missing keys are unknown, wrong ones are errors."""
    if not isinstance(data, dict):
        raise HostProbeError(f"{source}: expected a JSON object, found {type(data).__name__}")
    for key in data:
        if key not in _KNOWN_KEYS:
            raise HostProbeError(f"{source}: unknown key {key!r}", hint=did_you_mean(key, _KNOWN_KEYS))
    values: dict[str, Any] = {}
    for key in _STR_KEYS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise HostProbeError(f"{source}: {key}: expected a string, found {value!r}")
        values[key] = value
    if values["arch"]:
        values["arch"] = _ARCH_ALIASES.get(values["arch"], values["arch"])
    gpus = data.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list):
            raise HostProbeError(f"{source}: gpus: expected a list, found {gpus!r}")
        parsed = []
        for i, gpu in enumerate(gpus):
            if not isinstance(gpu, dict) or not isinstance(gpu.get("name"), str):
                raise HostProbeError(f"{source}: gpus[{i}]: expected an object with a string 'name'")
            for key in gpu:
                if key not in _GPU_KEYS:
                    raise HostProbeError(
                        f"{source}: gpus[{i}]: unknown key {key!r}", hint=did_you_mean(key, _GPU_KEYS)
                    )
            cc = gpu.get("compute_capability")
            if cc is not None and not (isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc)):
                raise HostProbeError(
                    f'{source}: gpus[{i}].compute_capability: expected a string like "9.0", found {cc!r}'
                )
            mem = gpu.get("memory_mib")
            if mem is not None and (not isinstance(mem, int) or isinstance(mem, bool) or mem < 0):
                raise HostProbeError(f"{source}: gpus[{i}].memory_mib: expected an integer, found {mem!r}")
            parsed.append(Gpu(gpu["name"], cc, mem))
        values["gpus"] = tuple(parsed)
    for key in ("allocation", "filesystems"):
        table = data.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise HostProbeError(f"{source}: {key}: expected an object of strings")
        values[key] = dict(table)
    return HostFacts(source=source, **values)


#: A facts file is a few hundred bytes; anything near this is not one.
MAX_FACTS_BYTES = 1024 * 1024
_ENVELOPE_KEYS = ("envbuilder_result_version", "command", "status", "data", "errors")


def load_facts_file(path: str) -> HostFacts:
    """Facts from a file: what ``envbuilder probe --json`` prints (the envelope), its ``data``, or a facts object
    written by hand. Only a regular UTF-8 file is read, and only up to MAX_FACTS_BYTES."""
    try:
        text = textfile.read_text(Path(path), MAX_FACTS_BYTES, "facts file")
    except textfile.UnreadableFile as exc:
        raise HostProbeError(f"facts file {path}: {exc.reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostProbeError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise HostProbeError(f"{path}: not valid JSON: nested too deeply") from None
    return facts_from_json(unwrap_envelope(data, path), path)


def unwrap_envelope(data: Any, source: str) -> Any:
    """The facts inside a ``probe --json`` envelope; anything that is not an envelope as it is."""
    if not isinstance(data, dict) or "envbuilder_result_version" not in data:
        return data
    version = data.get("envbuilder_result_version")
    command = data.get("command")
    if version != 1 or isinstance(version, bool):
        raise HostProbeError(
            f"{source}: envbuilder_result_version {version!r}: this envbuilder reads version 1",
            hint="save the facts with this envbuilder's `envbuilder probe --json`",
        )
    unknown = [k for k in data if k not in _ENVELOPE_KEYS]
    if unknown:
        raise HostProbeError(
            f"{source}: unknown key {unknown[0]!r} in a result envelope",
            hint=did_you_mean(unknown[0], _ENVELOPE_KEYS),
        )
    if command != "probe":
        raise HostProbeError(
            f"{source}: this is the output of `envbuilder {command} --json`, not of `envbuilder probe --json`",
            hint="save a node's facts with `envbuilder probe --json > node.json` on that node",
        )
    if data.get("status") != "ok" or not isinstance(data.get("data"), dict):
        raise HostProbeError(f"{source}: the probe it holds did not succeed (status {data.get('status')!r})")
    return data["data"]


# ---------------------------------------------------------------------------------------------------------------
# Probing this machine


def probe(env: Optional[Mapping[str, str]] = None, root: str = "/") -> HostFacts:
    """Probe the running host. ``root`` lets tests point /proc reads at a fake tree; ``env`` at a fake PATH."""
    env = dict(os.environ if env is None else env)
    gpus, driver, max_cuda = _probe_nvidia(env, Path(root))
    return HostFacts(
        arch=_ARCH_ALIASES.get(platform.machine(), platform.machine()) or None,
        glibc=_glibc_version(),
        python=platform.python_version(),
        driver_version=driver,
        max_cuda=max_cuda,
        gpus=gpus,
        hostname=socket.gethostname() or None,
        module_system=_module_system(env),
        scheduler=_scheduler(env),
        allocation={k: env[k] for k in _ALLOCATION_VARS if k in env},
        filesystems={k: env[k] for k in ("HOME", "WORK", "SCRATCH") if env.get(k)},
        source="probe",
    )


def _glibc_version() -> Optional[str]:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        text = None
    if text and text.startswith("glibc "):
        return text.split()[1]
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


def _module_system(env: Mapping[str, str]) -> Optional[str]:
    if env.get("LMOD_CMD") or env.get("LMOD_VERSION"):
        return "lmod"
    if env.get("MODULESHOME") or shutil.which("modulecmd", path=env.get("PATH")):
        return "environment-modules"
    return None


def _scheduler(env: Mapping[str, str]) -> Optional[str]:
    if "SLURM_JOB_ID" in env:
        return "slurm"
    if "PBS_JOBID" in env:
        return "pbs"
    for tool, name in (("sbatch", "slurm"), ("qsub", "pbs")):
        if shutil.which(tool, path=env.get("PATH")):
            return name
    return None


_DRIVER_RE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)")
_CUDA_HEADER_RE = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


def _probe_nvidia(
    env: Mapping[str, str], root: Path
) -> tuple[Optional[tuple[Gpu, ...]], Optional[str], Optional[str]]:
    """GPUs, driver version and max CUDA: nvidia-smi first, then /proc/driver/nvidia."""
    gpus: Optional[tuple[Gpu, ...]] = None
    driver: Optional[str] = None
    max_cuda: Optional[str] = None
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi:
        gpus, driver = _smi_query(smi, env)
        max_cuda = _smi_cuda_version(smi, env)
    proc_dir = root / "proc" / "driver" / "nvidia"
    if driver is None:
        try:
            match = _DRIVER_RE.search((proc_dir / "version").read_text(encoding="utf-8", errors="replace"))
            driver = match.group(1) if match else None
        except OSError:
            pass
    if gpus is None:
        gpus = _proc_gpus(proc_dir)
    if gpus is None and driver is None and not smi and not (root / "proc" / "driver").is_dir():
        return None, None, None  # nothing to say: unknown, not "no GPU"
    if gpus is None and driver is None:
        gpus = ()  # /proc is readable and has no NVIDIA driver: this host has no NVIDIA GPU
    return gpus, driver, max_cuda


def _smi_query(smi: str, env: Mapping[str, str]) -> tuple[Optional[tuple[Gpu, ...]], Optional[str]]:
    fields = "name,compute_cap,driver_version,memory.total"
    try:
        res = proc.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], env=env, timeout=20, check=True
        )
    except (CommandFailed, OSError):
        # Old drivers lack compute_cap; retry without it rather than losing the GPU list.
        try:
            res = proc.run(
                [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
                env=env,
                timeout=20,
                check=True,
            )
        except (CommandFailed, OSError):
            return None, None
        fields = "name,driver_version,memory.total"
    names = fields.split(",")
    gpus = []
    driver = None
    for line in res.stdout.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(names):
            continue
        row = dict(zip(names, cols))
        driver = row.get("driver_version") or driver
        mem = row.get("memory.total", "")
        cc = row.get("compute_cap")
        gpus.append(
            Gpu(
                name=row["name"],
                compute_capability=cc if cc and re.fullmatch(r"\d+\.\d+", cc) else None,
                memory_mib=int(mem) if mem.isdigit() else None,
            )
        )
    return tuple(gpus), driver


def _smi_cuda_version(smi: str, env: Mapping[str, str]) -> Optional[str]:
    try:
        res = proc.run([smi], env=env, timeout=20, check=True)
    except (CommandFailed, OSError):
        return None
    match = _CUDA_HEADER_RE.search(res.stdout)
    return match.group(1) if match else None


def _proc_gpus(proc_dir: Path) -> Optional[tuple[Gpu, ...]]:
    gpus_dir = proc_dir / "gpus"
    if not gpus_dir.is_dir():
        return None
    gpus = []
    for info in sorted(gpus_dir.glob("*/information")):
        try:
            text = info.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = re.search(r"^Model:\s*(.+)$", text, re.MULTILINE)
        if match:
            gpus.append(Gpu(name=match.group(1).strip()))
    return tuple(gpus)
